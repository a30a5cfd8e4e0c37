// The Store contract (store_contract.h): what every store does, whatever
// keeps its keys. The tests of one store's own behaviour are in its file.

#include "store/store_contract.h"

#include <ddp/comm/error.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <thread>

namespace ddp::store_contract {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

} // namespace

void StoreContractTest::SetUp() {
  handle_ = GetParam().make();
  ASSERT_TRUE(handle_.store) << GetParam().name << " could not be made: " << handle_.unavailable;
  store_ = handle_.store;
}

void StoreContractTest::TearDown() {
  store_.reset();
  handle_ = StoreHandle{};
}

std::string kind_name(const ::testing::TestParamInfo<StoreKind>& info) {
  return info.param.name;
}

TEST_P(StoreContractTest, SetThenGetReturnsTheBytes) {
  const std::vector<uint8_t> binary{0, 1, 2, 0xff, 0, 'x'};
  store_->set("k", binary);
  EXPECT_EQ(store_->get("k"), binary);
  store_->set("k", std::string("second"));
  EXPECT_EQ(store_->get_string("k"), "second");
  store_->set("empty", std::string());
  EXPECT_TRUE(store_->check({"empty"}));
  EXPECT_EQ(store_->get_string("empty"), "");
}

TEST_P(StoreContractTest, LargeValueRoundTrips) {
  std::vector<uint8_t> value(3 * 1024 * 1024 + 7);
  for (size_t i = 0; i < value.size(); ++i) {
    value[i] = static_cast<uint8_t>(i * 131 + 7);
  }
  store_->set("big", value);
  EXPECT_EQ(store_->get("big"), value);
}

TEST_P(StoreContractTest, AddCreatesAndAccumulates) {
  EXPECT_EQ(store_->add("c", 1), 1);
  EXPECT_EQ(store_->add("c", 5), 6);
  EXPECT_EQ(store_->add("c", -10), -4);
  EXPECT_EQ(store_->get_string("c"), "-4");
  store_->set("n", std::string("41"));
  EXPECT_EQ(store_->add("n", 1), 42);
  EXPECT_EQ(store_->add("zero", 0), 0);
  EXPECT_EQ(store_->get_string("zero"), "0");
}

TEST_P(StoreContractTest, AddToANonNumberIsMisuse) {
  store_->set("word", std::string("abc"));
  try {
    store_->add("word", 1);
    FAIL() << "add to a non-number did not throw";
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, "'abc'")) << message;
    for (const auto& name : handle_.add_error_names) {
      EXPECT_TRUE(contains(message, name)) << message;
    }
  }
  // The store still works afterwards (a client's on a new connection).
  EXPECT_EQ(store_->add("c", 2), 2);
  EXPECT_EQ(store_->get_string("word"), "abc");
}

TEST_P(StoreContractTest, CompareSetFollowsC10dSemantics) {
  // Missing key, empty expected: set.
  EXPECT_EQ(store_->compare_set("a", {}, bytes("one")), bytes("one"));
  EXPECT_EQ(store_->get_string("a"), "one");
  // Missing key, non-empty expected: nothing set, expected returned.
  EXPECT_EQ(store_->compare_set("b", bytes("x"), bytes("y")), bytes("x"));
  EXPECT_FALSE(store_->check({"b"}));
  // Present and equal: swapped.
  EXPECT_EQ(store_->compare_set("a", bytes("one"), bytes("two")), bytes("two"));
  EXPECT_EQ(store_->get_string("a"), "two");
  // Present and different: unchanged, current value returned.
  EXPECT_EQ(store_->compare_set("a", bytes("one"), bytes("three")), bytes("two"));
  EXPECT_EQ(store_->get_string("a"), "two");
}

TEST_P(StoreContractTest, CheckReportsWhetherAllKeysExist) {
  EXPECT_TRUE(store_->check({}));
  EXPECT_FALSE(store_->check({"a"}));
  store_->set("a", std::string("1"));
  EXPECT_TRUE(store_->check({"a"}));
  EXPECT_FALSE(store_->check({"a", "b"}));
}

TEST_P(StoreContractTest, WaitReturnsAtOnceForExistingKeys) {
  store_->set("a", std::string("1"));
  store_->set("b", std::string("2"));
  // "At once" is judged against the deadline under test: a wait that
  // returned only at its deadline (or at half of it, on a very slow
  // machine) did not see the keys were there.
  constexpr milliseconds kWaitTimeout(5000);
  const auto start = Clock::now();
  store_->wait({"a", "b"}, kWaitTimeout);
  store_->wait({"a"}, kWaitTimeout);
  store_->wait({}, kWaitTimeout);
  EXPECT_LT(since(start), kWaitTimeout / 2);
}

TEST_P(StoreContractTest, WaitTimesOutNamingTheMissingKey) {
  store_->set("present_key", std::string("1"));
  const auto start = Clock::now();
  try {
    store_->wait({"present_key", "missing_key"}, milliseconds(200));
    FAIL() << "wait did not time out";
  } catch (const TimeoutError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, "missing_key")) << message;
    EXPECT_FALSE(contains(message, "present_key")) << message;
    EXPECT_TRUE(contains(message, "200 ms")) << message;
    for (const auto& name : handle_.wait_timeout_names) {
      EXPECT_TRUE(contains(message, name)) << message;
    }
  }
  const auto elapsed = since(start);
  EXPECT_GE(elapsed.count(), 190);
  EXPECT_LT(elapsed.count(), 3000);
  // The store is still usable after a timeout, and a server forgot the
  // wait: setting the key later disturbs nothing.
  store_->set("missing_key", std::string("late"));
  store_->set("after", std::string("ok"));
  EXPECT_EQ(store_->get_string("after"), "ok");
}

