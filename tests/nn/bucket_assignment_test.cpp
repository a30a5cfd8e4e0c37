// Bucket assignment (src/reducer/bucket_assignment.h): a pure function, so
// no process group. Hand-worked cases first, then a sweep that checks the
// rules on many inputs: every gradient once, one dtype and device per
// bucket, fill order kept, and buckets closed exactly when they reach their
// limit; last, PyTorch's own function on 400 generated cases
// (bucket_reference.py).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "reducer/bucket_assignment.h"

#include "testing/command_output.h"
#include "testing/errors.h"

namespace ddp::internal {
namespace {

using ddp::testing::error_of;

using Buckets = std::vector<std::vector<size_t>>;

constexpr size_t kMiB = size_t{1} << 20;

GradientSpec cpu_float(size_t bytes) {
  return {c10::kFloat, c10::Device(c10::kCPU), bytes};
}

std::vector<GradientSpec> cpu_floats(const std::vector<size_t>& bytes) {
  std::vector<GradientSpec> specs;
  for (size_t b : bytes) {
    specs.push_back(cpu_float(b));
  }
  return specs;
}

TEST(BucketAssignmentTest, NoGradientsMeanNoBuckets) {
  EXPECT_EQ(compute_bucket_assignment_by_size({}, {kMiB, 25 * kMiB}), Buckets{});
}

TEST(BucketAssignmentTest, SmallModelIsOneBucketInReverseOrder) {
  EXPECT_EQ(compute_bucket_assignment_by_size(cpu_floats({40, 4, 400, 8}), {kMiB, 25 * kMiB}),
            (Buckets{{3, 2, 1, 0}}));
}

TEST(BucketAssignmentTest, FirstBucketUsesTheFirstLimitAndTheRestTheSecond) {
  // PyTorch's defaults: the last layers' gradients fill a 1 MiB bucket, the
  // others 25 MiB ones.
  const size_t k600KiB = 600 * 1024;
  EXPECT_EQ(compute_bucket_assignment_by_size(cpu_floats({k600KiB, k600KiB, k600KiB, k600KiB}),
                                              {kMiB, 25 * kMiB}),
            (Buckets{{3, 2}, {1, 0}}));
  // A gradient larger than the limit closes the bucket it joins.
  EXPECT_EQ(compute_bucket_assignment_by_size(cpu_floats({8, 30 * kMiB, 8}), {kMiB, 25 * kMiB}),
            (Buckets{{2, 1}, {0}}));
}

TEST(BucketAssignmentTest, BucketClosesWhenItReachesTheLimit) {
  EXPECT_EQ(compute_bucket_assignment_by_size(cpu_floats({100, 100, 100}), {100}),
            (Buckets{{2}, {1}, {0}}));
  EXPECT_EQ(compute_bucket_assignment_by_size(cpu_floats({99, 99, 99}), {100}),
            (Buckets{{2, 1}, {0}}));
}

TEST(BucketAssignmentTest, LastLimitRepeats) {
  EXPECT_EQ(compute_bucket_assignment_by_size(cpu_floats({100, 100, 100, 100, 100}), {100, 200}),
            (Buckets{{4}, {3, 2}, {1, 0}}));
}

TEST(BucketAssignmentTest, ZeroByteGradientsJoinTheOpenBucket) {
  EXPECT_EQ(compute_bucket_assignment_by_size(cpu_floats({0, 0, 0}), {100}),
            (Buckets{{2, 1, 0}}));
  EXPECT_EQ(compute_bucket_assignment_by_size(cpu_floats({0, 100, 0}), {100}),
            (Buckets{{2, 1}, {0}}));
}

TEST(BucketAssignmentTest, DtypesNeverShareABucket) {
  const std::vector<GradientSpec> specs = {
      {c10::kFloat, c10::Device(c10::kCPU), 100},
      {c10::kDouble, c10::Device(c10::kCPU), 100},
      {c10::kFloat, c10::Device(c10::kCPU), 100},
      {c10::kDouble, c10::Device(c10::kCPU), 100},
  };
  // Filled from index 3 down; buckets come out in the order of their first
  // gradient: the double bucket starts at 3, the float one at 2.
  EXPECT_EQ(compute_bucket_assignment_by_size(specs, {kMiB}), (Buckets{{3, 1}, {2, 0}}));
}

TEST(BucketAssignmentTest, EachDtypeHasItsOwnSequenceOfLimits) {
  std::vector<GradientSpec> specs;
  for (int i = 0; i < 3; ++i) {
    specs.push_back({c10::kFloat, c10::Device(c10::kCPU), 100});
  }
  for (int i = 0; i < 3; ++i) {
    specs.push_back({c10::kDouble, c10::Device(c10::kCPU), 100});
  }
  // Doubles 5, 4 fill their first (150-byte) bucket, 3 opens a 1000-byte
  // one; then the floats start over with a 150-byte first bucket.
  EXPECT_EQ(compute_bucket_assignment_by_size(specs, {150, 1000}),
            (Buckets{{5, 4}, {3}, {2, 1}, {0}}));
}

TEST(BucketAssignmentTest, DevicesNeverShareABucket) {
  const std::vector<GradientSpec> specs = {
      {c10::kFloat, c10::Device(c10::kCPU), 4},
      {c10::kFloat, c10::Device(c10::kCUDA, 0), 4},
      {c10::kFloat, c10::Device(c10::kCUDA, 1), 4},
      {c10::kFloat, c10::Device(c10::kCUDA, 0), 4},
  };
  EXPECT_EQ(compute_bucket_assignment_by_size(specs, {kMiB}), (Buckets{{3, 1}, {2}, {0}}));
}

TEST(BucketAssignmentTest, FillOrderIsFollowed) {
  // After the first iteration: the order in which gradients became ready.
  EXPECT_EQ(compute_bucket_assignment_by_size(cpu_floats({4, 4, 4, 4}), {kMiB}, {0, 2, 1, 3}),
            (Buckets{{0, 2, 1, 3}}));
  EXPECT_EQ(compute_bucket_assignment_by_size(cpu_floats({100, 100, 100, 100}), {100, 200},
                                              {0, 2, 1, 3}),
            (Buckets{{0}, {2, 1}, {3}}));
}

TEST(BucketAssignmentTest, SparseGradientsGetABucketOfTheirOwn) {
  // An Embedding (sparse) between Linear layers: the dense gradients around
  // it still share one bucket, and it takes no part in the first limit.
  auto specs = cpu_floats({40, 4000, 400, 8});
  specs[1].sparse = true;
  EXPECT_EQ(compute_bucket_assignment_by_size(specs, {kMiB, 25 * kMiB}), (Buckets{{3, 2, 0}, {1}}));
  // Two sparse gradients of the same dtype never share, whatever the limit.
  specs[2].sparse = true;
  EXPECT_EQ(compute_bucket_assignment_by_size(specs, {kMiB}), (Buckets{{3, 0}, {2}, {1}}));
  EXPECT_EQ(compute_bucket_assignment_by_size(specs, {1}), (Buckets{{3}, {2}, {1}, {0}}));
  // In fill order, too: a sparse gradient ready first is launched first.
  EXPECT_EQ(compute_bucket_assignment_by_size(specs, {kMiB}, {1, 0, 2, 3}),
            (Buckets{{1}, {0, 3}, {2}}));
}

TEST(BucketAssignmentTest, BadArgumentsAreErrors) {
  EXPECT_NE(error_of([] { compute_bucket_assignment_by_size(cpu_floats({4}), {}); })
                .find("size limits"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              compute_bucket_assignment_by_size(cpu_floats({4, 4, 4}), {kMiB}, {0, 1});
            }).find("fill order"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              compute_bucket_assignment_by_size(cpu_floats({4, 4, 4}), {kMiB}, {0, 1, 1});
            }).find("not a permutation"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              compute_bucket_assignment_by_size(cpu_floats({4, 4, 4}), {kMiB}, {0, 1, 3});
            }).find("not a permutation"),
            std::string::npos);
}

