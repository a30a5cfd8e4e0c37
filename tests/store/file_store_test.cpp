// What is particular to the FileStore: several processes on one file, the
// log surviving its writers, torn records, files that are not stores.
//
// The multi-process tests fork: the children touch no torch state, only the
// store, and leave with _exit.

#include <ddp/comm/error.h>
#include <ddp/store/file_store.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{10000};

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    path_ = ::testing::TempDir() + "ddp_file_store_test_" + std::to_string(::getpid()) + "_" +
        std::to_string(counter++);
    ::unlink(path_.c_str());
  }
  void TearDown() override {
    ::unlink(path_.c_str());
  }

  // Runs `body` in a child process; returns its pid. The child exits 0 when
  // `body` returns, 1 when it throws.
  template <typename Body>
  pid_t spawn(Body body) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        body();
      } catch (...) {
        code = 1;
      }
      ::_exit(code);
    }
    EXPECT_GT(pid, 0);
    return pid;
  }

  // Waits for `pid` for up to 20 s (then kills it); returns its exit code, or
  // -1 when it did not exit normally.
  static int join(pid_t pid) {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        return -1;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  int64_t file_size() const {
    struct stat st {};
    EXPECT_EQ(::stat(path_.c_str(), &st), 0);
    return st.st_size;
  }

  std::string path_;
};

TEST_F(FileStoreTest, ForkedProcessesAddToOneCounter) {
  constexpr int kChildren = 4;
  constexpr int kAdds = 100;
  FileStore store(path_, kTimeout);
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    children.push_back(spawn([&, c] {
      FileStore child_store(path_, kTimeout);
      for (int i = 0; i < kAdds; ++i) {
        child_store.add("counter", c + 1);
      }
      child_store.set("child/" + std::to_string(c), std::string("done"));
    }));
  }
  for (int i = 0; i < kAdds; ++i) {
    store.add("counter", 100);
  }
  for (pid_t pid : children) {
    EXPECT_EQ(join(pid), 0);
  }
  // The children add c + 1 for c < 4 (10 in all) and the parent 100, kAdds
  // times each.
  EXPECT_EQ(store.get_string("counter"), std::to_string(kAdds * (kChildren * (kChildren + 1) / 2 + 100)));
  for (int c = 0; c < kChildren; ++c) {
    EXPECT_EQ(store.get_string("child/" + std::to_string(c)), "done");
  }
  EXPECT_EQ(store.num_keys(), kChildren + 1);
}

TEST_F(FileStoreTest, StoreInheritedAcrossForkReopensItsFile) {
  constexpr int kAdds = 200;
  FileStore store(path_, kTimeout);
  store.set("before_fork", std::string("1"));
  // The child uses the parent's object: it must not share the parent's flock.
  const pid_t child = spawn([&] {
    for (int i = 0; i < kAdds; ++i) {
      store.add("counter", 1);
    }
  });
  for (int i = 0; i < kAdds; ++i) {
    store.add("counter", 1);
  }
  EXPECT_EQ(join(child), 0);
  EXPECT_EQ(store.get_string("counter"), std::to_string(2 * kAdds));
}

TEST_F(FileStoreTest, WaitSeesKeysFromAnotherProcess) {
  FileStore store(path_, kTimeout);
  const pid_t child = spawn([&] {
    FileStore child_store(path_, kTimeout);
    child_store.wait({"go"});
    child_store.set("ack", child_store.get_string("go") + "!");
  });
  std::this_thread::sleep_for(milliseconds(100));
  store.set("go", std::string("hello"));
  EXPECT_EQ(store.get_string("ack"), "hello!");
  EXPECT_EQ(join(child), 0);
}

TEST_F(FileStoreTest, KeysOutliveTheStoreThatWroteThem) {
  {
    FileStore writer(path_, kTimeout);
    writer.set("a", std::string("1"));
    writer.set("b", std::string("2"));
    writer.add("n", 7);
    writer.delete_key("b");
  }
  FileStore reader(path_, kTimeout);
  EXPECT_EQ(reader.num_keys(), 2);
  EXPECT_EQ(reader.get_string("a"), "1");
  EXPECT_EQ(reader.get_string("n"), "7");
  EXPECT_FALSE(reader.check({"b"}));
}

TEST_F(FileStoreTest, TornLastRecordIsIgnoredThenCutOff) {
  {
    FileStore store(path_, kTimeout);
    store.set("a", std::string("1"));
  }
  const int64_t clean_size = file_size();
  {
    // A writer that died mid-append: a set record claiming a 100-byte key,
    // of which 3 bytes made it.
    std::ofstream out(path_, std::ios::binary | std::ios::app);
    const char torn[] = {'S', 100, 0, 0, 0, 'a', 'b', 'c'};
    out.write(torn, sizeof(torn));
  }
  EXPECT_EQ(file_size(), clean_size + 8);
  FileStore store(path_, kTimeout);
  EXPECT_EQ(store.get_string("a"), "1");
  EXPECT_EQ(store.num_keys(), 1);
  store.set("b", std::string("2"));
  FileStore other(path_, kTimeout);
  EXPECT_EQ(other.get_string("a"), "1");
  EXPECT_EQ(other.get_string("b"), "2");
  EXPECT_EQ(other.num_keys(), 2);
}

TEST_F(FileStoreTest, FileThatIsNotAStoreIsAnIoError) {
  {
    std::ofstream out(path_, std::ios::binary);
    out << "hello, this is not a store";
  }
  try {
    FileStore store(path_, kTimeout);
    FAIL() << "opened a file that is not a store";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("not a FileStore file"), std::string::npos) << e.what();
  }
}

TEST_F(FileStoreTest, UnopenablePathIsAnIoError) {
  const std::string bad = "/nonexistent_ddp_dir/store";
  try {
    FileStore store(bad, kTimeout);
    FAIL() << "opened " << bad;
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  EXPECT_THROW(FileStore("", kTimeout), c10::Error);
}

TEST_F(FileStoreTest, WaitTimeoutNamesTheFile) {
  FileStore store(path_, kTimeout);
  try {
    store.wait({"never"}, milliseconds(100));
    FAIL() << "wait did not time out";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
  }
}

} // namespace
} // namespace ddp