TEST_P(StoreContractTest, GetTimesOutWithTheStoreTimeout) {
  store_->set_timeout(milliseconds(200));
  const auto start = Clock::now();
  try {
    store_->get("absent_key");
    FAIL() << "get did not time out";
  } catch (const TimeoutError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, "absent_key")) << message;
    EXPECT_TRUE(contains(message, "200 ms")) << message;
    for (const auto& name : handle_.get_timeout_names) {
      EXPECT_TRUE(contains(message, name)) << message;
    }
  }
  const auto elapsed = since(start);
  EXPECT_GE(elapsed.count(), 190);
  EXPECT_LT(elapsed.count(), 3000);
  store_->set("absent_key", std::string("now"));
  EXPECT_EQ(store_->get_string("absent_key"), "now");
}

TEST_P(StoreContractTest, WaitWithoutTimeoutUsesTheStoreTimeout) {
  store_->set_timeout(milliseconds(150));
  EXPECT_EQ(store_->timeout(), milliseconds(150));
  const auto start = Clock::now();
  EXPECT_THROW(store_->wait({"nope"}), TimeoutError);
  EXPECT_GE(since(start).count(), 140);
  EXPECT_LT(since(start).count(), 3000);
}

TEST_P(StoreContractTest, GetBlocksUntilAnotherThreadSets) {
  const auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(150));
    store_->set("late", std::string("value"));
  });
  EXPECT_EQ(store_->get_string("late"), "value");
  EXPECT_GE(since(start).count(), 140);
  setter.join();
}

TEST_P(StoreContractTest, HugeTimeoutMeansWaitLong) {
  // milliseconds::max() as "forever" must not overflow into "already late".
  store_->set_timeout(milliseconds::max());
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    store_->set("slow", std::string("v"));
  });
  EXPECT_EQ(store_->get_string("slow"), "v");
  store_->wait({"slow"}, milliseconds::max());
  setter.join();
}

TEST_P(StoreContractTest, WaitBlocksUntilEveryKeyIsSet) {
  const auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    store_->set("w1", std::string("1"));
    std::this_thread::sleep_for(milliseconds(100));
    store_->add("w2", 1);
  });
  store_->wait({"w1", "w2"}, milliseconds(5000));
  EXPECT_GE(since(start).count(), 140);
  EXPECT_TRUE(store_->check({"w1", "w2"}));
  setter.join();
}

TEST_P(StoreContractTest, OneSetWakesManyWaiters) {
  constexpr int kWaiters = 4;
  std::atomic<int> woken{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&] {
      if (store_->get_string("go") == "now") {
        ++woken;
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(100));
  store_->set("go", std::string("now"));
  for (auto& t : waiters) {
    t.join();
  }
  EXPECT_EQ(woken.load(), kWaiters);
}

TEST_P(StoreContractTest, DeleteKeyRemovesIt) {
  store_->set("d", std::string("1"));
  EXPECT_EQ(store_->num_keys(), 1);
  EXPECT_TRUE(store_->delete_key("d"));
  EXPECT_FALSE(store_->check({"d"}));
  EXPECT_FALSE(store_->delete_key("d"));
  EXPECT_EQ(store_->num_keys(), 0);
  store_->set("d", std::string("again"));
  EXPECT_EQ(store_->get_string("d"), "again");
}

TEST_P(StoreContractTest, NumKeysCountsDistinctKeys) {
  EXPECT_EQ(store_->num_keys(), 0);
  store_->set("a", std::string("1"));
  store_->set("b", std::string("1"));
  store_->set("c", std::string("1"));
  EXPECT_EQ(store_->num_keys(), 3);
  store_->set("a", std::string("2"));
  EXPECT_EQ(store_->num_keys(), 3);
  store_->add("n", 1);
  EXPECT_EQ(store_->num_keys(), 4);
  store_->compare_set("cs", {}, bytes("x"));
  EXPECT_EQ(store_->num_keys(), 5);
  store_->delete_key("b");
  EXPECT_EQ(store_->num_keys(), 4);
}

TEST_P(StoreContractTest, ConcurrentAddsAreAtomic) {
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 50;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        seen[t].push_back(store_->add("counter", 1));
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  constexpr int kTotal = kThreads * kAddsPerThread;
  EXPECT_EQ(store_->get_string("counter"), std::to_string(kTotal));
  // Every add saw a distinct value: 1..kTotal, each once.
  std::vector<int64_t> all;
  for (const auto& s : seen) {
    all.insert(all.end(), s.begin(), s.end());
  }
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), static_cast<size_t>(kTotal));
  for (int i = 0; i < kTotal; ++i) {
    EXPECT_EQ(all[i], i + 1);
  }
}

TEST_P(StoreContractTest, NegativeWaitTimeoutIsMisuse) {
  EXPECT_THROW(store_->wait({"x"}, milliseconds(-1)), c10::Error);
}

} // namespace ddp::store_contract
