// Tests of ddp::DistributedSampler: parity with PyTorch's
// torch.utils.data.DistributedSampler, use with torch::data::make_data_loader,
// save/load mid-epoch, errors, and the set_epoch warning. The default process
// group is faked (see fake_default_placement.h).

#include <ddp/data/distributed_sampler.h>

#include "data/fake_default_placement.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "testing/command_output.h"
#include "testing/errors.h"

#ifndef DDP_TEST_PYTHON
#error "DDP_TEST_PYTHON must name the Python interpreter that has torch"
#endif
#ifndef DDP_SAMPLER_REFERENCE_SCRIPT
#error "DDP_SAMPLER_REFERENCE_SCRIPT must name tests/data/sampler_reference.py"
#endif

namespace ddp {
namespace {

using ddp::testing::error_of;

using Indices = std::vector<size_t>;

DistributedSamplerOptions explicit_options(int num_replicas, int rank) {
  return DistributedSamplerOptions().num_replicas(num_replicas).rank(rank);
}

// Every index of the sampler's current pass, `batch_size` at a time.
Indices drain(DistributedSampler& sampler, size_t batch_size) {
  Indices all;
  while (auto batch = sampler.next(batch_size)) {
    EXPECT_FALSE(batch->empty());
    EXPECT_LE(batch->size(), batch_size);
    all.insert(all.end(), batch->begin(), batch->end());
  }
  return all;
}

size_t count_of(const std::string& haystack, const std::string& needle) {
  size_t count = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

// Resets the fake default process group around every test.
class DistributedSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::set_fake_default_placement({});
  }
  void TearDown() override {
    testing::set_fake_default_placement({});
  }
};

// ---- Parity with PyTorch ---------------------------------------------------

struct ReferenceCase {
  size_t length = 0;
  int num_replicas = 0;
  int rank = 0;
  bool shuffle = false;
  int64_t seed = 0;
  int64_t epoch = 0;
  bool drop_last = false;
  size_t num_samples = 0;
  Indices indices;
  std::string header;
};

bool python_has_torch() {
  return std::system(DDP_TEST_PYTHON " -c 'import torch' >/dev/null 2>&1") == 0;
}

// Runs sampler_reference.py once and parses its lines.
std::vector<ReferenceCase> reference_cases() {
  const std::string output = ddp::testing::command_output(
      std::string(DDP_TEST_PYTHON) + " " + DDP_SAMPLER_REFERENCE_SCRIPT);

  std::vector<ReferenceCase> cases;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    EXPECT_NE(colon, std::string::npos) << "malformed line: " << line;
    if (colon == std::string::npos) {
      continue;
    }
    ReferenceCase c;
    c.header = line.substr(0, colon);
    std::istringstream header(c.header);
    int shuffle = 0;
    int drop_last = 0;
    header >> c.length >> c.num_replicas >> c.rank >> shuffle >> c.seed >>
        c.epoch >> drop_last >> c.num_samples;
    EXPECT_FALSE(header.fail()) << "malformed line: " << line;
    c.shuffle = shuffle != 0;
    c.drop_last = drop_last != 0;
    std::istringstream values(line.substr(colon + 1));
    size_t index = 0;
    while (values >> index) {
      c.indices.push_back(index);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST_F(DistributedSamplerTest, MatchesPyTorchIndexForIndex) {
  // The README's set-up installs python3-torch; without it this parity
  // check cannot run, which is a failure, not a reason to skip.
  ASSERT_TRUE(python_has_torch()) << DDP_TEST_PYTHON
                                  << " cannot import torch: install Debian's python3-torch";
  const std::vector<ReferenceCase> cases = reference_cases();
  // 10 lengths x 17 (replicas, rank) pairs x 24 settings, plus extra seeds.
  ASSERT_GE(cases.size(), 4080u);

  int failures = 0;
  for (size_t i = 0; i < cases.size() && failures < 20; ++i) {
    const ReferenceCase& c = cases[i];
    SCOPED_TRACE("case (length replicas rank shuffle seed epoch drop_last "
                 "len) = (" + c.header + ")");
    DistributedSampler sampler(
        c.length,
        explicit_options(c.num_replicas, c.rank)
            .shuffle(c.shuffle)
            .seed(c.seed)
            .drop_last(c.drop_last));
    sampler.set_epoch(c.epoch);
    sampler.reset();
    const size_t batch_size = 1 + i % 5; // Most do not divide num_samples.
    const Indices drained = drain(sampler, batch_size);
    const bool ok = sampler.num_samples() == c.num_samples &&
        drained == c.indices && sampler.epoch_indices() == c.indices &&
        sampler.total_size() == c.num_samples * c.num_replicas;
    if (!ok) {
      ++failures;
      EXPECT_EQ(sampler.num_samples(), c.num_samples);
      EXPECT_EQ(drained, c.indices) << "through next(" << batch_size << ")";
      EXPECT_EQ(sampler.epoch_indices(), c.indices);
    }
  }
  EXPECT_EQ(failures, 0) << "(stopped after 20 mismatching cases)";
}

// ---- Closed-form properties, with or without Python ------------------------

class DistributedSamplerSweepTest
    : public ::testing::TestWithParam<std::tuple<int, size_t, bool>> {};

TEST_P(DistributedSamplerSweepTest, SharesCoverTheDataset) {
  const auto [num_replicas, length, drop_last] = GetParam();
  const size_t num_samples = drop_last
      ? length / num_replicas
      : (length + num_replicas - 1) / num_replicas;
  for (const bool shuffle : {false, true}) {
    std::map<size_t, int> seen;
    for (int rank = 0; rank < num_replicas; ++rank) {
      DistributedSampler sampler(
          length,
          explicit_options(num_replicas, rank)
              .shuffle(shuffle)
              .drop_last(drop_last));
      ASSERT_EQ(sampler.num_samples(), num_samples);
      const Indices share = drain(sampler, 3);
      ASSERT_EQ(share.size(), num_samples);
      if (!shuffle) {
        for (size_t k = 0; k < share.size(); ++k) {
          EXPECT_EQ(share[k], (rank + k * num_replicas) % length);
        }
      }
      for (size_t index : share) {
        ASSERT_LT(index, length);
        ++seen[index];
      }
    }
    if (drop_last) {
      // No index twice, and only the remainder left out.
      EXPECT_EQ(seen.size(), num_samples * num_replicas);
      for (const auto& [index, count] : seen) {
        EXPECT_EQ(count, 1) << "index " << index;
      }
    } else {
      // Every index at least once; the padding repeats at most
      // num_replicas - 1 of them once more (or more when length is small).
      EXPECT_EQ(seen.size(), length);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizesAndLengths,
    DistributedSamplerSweepTest,
    ::testing::Combine(
        ::testing::Values(1, 2, 3, 4),
        ::testing::Values<size_t>(0, 1, 7, 1000),
        ::testing::Bool()));

TEST_F(DistributedSamplerTest, EpochsShuffleDifferentlyAndRepeatably) {
  DistributedSampler sampler(100, explicit_options(2, 1).seed(3));
  const Indices epoch0 = sampler.epoch_indices();
  sampler.set_epoch(1);
  const Indices epoch1 = sampler.epoch_indices();
  EXPECT_NE(epoch0, epoch1);
  sampler.set_epoch(0);
  EXPECT_EQ(sampler.epoch_indices(), epoch0);
  // The same epoch with another seed is another order.
  DistributedSampler reseeded(100, explicit_options(2, 1).seed(4));
  EXPECT_NE(reseeded.epoch_indices(), epoch0);
}

TEST_F(DistributedSamplerTest, SetEpochAppliesToTheNextPass) {
  DistributedSampler sampler(50, explicit_options(2, 0));
  const Indices epoch0 = sampler.epoch_indices();
  sampler.set_epoch(1);
  const Indices epoch1 = sampler.epoch_indices();
  sampler.set_epoch(0);

  auto first = sampler.next(10);
  ASSERT_TRUE(first.has_value());
  sampler.set_epoch(1); // Mid-pass: the pass keeps epoch 0, as in PyTorch.
  Indices rest = drain(sampler, 10);
  rest.insert(rest.begin(), first->begin(), first->end());
  EXPECT_EQ(rest, epoch0);

  sampler.reset();
  EXPECT_EQ(drain(sampler, 10), epoch1);
}

TEST_F(DistributedSamplerTest, ResetWithNewSizeResizes) {
  DistributedSampler sampler(10, explicit_options(3, 2).shuffle(false));
  EXPECT_EQ(sampler.num_samples(), 4u);
  sampler.reset(20);
  EXPECT_EQ(sampler.dataset_size(), 20u);
  EXPECT_EQ(sampler.num_samples(), 7u);
  EXPECT_EQ(drain(sampler, 4), (Indices{2, 5, 8, 11, 14, 17, 0}));
}

TEST_F(DistributedSamplerTest, CopiesShareState) {
  DistributedSampler original(30, explicit_options(2, 0));
  DistributedSampler copy = original;
  original.set_epoch(7);
  EXPECT_EQ(copy.epoch(), 7);
  ASSERT_TRUE(copy.next(4).has_value());
  EXPECT_EQ(original.index(), 4u);

  DistributedSampler moved = std::move(original);
  // A moved-from sampler stays usable: moving copies the shared handle.
  EXPECT_EQ(original.epoch(), 7); // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(moved.index(), 4u);
}

// ---- With torch::data::make_data_loader ------------------------------------

// Example i is the number i, so a batch shows which indices were asked for.
class IndexDataset : public torch::data::datasets::Dataset<IndexDataset, size_t> {
 public:
  explicit IndexDataset(size_t size) : size_(size) {}
  size_t get(size_t index) override {
    return index;
  }
  c10::optional<size_t> size() const override {
    return size_;
  }

 private:
  size_t size_;
};

TEST_F(DistributedSamplerTest, DrivesMakeDataLoader) {
  constexpr size_t kLength = 23;
  constexpr int kReplicas = 3; // 8 indices per replica, one index repeated.
  for (const size_t workers : {0, 2}) {
    for (const size_t batch_size : {3, 5, 8, 10}) {
      SCOPED_TRACE(c10::str("workers ", workers, ", batch_size ", batch_size));
      std::map<int64_t, std::map<size_t, int>> seen_by_epoch;
      for (int rank = 0; rank < kReplicas; ++rank) {
        DistributedSampler sampler(
            kLength, explicit_options(kReplicas, rank).seed(11));
        // The loader holds a copy; set_epoch on `sampler` reaches it.
        auto loader = torch::data::make_data_loader(
            IndexDataset(kLength),
            sampler,
            torch::data::DataLoaderOptions()
                .batch_size(batch_size)
                .workers(workers));
        Indices previous_epoch;
        for (int64_t epoch = 0; epoch < 3; ++epoch) {
          sampler.set_epoch(epoch);
          Indices got;
          std::vector<size_t> batch_sizes;
          for (const std::vector<size_t>& batch : *loader) {
            batch_sizes.push_back(batch.size());
            got.insert(got.end(), batch.begin(), batch.end());
          }
          EXPECT_EQ(got, sampler.epoch_indices());
          ASSERT_EQ(got.size(), 8u);
          for (size_t b = 0; b < batch_sizes.size(); ++b) {
            const size_t expected = std::min(batch_size, 8 - b * batch_size);
            EXPECT_EQ(batch_sizes[b], expected) << "batch " << b;
          }
          EXPECT_NE(got, previous_epoch);
          previous_epoch = got;
          for (size_t index : got) {
            ++seen_by_epoch[epoch][index];
          }
        }
      }
      for (const auto& [epoch, seen] : seen_by_epoch) {
        EXPECT_EQ(seen.size(), kLength) << "epoch " << epoch;
      }
    }
  }
}

// ---- save / load -----------------------------------------------------------

std::string saved_state(const DistributedSampler& sampler) {
  torch::serialize::OutputArchive archive;
  sampler.save(archive);
  std::ostringstream stream;
  archive.save_to(stream);
  return stream.str();
}

void load_state(DistributedSampler& sampler, const std::string& state) {
  torch::serialize::InputArchive archive;
  std::istringstream stream(state);
  archive.load_from(stream);
  sampler.load(archive);
}

DistributedSamplerOptions resume_options(int rank) {
  return explicit_options(3, rank).seed(42);
}

TEST_F(DistributedSamplerTest, LoadResumesMidEpoch) {
  DistributedSampler original(101, resume_options(1));
  original.set_epoch(2);
  original.reset();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(original.next(5).has_value());
  }
  const std::string state = saved_state(original);
  const Indices remaining = drain(original, 5);
  ASSERT_EQ(remaining.size(), 34u - 15u);

  DistributedSampler resumed(101, resume_options(1));
  load_state(resumed, state);
  EXPECT_EQ(resumed.epoch(), 2);
  EXPECT_EQ(resumed.index(), 15u);
  resumed.reset(); // As a data loader's begin() does: keeps the position.
  EXPECT_EQ(drain(resumed, 5), remaining);
  // The next pass starts the epoch over.
  resumed.reset();
  EXPECT_EQ(drain(resumed, 5), original.epoch_indices());

  // A loop that calls set_epoch with the saved epoch still resumes.
  DistributedSampler looped(101, resume_options(1));
  load_state(looped, state);
  looped.set_epoch(2);
  looped.reset();
  EXPECT_EQ(drain(looped, 7), remaining);

  // Moving on to another epoch drops the saved position.
  DistributedSampler moved_on(101, resume_options(1));
  load_state(moved_on, state);
  moved_on.set_epoch(3);
  moved_on.reset();
  EXPECT_EQ(drain(moved_on, 5), moved_on.epoch_indices());
  EXPECT_EQ(moved_on.epoch(), 3);
}

TEST_F(DistributedSamplerTest, LoadResumesADataLoader) {
  DistributedSampler original(40, resume_options(0));
  original.set_epoch(4);
  Indices consumed;
  std::string state;
  {
    auto loader = torch::data::make_data_loader(
        IndexDataset(40), original, torch::data::DataLoaderOptions(3));
    for (const std::vector<size_t>& batch : *loader) {
      consumed.insert(consumed.end(), batch.begin(), batch.end());
      if (consumed.size() == 6) {
        // Inside the loop body the sampler has yielded exactly the batches
        // seen so far (with no workers, nothing is prefetched).
        state = saved_state(original);
        break;
      }
    }
  }
  const Indices all = original.epoch_indices();
  ASSERT_EQ(Indices(all.begin(), all.begin() + 6), consumed);

  DistributedSampler resumed(40, resume_options(0));
  load_state(resumed, state);
  auto loader = torch::data::make_data_loader(
      IndexDataset(40), resumed, torch::data::DataLoaderOptions(3));
  Indices rest;
  for (const std::vector<size_t>& batch : *loader) {
    rest.insert(rest.end(), batch.begin(), batch.end());
  }
  EXPECT_EQ(rest, Indices(all.begin() + 6, all.end()));
}

TEST_F(DistributedSamplerTest, StateSavedOnOneRankResumesAnother) {
  DistributedSampler rank0(101, resume_options(0));
  rank0.set_epoch(1);
  ASSERT_TRUE(rank0.next(9).has_value());
  const std::string state = saved_state(rank0);

  DistributedSampler rank2(101, resume_options(2));
  load_state(rank2, state);
  EXPECT_EQ(rank2.rank(), 2);
  rank2.reset();
  const Indices share = rank2.epoch_indices();
  EXPECT_EQ(drain(rank2, 4), Indices(share.begin() + 9, share.end()));
}

TEST_F(DistributedSamplerTest, SaveBetweenPassesLoadsTheEpoch) {
  DistributedSampler original(12, resume_options(0));
  original.set_epoch(9);
  DistributedSampler resumed(12, resume_options(0));
  load_state(resumed, saved_state(original));
  EXPECT_EQ(resumed.epoch(), 9);
  EXPECT_EQ(resumed.index(), 0u);
  EXPECT_EQ(drain(resumed, 2), original.epoch_indices());
}

TEST_F(DistributedSamplerTest, LoadRejectsAnotherLayout) {
  DistributedSampler original(101, resume_options(0));
  ASSERT_TRUE(original.next(4).has_value());
  const std::string state = saved_state(original);

  DistributedSampler other_world(101, explicit_options(4, 0).seed(42));
  try {
    load_state(other_world, state);
    FAIL() << "expected c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        e.msg().find("saved with num_replicas 3, but this sampler has "
                     "num_replicas 4"),
        std::string::npos)
        << e.msg();
  }
  DistributedSampler other_seed(101, explicit_options(3, 0).seed(43));
  EXPECT_THROW(
      {
        try {
          load_state(other_seed, state);
        } catch (const c10::Error& e) {
          EXPECT_NE(
              e.msg().find("saved with seed 42, but this sampler has seed 43"),
              std::string::npos)
              << e.msg();
          throw;
        }
      },
      c10::Error);
  DistributedSampler other_size(100, resume_options(0));
  EXPECT_THROW(load_state(other_size, state), c10::Error);
  DistributedSampler other_drop(101, resume_options(0).drop_last(true));
  EXPECT_THROW(load_state(other_drop, state), c10::Error);
  DistributedSampler other_shuffle(101, resume_options(0).shuffle(false));
  EXPECT_THROW(load_state(other_shuffle, state), c10::Error);

  // An archive that DistributedSampler::save did not write.
  torch::serialize::OutputArchive empty;
  empty.write("something_else", c10::IValue(int64_t{1}));
  std::ostringstream stream;
  empty.save_to(stream);
  try {
    load_state(original, stream.str());
    FAIL() << "expected c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_NE(e.msg().find("has no 'version' entry"), std::string::npos)
        << e.msg();
  }
}

// ---- Errors ----------------------------------------------------------------

TEST_F(DistributedSamplerTest, RejectsBadPlacement) {
  EXPECT_EQ(
      error_of([] { DistributedSampler(10, explicit_options(2, 3)); }),
      "DistributedSampler: rank 3 is out of range for num_replicas 2 "
      "(expected 0 <= rank < num_replicas)");
  EXPECT_EQ(
      error_of([] { DistributedSampler(10, explicit_options(2, 2)); }),
      "DistributedSampler: rank 2 is out of range for num_replicas 2 "
      "(expected 0 <= rank < num_replicas)");
  EXPECT_EQ(
      error_of([] { DistributedSampler(10, explicit_options(4, -1)); }),
      "DistributedSampler: rank -1 is out of range for num_replicas 4 "
      "(expected 0 <= rank < num_replicas)");
  EXPECT_EQ(
      error_of([] { DistributedSampler(10, explicit_options(0, 0)); }),
      "DistributedSampler: num_replicas must be at least 1 (got 0)");
  EXPECT_EQ(
      error_of([] { DistributedSampler(10, explicit_options(-2, 0)); }),
      "DistributedSampler: num_replicas must be at least 1 (got -2)");
  // With no group, an explicit rank meets a world of size 1.
  EXPECT_EQ(
      error_of([] {
        DistributedSampler(10, DistributedSamplerOptions().rank(1));
      }),
      "DistributedSampler: rank 1 is out of range for num_replicas 1 "
      "(expected 0 <= rank < num_replicas; num_replicas defaulted to a world "
      "of size 1, as no process group is initialized)");
}

TEST_F(DistributedSamplerTest, RejectsZeroBatchSize) {
  DistributedSampler sampler(10, explicit_options(1, 0));
  EXPECT_EQ(
      error_of([&] { sampler.next(0); }),
      "DistributedSampler::next: batch_size must be at least 1 (got 0)");
}

// ---- Defaults from the (fake) default process group ------------------------

TEST_F(DistributedSamplerTest, DefaultsToAWorldOfOneWithoutAGroup) {
  DistributedSampler sampler(7);
  EXPECT_EQ(sampler.num_replicas(), 1);
  EXPECT_EQ(sampler.rank(), 0);
  EXPECT_EQ(sampler.num_samples(), 7u);
  const DistributedSamplerOptions options = sampler.options();
  EXPECT_TRUE(options.shuffle());
  EXPECT_EQ(options.seed(), 0);
  EXPECT_FALSE(options.drop_last());
  Indices all = drain(sampler, 2);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (Indices{0, 1, 2, 3, 4, 5, 6}));
}

TEST_F(DistributedSamplerTest, DefaultsComeFromTheProcessGroup) {
  testing::set_fake_default_placement(
      {/*rank=*/2, /*num_replicas=*/4, /*from_process_group=*/true});
  DistributedSampler from_group(10);
  EXPECT_EQ(from_group.num_replicas(), 4);
  EXPECT_EQ(from_group.rank(), 2);
  EXPECT_EQ(
      from_group.epoch_indices(),
      DistributedSampler(10, explicit_options(4, 2)).epoch_indices());

  DistributedSampler rank_given(10, DistributedSamplerOptions().rank(1));
  EXPECT_EQ(rank_given.num_replicas(), 4);
  EXPECT_EQ(rank_given.rank(), 1);

  DistributedSampler both_given(10, explicit_options(2, 1));
  EXPECT_EQ(both_given.num_replicas(), 2);
  EXPECT_EQ(both_given.rank(), 1);

  EXPECT_EQ(
      error_of([] {
        DistributedSampler(10, DistributedSamplerOptions().num_replicas(2));
      }),
      "DistributedSampler: rank 2 is out of range for num_replicas 2 "
      "(expected 0 <= rank < num_replicas; rank came from the default "
      "process group)");
}

// ---- The set_epoch warning -------------------------------------------------

constexpr const char* kWarning =
    "the same epoch as the previous pass, so it sees the same shuffled order";

TEST_F(DistributedSamplerTest, WarnsOnceWhenAnEpochRepeats) {
  DistributedSampler sampler(10, explicit_options(2, 0));
  ::testing::internal::CaptureStderr();
  for (int pass = 0; pass < 3; ++pass) {
    sampler.reset();
    drain(sampler, 4);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, kWarning), 1u) << err;
  EXPECT_NE(err.find("Call set_epoch(epoch) before each epoch"), std::string::npos)
      << err;
}

TEST_F(DistributedSamplerTest, WarnsOnceThroughADataLoader) {
  DistributedSampler sampler(10, explicit_options(2, 1));
  auto loader = torch::data::make_data_loader(
      IndexDataset(10), sampler, torch::data::DataLoaderOptions(3));
  ::testing::internal::CaptureStderr();
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (const auto& batch : *loader) {
      (void)batch;
    }
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, kWarning), 1u) << err;
}

TEST_F(DistributedSamplerTest, NoWarningWhenEpochsAdvanceOrOrderIsFixed) {
  DistributedSampler shuffled(10, explicit_options(2, 0));
  DistributedSampler sequential(10, explicit_options(2, 0).shuffle(false));
  ::testing::internal::CaptureStderr();
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    shuffled.set_epoch(epoch);
    shuffled.reset();
    drain(shuffled, 4);
    sequential.reset();
    drain(sequential, 4);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, kWarning), 0u) << err;
}

} // namespace
} // namespace ddp
