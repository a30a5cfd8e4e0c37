#pragma once

// What the checkpoint unit tests share: a temporary directory, whole-file
// reads and writes, and the check that a call throws c10::Error with a
// message holding a given text.

#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include <c10/util/Exception.h>

namespace ddp_test::checkpoint {

// A fresh directory under /tmp, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/ddp-checkpoint-test.XXXXXX";
    const char* made = ::mkdtemp(name);
    if (made == nullptr) {
      throw std::runtime_error("mkdtemp failed");
    }
    path_ = made;
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The message of the c10::Error that `body` throws ("" when none).
template <typename Body>
std::string error_of(Body body) {
  try {
    body();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return std::string("(not a c10::Error) ") + e.what();
  }
  return "";
}

} // namespace ddp_test::checkpoint

// Expects `body` to throw c10::Error with `substring` in its message.
#define EXPECT_ERROR(body, substring)                                          \
  do {                                                                         \
    const std::string message = ::ddp_test::checkpoint::error_of([&] { body; }); \
    EXPECT_NE(message.find(substring), std::string::npos)                      \
        << "expected an error with '" << (substring) << "', got: " << message; \
  } while (false)