// ---- The sweep: gradient count x limits x dtype mix x fill order

struct SweepCase {
  size_t gradients;
  std::vector<size_t> limits;
  bool mixed_dtypes;
  bool shuffled;
};

std::string case_name(const ::testing::TestParamInfo<SweepCase>& info) {
  std::string name = std::to_string(info.param.gradients) + "_gradients_limits";
  for (size_t limit : info.param.limits) {
    name += "_" + std::to_string(limit);
  }
  name += info.param.mixed_dtypes ? "_mixed" : "_float";
  name += info.param.shuffled ? "_shuffled" : "_reverse";
  return name;
}

class BucketAssignmentSweepTest : public ::testing::TestWithParam<SweepCase> {};

TEST_P(BucketAssignmentSweepTest, RulesHold) {
  const SweepCase& c = GetParam();
  std::vector<GradientSpec> specs;
  for (size_t i = 0; i < c.gradients; ++i) {
    // Sizes 0 to 196 bytes, zeros included, in no particular order.
    const auto dtype = c.mixed_dtypes && i % 3 == 1 ? c10::kDouble : c10::kFloat;
    specs.push_back({dtype, c10::Device(c10::kCPU), 4 * ((i * 37) % 50)});
  }
  std::vector<size_t> fill_order(c.gradients);
  std::iota(fill_order.rbegin(), fill_order.rend(), size_t{0});
  if (c.shuffled) {
    std::mt19937 random(42);
    std::shuffle(fill_order.begin(), fill_order.end(), random);
  }
  const auto buckets = compute_bucket_assignment_by_size(
      specs, c.limits, c.shuffled ? fill_order : std::vector<size_t>{});

  std::vector<size_t> position(c.gradients);
  for (size_t p = 0; p < fill_order.size(); ++p) {
    position[fill_order[p]] = p;
  }
  std::vector<int> times_seen(c.gradients, 0);
  std::map<c10::ScalarType, size_t> buckets_of_dtype; // how many closed so far, per dtype
  for (size_t b = 0; b < buckets.size(); ++b) {
    const auto& bucket = buckets[b];
    ASSERT_FALSE(bucket.empty()) << "bucket " << b;
    if (b > 0) {
      EXPECT_LT(position[buckets[b - 1].front()], position[bucket.front()])
          << "buckets are not in the order of their first gradient";
    }
    const auto dtype = specs[bucket.front()].dtype;
    size_t bytes = 0;
    for (size_t k = 0; k < bucket.size(); ++k) {
      ASSERT_LT(bucket[k], c.gradients);
      ++times_seen[bucket[k]];
      EXPECT_EQ(specs[bucket[k]].dtype, dtype) << "bucket " << b << " mixes dtypes";
      if (k > 0) {
        EXPECT_LT(position[bucket[k - 1]], position[bucket[k]])
            << "bucket " << b << " is not in fill order";
      }
      bytes += specs[bucket[k]].bytes;
    }
    // The k-th bucket of a dtype has the k-th limit (the last repeating): it
    // was still open before its last gradient, and is full unless it is the
    // dtype's last bucket.
    const size_t k = buckets_of_dtype[dtype]++;
    const size_t limit = c.limits[std::min(k, c.limits.size() - 1)];
    EXPECT_LT(bytes - specs[bucket.back()].bytes, limit) << "bucket " << b << " overflowed";
    if (bytes < limit) {
      // Only the last bucket of its dtype may be left under its limit.
      const auto same_dtype = [&](const auto& later) {
        return specs[later.front()].dtype == dtype;
      };
      EXPECT_TRUE(std::none_of(buckets.begin() + static_cast<std::ptrdiff_t>(b) + 1, buckets.end(),
                               same_dtype))
          << "bucket " << b << " was closed below its limit of " << limit << " bytes";
    }
  }
  for (size_t i = 0; i < c.gradients; ++i) {
    EXPECT_EQ(times_seen[i], 1) << "gradient " << i;
  }
}

