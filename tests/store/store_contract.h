#pragma once

// The Store contract (tests/store/store_contract.cpp), one suite of
// value-parameterised tests that every store runs: store_test instantiates
// it over HashStore, FileStore, TCPStore (its server's side and a client)
// and PrefixStore; torch_tcp_store_test over TorchTCPStore against each of
// PyTorch's servers. A binary that links store_contract.cpp instantiates
// StoreContractTest with its own StoreKinds.

#include <ddp/store/store.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp::store_contract {

// What the store tests share.
inline std::chrono::milliseconds since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
}
inline std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A store under test, and what must outlive it (a server, a file).
struct StoreHandle {
  std::shared_ptr<void> keep_alive;
  std::shared_ptr<Store> store;
  // Where it could not be made, why (the test then fails saying so).
  std::string unavailable;
  // What its errors name besides what every store's must: its own name and
  // operation, its server's address.
  std::vector<std::string> wait_timeout_names;
  std::vector<std::string> get_timeout_names;
  std::vector<std::string> add_error_names;
};

struct StoreKind {
  std::string name; // the test's name suffix: letters, digits, '_'
  std::function<StoreHandle()> make;
};

class StoreContractTest : public ::testing::TestWithParam<StoreKind> {
 protected:
  void SetUp() override;
  void TearDown() override;

  StoreHandle handle_;
  std::shared_ptr<Store> store_;
};

// For INSTANTIATE_TEST_SUITE_P's last argument: the kind's name.
std::string kind_name(const ::testing::TestParamInfo<StoreKind>& info);

} // namespace ddp::store_contract
