// The Store contract (store_contract.cpp) over every ddp store, plus what is
// particular to HashStore, PrefixStore and the Store base.

#include <ddp/comm/error.h>
#include <ddp/store/file_store.h>
#include <ddp/store/hash_store.h>
#include <ddp/store/prefix_store.h>
#include <ddp/store/tcp_store.h>

#include "store/store_contract.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using store_contract::since;

// Long enough never to fire in a passing test, short enough that a broken
// one fails rather than hangs.
constexpr milliseconds kTimeout{10000};

std::string unique_path(const std::string& tag) {
  static std::atomic<int> counter{0};
  return ::testing::TempDir() + "ddp_store_test_" + tag + "_" + std::to_string(::getpid()) +
      "_" + std::to_string(counter++);
}

// Removes its file when the last store using it is gone.
struct TempFile {
  explicit TempFile(std::string p) : path(std::move(p)) {}
  ~TempFile() {
    ::unlink(path.c_str());
  }
  std::string path;
};

using store_contract::StoreContractTest;
using store_contract::StoreHandle;
using store_contract::StoreKind;

std::shared_ptr<TCPStore> tcp_server() {
  return std::make_shared<TCPStore>(
      "127.0.0.1", TCPStoreOptions().port(0).is_server(true).timeout(kTimeout));
}

std::shared_ptr<TCPStore> tcp_client(const TCPStore& server) {
  return std::make_shared<TCPStore>(
      "127.0.0.1", TCPStoreOptions().port(server.port()).timeout(kTimeout));
}

std::vector<StoreKind> store_kinds() {
  return {
      {"HashStore", [] { return StoreHandle{nullptr, std::make_shared<HashStore>(kTimeout)}; }},
      {"FileStore",
       [] {
         auto file = std::make_shared<TempFile>(unique_path("contract"));
         return StoreHandle{file, std::make_shared<FileStore>(file->path, kTimeout)};
       }},
      {"TCPStoreServerSide", [] { return StoreHandle{nullptr, tcp_server()}; }},
      {"TCPStoreClient",
       [] {
         auto server = tcp_server();
         return StoreHandle{server, tcp_client(*server)};
       }},
      {"PrefixStoreOverTCPStore",
       [] {
         auto server = tcp_server();
         return StoreHandle{server, std::make_shared<PrefixStore>("group0", tcp_client(*server))};
       }},
      {"PrefixStoreOverHashStore",
       [] {
         return StoreHandle{
             nullptr, std::make_shared<PrefixStore>("g", std::make_shared<HashStore>(kTimeout))};
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreContractTest, ::testing::ValuesIn(store_kinds()),
                         store_contract::kind_name);

// ---- Store base ----------------------------------------------------------------

TEST(StoreTest, TimeoutMustBePositive) {
  try {
    HashStore store(milliseconds(0));
    FAIL() << "a zero timeout was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("(got 0 ms)"), std::string::npos) << e.what();
  }
  HashStore store(milliseconds(100));
  EXPECT_THROW(store.set_timeout(milliseconds(-5)), c10::Error);
  EXPECT_EQ(store.timeout(), milliseconds(100));
}

TEST(StoreTest, AddReportsOverflow) {
  HashStore store;
  store.set("big", std::to_string(INT64_MAX));
  EXPECT_THROW(store.add("big", 1), c10::Error);
  EXPECT_EQ(store.add("big", -1), INT64_MAX - 1);
}

TEST(StoreTest, AddRejectsTextAroundTheNumber) {
  HashStore store;
  store.set("padded", std::string(" 12"));
  EXPECT_THROW(store.add("padded", 1), c10::Error);
  store.set("suffix", std::string("12x"));
  EXPECT_THROW(store.add("suffix", 1), c10::Error);
}

// ---- PrefixStore ---------------------------------------------------------------

TEST(PrefixStoreTest, KeysLiveUnderThePrefixInTheBase) {
  auto base = std::make_shared<HashStore>(kTimeout);
  PrefixStore store("job", base);
  EXPECT_EQ(store.prefix(), "job");
  store.set("k", std::string("v"));
  EXPECT_TRUE(base->check({"job/k"}));
  EXPECT_FALSE(base->check({"k"}));
  EXPECT_EQ(base->get_string("job/k"), "v");
  base->set("job/from_base", std::string("b"));
  EXPECT_EQ(store.get_string("from_base"), "b");
}

TEST(PrefixStoreTest, TwoPrefixesDoNotMeet) {
  auto base = std::make_shared<HashStore>(kTimeout);
  PrefixStore a("a", base);
  PrefixStore b("b", base);
  a.set("k", std::string("from a"));
  b.set("k", std::string("from b"));
  EXPECT_EQ(a.add("n", 1), 1);
  EXPECT_EQ(b.add("n", 10), 10);
  EXPECT_EQ(a.get_string("k"), "from a");
  EXPECT_EQ(b.get_string("k"), "from b");
  EXPECT_TRUE(a.delete_key("k"));
  EXPECT_TRUE(b.check({"k"}));
}

TEST(PrefixStoreTest, HonoursItsOwnTimeout) {
  auto base = std::make_shared<HashStore>(kTimeout);
  PrefixStore store("p", base);
  EXPECT_EQ(store.timeout(), kTimeout);
  store.set_timeout(milliseconds(150));
  const auto start = Clock::now();
  try {
    store.get("missing");
    FAIL() << "get did not time out";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("p/missing"), std::string::npos) << e.what();
  }
  EXPECT_LT(since(start).count(), 3000);
}

TEST(PrefixStoreTest, NullBaseIsMisuse) {
  EXPECT_THROW(PrefixStore("p", nullptr), c10::Error);
}

} // namespace
} // namespace ddp