std::vector<SweepCase> sweep_cases() {
  std::vector<SweepCase> cases;
  const std::vector<std::vector<size_t>> limits = {{1}, {64}, {kMiB, 25 * kMiB}, {100, 300}};
  for (size_t gradients : {size_t{0}, size_t{1}, size_t{7}, size_t{200}}) {
    for (const auto& limit : limits) {
      for (bool mixed : {false, true}) {
        for (bool shuffled : {false, true}) {
          cases.push_back({gradients, limit, mixed, shuffled});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sweep, BucketAssignmentSweepTest, ::testing::ValuesIn(sweep_cases()),
                         case_name);

// ---- Against PyTorch ----------------------------------------------------------------

#ifndef DDP_TEST_PYTHON
#error "DDP_TEST_PYTHON must name the Python interpreter that has torch"
#endif

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) {
    parts.push_back(part);
  }
  if (!text.empty() && text.back() == separator) {
    parts.emplace_back();
  }
  return parts;
}

std::vector<size_t> numbers(const std::string& text) {
  std::vector<size_t> values;
  for (const auto& part : split(text, ',')) {
    values.push_back(static_cast<size_t>(std::stoull(part)));
  }
  return values;
}

// One line of bucket_reference.py: a case and PyTorch's buckets for it.
struct ReferenceCase {
  std::string line;
  std::vector<GradientSpec> gradients;
  std::vector<size_t> limits;
  std::vector<size_t> order; // empty: index order (construction)
  Buckets buckets;
};

std::vector<ReferenceCase> reference_cases() {
  const std::string output = ddp::testing::command_output(
      std::string(DDP_TEST_PYTHON) + " " + DDP_BUCKET_REFERENCE_SCRIPT);
  std::vector<ReferenceCase> cases;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    const auto fields = split(line, '|');
    EXPECT_EQ(fields.size(), 6u) << "malformed line: " << line;
    if (fields.size() != 6) {
      continue;
    }
    ReferenceCase c;
    c.line = line;
    const auto dtypes = numbers(fields[0]);
    const auto numels = numbers(fields[1]);
    const auto sparse = numbers(fields[2]);
    for (size_t i = 0; i < dtypes.size(); ++i) {
      const auto dtype = static_cast<c10::ScalarType>(dtypes[i]);
      c.gradients.push_back({dtype, c10::Device(c10::kCPU), numels[i] * c10::elementSize(dtype),
                             sparse[i] != 0});
    }
    c.limits = numbers(fields[3]);
    if (fields[4] != "-") {
      c.order = numbers(fields[4]);
    }
    for (const auto& bucket : split(fields[5], ';')) {
      c.buckets.push_back(numbers(bucket));
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// The buckets of one kind (dtype, and sparse or dense), in their order in
// `buckets`.
Buckets of_kind(const Buckets& buckets, const std::vector<GradientSpec>& gradients,
                c10::ScalarType dtype, bool sparse) {
  Buckets selected;
  for (const auto& bucket : buckets) {
    const auto& first = gradients[bucket.front()];
    if (first.dtype == dtype && first.sparse == sparse) {
      selected.push_back(bucket);
    }
  }
  return selected;
}

// At construction (no fill order given to PyTorch; ours is given index
// order, as PyTorch's DDP passes its parameters) the buckets must be the
// same lists in the same order: PyTorch sorts them by their smallest index,
// ours by their first gradient in fill order, which is the same there. For
// a rebuild (a fill order: PyTorch's Reducer passes the tensors in the order
// they became ready, with their indices), PyTorch returns the buckets that
// closed in the order they closed, a sparse one at once, and then the open
// ones in its hash map's order, which interleaves the kinds arbitrarily; ours
// come in the order of their first gradient. The same buckets, each with the
// same indices in the same order, and the same order among the buckets of
// one kind (dtype, dense or sparse), are what must hold; the launch order
// across kinds does not change any result.
TEST(BucketAssignmentTest, MatchesPyTorchOnGeneratedCases) {
  const auto cases = reference_cases();
  ASSERT_EQ(cases.size(), 400u) << "bucket_reference.py prints 400 cases";
  int rebuilds = 0;
  int failures = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE("case " + c.line);
    std::vector<size_t> order = c.order;
    if (order.empty()) {
      order.resize(c.gradients.size());
      std::iota(order.begin(), order.end(), size_t{0});
    } else {
      ++rebuilds;
    }
    const Buckets ours = compute_bucket_assignment_by_size(c.gradients, c.limits, order);
    bool same = false;
    if (c.order.empty()) {
      same = ours == c.buckets;
    } else {
      Buckets sorted_ours = ours;
      Buckets sorted_theirs = c.buckets;
      std::sort(sorted_ours.begin(), sorted_ours.end());
      std::sort(sorted_theirs.begin(), sorted_theirs.end());
      same = sorted_ours == sorted_theirs;
      for (auto dtype : {c10::kFloat, c10::kDouble, c10::kHalf}) {
        for (bool sparse : {false, true}) {
          same = same && of_kind(ours, c.gradients, dtype, sparse) ==
                             of_kind(c.buckets, c.gradients, dtype, sparse);
        }
      }
    }
    if (!same) {
      ADD_FAILURE() << "ours " << ::testing::PrintToString(ours) << ", PyTorch's "
                    << ::testing::PrintToString(c.buckets);
      if (++failures == 10) {
        break;
      }
    }
  }
  EXPECT_GT(rebuilds, 100) << "the generated cases should include fill orders";
}

} // namespace
} // namespace ddp::internal
