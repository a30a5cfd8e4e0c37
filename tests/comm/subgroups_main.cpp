// Subgroups (ddp::new_group, new_subgroups): collectives on the subsets of
// two partitions of the world and on overlapping groups, the non-member
// handle, rank translations, bad arguments and mismatched calls, two
// independent DistributedDataParallel replica groups in one job (each
// against one process trained on its own data), and destroying and
// re-creating groups.
//
// Usage:
//   build/ddprun --nproc-per-node 4 build/tests/subgroups_main [OUT_PREFIX]
//   DDP_BACKEND=mpi mpirun -np 4 build/tests/subgroups_main
// prints one line per case on each rank, e.g.
//   [rank 3]: [ok] collectives on {0, 1}, {2, 3} (new_subgroups(2)): group 2, rank 1 of 2
// and a summary; exits 1 if a case failed. Alone (no launcher) it is a
// world of 1, where the cases that need several ranks shrink to one group.
//
// Every expected value is in closed form over the group's global ranks;
// the DDP reference trains one process on the group's whole batch. With
// OUT_PREFIX, each replica group's rank 0 also writes its final parameters
// to OUT_PREFIX.group<g>.txt, which tests/comm/pytorch_subgroups.py
// compares with PyTorch's DDP over torch.distributed.new_group.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

using ddp_test::Report;

// The number the next new_group call gets on every rank; see
// ddp::new_group (numbers start at 1 and are never reused).
int next_group_number = 1;

// Where the replica groups write their final parameters; empty: nowhere.
std::string out_prefix;

std::string join(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text;
}

std::string braces(const std::vector<int>& ranks) {
  return "{" + join(ranks) + "}";
}

// The message of the exception of type E that `fn` throws; `thrown` says
// whether it threw one.
template <typename E>
std::string message_of(const std::function<void()>& fn, bool& thrown) {
  thrown = false;
  try {
    fn();
  } catch (const E& e) {
    thrown = true;
    return e.what();
  }
  return "";
}

// Records that `fn` throws E with `expected` in its message.
template <typename E>
void expect_throws(Report& report, const std::function<void()>& fn, const std::string& expected,
                   const std::string& what, bool show = false) {
  bool thrown = false;
  const std::string message = message_of<E>(fn, thrown);
  if (show && thrown) {
    report.note(what + " says \"" + message.substr(0, message.find('\n')) + "\"");
  }
  report.expect(thrown, what + ": no exception of the expected type");
  report.expect(!thrown || message.find(expected) != std::string::npos,
                what + ": the message lacks '" + expected + "': " + message);
}

bool all_equal(const torch::Tensor& t, double value) {
  return t.numel() == 0 || (t.to(torch::kDouble) == value).all().item<bool>();
}

// Collectives on a group this rank belongs to: every result is checked
// against the closed form over its global ranks.
void check_member(Report& report, const std::shared_ptr<ddp::ProcessGroup>& group,
                  const std::vector<int>& ranks) {
  const int me = ddp::default_process_group()->rank();
  const int index = static_cast<int>(std::find(ranks.begin(), ranks.end(), me) - ranks.begin());
  report.expect(ddp::is_member(group), "is_member is false for a member");
  report.expect(group->rank() == index && group->size() == static_cast<int>(ranks.size()),
                "rank " + std::to_string(group->rank()) + " of " + std::to_string(group->size()) +
                    ", expected " + std::to_string(index) + " of " + std::to_string(ranks.size()));
  report.expect(ddp::group_ranks(group) == ranks, "group_ranks gives " + join(ddp::group_ranks(group)));
  for (int r = 0; r < group->size(); ++r) {
    report.expect(ddp::global_rank(group, r) == ranks[r] && ddp::group_rank(group, ranks[r]) == r,
                  "global_rank/group_rank disagree at group rank " + std::to_string(r));
  }
  double sum = 0;
  for (int r : ranks) {
    sum += r + 1;
  }
  for (int64_t numel : {0, 1, 7, 1000}) {
    auto t = torch::full({numel}, static_cast<float>(me + 1));
    group->allreduce(t)->wait();
    report.expect(all_equal(t, sum), "allreduce of " + std::to_string(numel) +
                                         " elements: expected the sum " + std::to_string(sum));
  }
  auto highest = torch::full({3}, static_cast<int64_t>(me));
  group->allreduce(highest, {ddp::ReduceOp::kMax})->wait();
  report.expect(all_equal(highest, ranks.back()), "allreduce MAX is not the largest member");
  const int root = group->size() - 1;
  auto b = torch::full({5}, static_cast<double>(me * 10 + 3));
  ddp::BroadcastOptions broadcast_options;
  broadcast_options.root_rank = root;
  group->broadcast(b, broadcast_options)->wait();
  report.expect(all_equal(b, ranks[root] * 10 + 3), "broadcast from group rank " +
                                                       std::to_string(root) + " gave " +
                                                       std::to_string(b[0].item<double>()));
  std::vector<torch::Tensor> gathered;
  for (int r = 0; r < group->size(); ++r) {
    gathered.push_back(torch::zeros({3}));
  }
  group->allgather(gathered, torch::full({3}, me + 0.5f))->wait();
  for (int r = 0; r < group->size(); ++r) {
    report.expect(all_equal(gathered[r], ranks[r] + 0.5),
                  "allgather: slot " + std::to_string(r) + " is not global rank " +
                      std::to_string(ranks[r]) + "'s");
  }
  group->barrier()->wait();
}

// The handle of a group this rank is outside of.
void check_non_member(Report& report, const std::shared_ptr<ddp::ProcessGroup>& group,
                      const std::vector<int>& ranks, int number) {
  const auto world = ddp::default_process_group();
  report.expect(!ddp::is_member(group) && group->rank() == -1, "a non-member's handle has rank " +
                                                                   std::to_string(group->rank()));
  report.expect(group->size() == static_cast<int>(ranks.size()), "a non-member's handle has size " +
                                                                     std::to_string(group->size()));
  report.expect(ddp::group_ranks(group) == ranks, "a non-member's group_ranks is wrong");
  const std::string expected = "[rank " + std::to_string(world->rank()) + "/" +
                               std::to_string(world->size()) + "] allreduce: this rank is not a "
                               "member of group " + std::to_string(number) + " (ranks " +
                               join(ranks) + ")";
  auto t = torch::ones({2});
  expect_throws<c10::Error>(report, [&] { group->allreduce(t); }, expected, "allreduce on it",
                            number == 1);
  expect_throws<c10::Error>(report, [&] { group->barrier(); }, "barrier: this rank is not a member",
                            "barrier on it");
  expect_throws<c10::Error>(report, [&] { ddp::group_rank(group, world->rank()); },
                            "is not a member of the group", "group_rank of this rank");
}

// Every rank makes the groups `partition` in order, then checks the one it
// belongs to and the handles of the others.
void collectives_on(Report& report, const std::string& name,
                    const std::vector<std::vector<int>>& partition,
                    const std::vector<std::shared_ptr<ddp::ProcessGroup>>& made) {
  report.begin_case("collectives on " + name);
  const int me = ddp::default_process_group()->rank();
  for (size_t k = 0; k < partition.size(); ++k) {
    const int number = next_group_number++;
    const auto& ranks = partition[k];
    if (std::find(ranks.begin(), ranks.end(), me) != ranks.end()) {
      check_member(report, made[k], ranks);
      report.note("group " + std::to_string(number) + ", rank " +
                  std::to_string(made[k]->rank()) + " of " + std::to_string(made[k]->size()));
    } else {
      check_non_member(report, made[k], ranks, number);
    }
  }
  report.end_case();
}

std::vector<std::shared_ptr<ddp::ProcessGroup>> make_groups(
    const std::vector<std::vector<int>>& partition) {
  std::vector<std::shared_ptr<ddp::ProcessGroup>> groups;
  for (auto ranks : partition) {
    std::reverse(ranks.begin(), ranks.end()); // any order: the group sorts them
    groups.push_back(ddp::new_group(ranks));
  }
  return groups;
}

void partitions(Report& report) {
  const int world = ddp::default_process_group()->size();
  if (world == 4) {
    const auto split = ddp::new_subgroups(2);
    collectives_on(report, "{0, 1}, {2, 3} (new_subgroups(2))", {{0, 1}, {2, 3}}, split.all);
    report.expect(split.mine == split.all[ddp::default_process_group()->rank() / 2],
                  "new_subgroups: mine is not this rank's group");
    const std::vector<std::vector<int>> strided = {{0, 2}, {1, 3}};
    collectives_on(report, "{0, 2}, {1, 3} (new_group)", strided, make_groups(strided));
    // By enumeration, one list leaving ranks out: rank 3 belongs to none.
    const auto listed = ddp::new_subgroups_by_enumeration({{2, 0}, {1}}); // any order in a list
    collectives_on(report, "{0, 2}, {1} (new_subgroups_by_enumeration)", {{0, 2}, {1}}, listed.all);
    const int me = ddp::default_process_group()->rank();
    report.expect(listed.mine == (me == 3 ? nullptr : listed.all[me % 2 == 0 ? 0 : 1]),
                  "new_subgroups_by_enumeration: mine is not this rank's group");
    // Ranks 1 and 2 belong to both: each runs them in the same order.
    const std::vector<std::vector<int>> overlapping = {{0, 1, 2}, {1, 2, 3}};
    collectives_on(report, "overlapping {0, 1, 2}, {1, 2, 3}", overlapping,
                   make_groups(overlapping));
  } else {
    std::vector<int> all(static_cast<size_t>(world));
    std::iota(all.begin(), all.end(), 0);
    collectives_on(report, "the whole world " + braces(all), {all}, make_groups({all}));
  }
}

void bad_arguments(Report& report) {
  report.begin_case("bad arguments are clear errors");
  const int world = ddp::default_process_group()->size();
  const std::string w = std::to_string(world);
  expect_throws<c10::Error>(report, [] { ddp::new_group({}); }, "new_group: ranks is empty",
                            "empty ranks");
  expect_throws<c10::Error>(report, [world] { ddp::new_group({0, world}); },
                            "rank " + w + " is outside the default group's ranks [0, " + w + ")",
                            "out of range");
  expect_throws<c10::Error>(report, [] { ddp::new_group({-1}); }, "rank -1 is outside",
                            "negative rank");
  expect_throws<c10::Error>(report, [] { ddp::new_group({0, 0}); },
                            "rank 0 appears more than once (got ranks 0, 0)", "duplicate", true);
  expect_throws<c10::Error>(report, [world] { ddp::new_subgroups(world + 1); },
                            "must be positive and divide the world size", "new_subgroups");
  expect_throws<c10::Error>(report, [] { ddp::new_subgroups_by_enumeration({}); },
                            "new_subgroups_by_enumeration: ranks_per_subgroup is empty", "empty enumeration");
  expect_throws<c10::Error>(report, [world] { ddp::new_subgroups_by_enumeration({{0}, {world - 1, 0}}); },
                            "rank 0 appears in both subgroup 0 (0) and subgroup 1 (" + std::to_string(world - 1) +
                                ", 0)",
                            "overlapping enumeration");
  expect_throws<c10::Error>(report, [] { ddp::new_group({0}, ddp::NewGroupOptions().timeout(
                                                              std::chrono::milliseconds(0))); },
                            "timeout must be positive", "zero timeout");
  expect_throws<c10::Error>(report, [] { ddp::destroy_process_group(ddp::default_process_group()); },
                            "this is the default group", "destroy_process_group(default group)");
  // None of these took a group number: the next group is still numbered
  // next_group_number on every rank (the following cases check it).
  report.end_case();
}

// Ranks that pass different ranks for the same call fail, naming the group,
// instead of hanging.
void mismatched_calls(Report& report) {
  const auto world = ddp::default_process_group();
  if (world->size() != 4) {
    return;
  }
  report.begin_case("mismatched calls fail on every rank");
  const int number = next_group_number++;
  const std::vector<int> ranks = world->rank() < 2 ? std::vector<int>{0, 1, 2}
                                                   : std::vector<int>{1, 2, 3};
  expect_throws<c10::Error>(report, [&] { ddp::new_group(ranks); },
                            "new_group call number " + std::to_string(number), "new_group", true);
  report.end_case();
}

// A member that never makes the call: the others time out naming it, not
// hang. Gloo only: on MPI the check is a collective of the default group,
// whose timeout breaks it (as any MPI timeout does).
void missing_member(Report& report) {
  const auto world = ddp::default_process_group();
  if (world->size() != 4 || world->backend_name() == "mpi") {
    return;
  }
  report.begin_case("a member that does not call times out, named");
  const int number = next_group_number++;
  const auto timeout = std::chrono::milliseconds(1500);
  if (world->rank() != 3) {
    const auto start = std::chrono::steady_clock::now();
    if (world->rank() == 2) {
      expect_throws<ddp::TimeoutError>(
          report, [&] { ddp::new_group({2, 3}, ddp::NewGroupOptions().timeout(timeout)); },
          "group " + std::to_string(number) + " (ranks 2, 3): member rank(s) 3 did not reach",
          "new_group", true);
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
      report.expect(waited < timeout + std::chrono::seconds(5),
                    "took " + std::to_string(waited.count()) + " ms");
      report.note("timed out after " + std::to_string(waited.count()) + " ms");
    } else {
      report.expect(!ddp::is_member(ddp::new_group({2, 3}, ddp::NewGroupOptions().timeout(timeout))),
                    "a non-member got a member's group");
    }
  }
  world->barrier()->wait();
  if (world->rank() == 3) {
    // Rank 3 skipped call `number`; it takes that number now, alone, so
    // that its later calls are numbered as the others'.
    report.expect(ddp::is_member(ddp::new_group({3})), "the catch-up group");
  }
  report.end_case();
}

// Two replica groups, {even ranks} and {odd ranks}, each training its own
// data with DistributedDataParallel over its subgroup: each must match one
// process trained on its group's whole batch, and the groups must differ.
void replica_groups(Report& report) {
  const auto world = ddp::default_process_group();
  const int me = world->rank();
  std::vector<std::vector<int>> groups;
  if (world->size() % 2 == 0) {
    groups = {{}, {}};
    for (int r = 0; r < world->size(); ++r) {
      groups[r % 2].push_back(r);
    }
  } else {
    groups = {std::vector<int>(static_cast<size_t>(world->size()))};
    std::iota(groups[0].begin(), groups[0].end(), 0);
  }
  report.begin_case("independent DDP replica groups " + braces(groups[0]) +
                    (groups.size() > 1 ? ", " + braces(groups[1]) : std::string()));
  std::vector<std::shared_ptr<ddp::ProcessGroup>> handles;
  for (const auto& ranks : groups) {
    handles.push_back(ddp::new_group(ranks));
    ++next_group_number;
  }
  const size_t g = groups.size() > 1 ? static_cast<size_t>(me % 2) : 0;
  const auto mine = handles[g];
  const auto perturb = [](torch::nn::Module& module, int rank) {
    torch::NoGradGuard no_grad;
    for (auto& p : module.parameters()) {
      p.add_(0.01 * (rank + 1));
    }
  };
  // Different weights on every rank before DDP: construction must copy the
  // group's rank 0, global rank groups[g][0].
  auto net = ddp_test::make_closed_form_mlp();
  perturb(*net, me);
  auto reference = ddp_test::make_closed_form_mlp();
  perturb(*reference, groups[g][0]);
  auto initial = ddp_test::make_closed_form_mlp();
  perturb(*initial, groups[g][0]);

  if (groups.size() > 1) {
    expect_throws<c10::Error>(
        report,
        [&] {
          ddp::DistributedDataParallel other(
              ddp_test::make_closed_form_mlp(),
              ddp::DistributedDataParallelOptions().process_group(handles[1 - g]));
        },
        "is not a member of the process group", "DDP over a non-member handle");
  }
  ddp::DistributedDataParallel model(net, ddp::DistributedDataParallelOptions().process_group(mine));
  const auto at_start = ddp_test::max_parameter_difference(*net, *reference);
  report.expect(at_start.value == 0, "after construction the parameters differ from global rank " +
                                         std::to_string(groups[g][0]) + "'s by " +
                                         Report::format(at_start.value));

  constexpr int kSteps = 5;
  constexpr double kLearningRate = 0.2;
  const int64_t offset = 1000 * static_cast<int64_t>(g); // each group its own data
  ddp::DistributedSampler sampler(
      ddp_test::kGlobalBatch,
      ddp::DistributedSamplerOptions().num_replicas(mine->size()).rank(mine->rank()).shuffle(false));
  std::vector<int64_t> rows;
  for (size_t i : sampler.epoch_indices()) {
    rows.push_back(static_cast<int64_t>(i));
  }
  const auto index = torch::tensor(rows, torch::kLong);
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(kLearningRate));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::samples(offset + step * ddp_test::kGlobalBatch, ddp_test::kGlobalBatch);
    reference_optimizer.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    reference_optimizer.step();
    optimizer.zero_grad();
    torch::mse_loss(model(x.index_select(0, index)), y.index_select(0, index)).backward();
    optimizer.step();
  }
  const auto difference = ddp_test::max_parameter_difference(*net, *reference);
  report.expect_at_most(difference.value, 1e-5, "max |ours - one process| (at " + difference.where + ")");
  const auto moved = ddp_test::max_parameter_difference(*reference, *initial);
  report.expect(moved.value > 1e-3, "training moved the weights by only " + Report::format(moved.value));
  report.expect(model->max_parameter_difference_across_ranks() == 0,
                "the replicas of one group differ");
  if (!out_prefix.empty() && mine->rank() == 0) {
    const std::string path = out_prefix + ".group" + std::to_string(g) + ".txt";
    report.expect(ddp_test::write_state_text(*net, path), "cannot write " + path);
  }
  if (groups.size() > 1) {
    // Over the whole world: the other group trained other data.
    const double across = ddp_test::max_difference_from_rank0(*world, net->parameters());
    report.expect(across > 1e-3, "the two groups ended alike (" + Report::format(across) + ")");
    report.note("groups differ by " + Report::format(across));
  }
  report.end_case();
}

// destroy_process_group(subgroup), then destroy_process_group(), which ends
// every subgroup; after init_process_group again, numbers go on.
void destroy_and_recreate(Report& report) {
  report.begin_case("destroy and re-create");
  const int world_size = ddp::default_process_group()->size();
  std::vector<int> all(static_cast<size_t>(world_size));
  std::iota(all.begin(), all.end(), 0);
  auto one = ddp::new_group(all);
  ++next_group_number;
  ddp::destroy_process_group(one);
  expect_throws<c10::Error>(report, [&] { ddp::group_ranks(one); },
                            "neither the default group nor one that ddp::new_group made",
                            "group_ranks after destroy_process_group(group)");
  ddp::destroy_process_group(one); // a no-op the second time
  one.reset();
  auto kept = ddp::new_group(all);
  ++next_group_number;
  const auto backend_name = ddp::default_process_group()->backend_name();
  ddp::destroy_process_group();
  report.expect(!ddp::is_initialized(), "the default group survived destroy_process_group()");
  expect_throws<c10::Error>(report, [&] { ddp::group_ranks(kept); }, "no default process group",
                            "group_ranks after destroy_process_group()");
  kept.reset();
  ddp::init_process_group();
  const int number = next_group_number++;
  auto again = ddp::new_group(all);
  report.expect(ddp::is_member(again), "not a member after re-init");
  check_member(report, again, all);
  if (world_size > 1) {
    auto alone = ddp::new_group({0});
    const int alone_number = next_group_number++;
    if (ddp::default_process_group()->rank() != 0) {
      check_non_member(report, alone, {0}, alone_number);
    }
  }
  report.note("group " + std::to_string(number) + " after re-init (" + backend_name + ")");
  report.end_case();
}

// MPI's default group has no store: a Gloo subgroup cannot meet.
void mpi_needs_mpi(Report& report) {
  if (ddp::default_process_group()->backend_name() != "mpi") {
    return;
  }
  report.begin_case("a Gloo subgroup of an MPI job is refused");
  expect_throws<c10::Error>(
      report, [] { ddp::new_group({0}, ddp::NewGroupOptions().backend(ddp::Backend::kGloo)); },
      "a gloo subgroup meets through the default group's store", "new_group");
  report.end_case();
}

// use_local_synchronization: only the members call, twice for the same
// ranks too; the calls take no group number (the later cases check the
// numbering). Refused on MPI.
void local_synchronization(Report& report) {
  const auto world = ddp::default_process_group();
  if (world->size() != 4) {
    return;
  }
  report.begin_case("use_local_synchronization: only the members call");
  const auto local = ddp::NewGroupOptions().use_local_synchronization(true);
  if (world->backend_name() == "mpi") {
    expect_throws<c10::Error>(report, [&] { ddp::new_group({0, 1}, local); },
                              "use_local_synchronization is not offered on MPI", "new_group");
    report.end_case();
    return;
  }
  const int me = world->rank();
  const auto sum_over = [&](const std::shared_ptr<ddp::ProcessGroup>& group) {
    auto t = torch::full({1}, 1.0 * me);
    group->allreduce(t)->wait();
    return t.item<double>();
  };
  // The sums, which pytorch_subgroups.py compares with PyTorch's (>= 2.0)
  // for the same calls.
  std::vector<double> sums;
  auto half = ddp::new_group(me < 2 ? std::vector<int>{0, 1} : std::vector<int>{3, 2}, local);
  report.expect(ddp::is_member(half) && half->size() == 2, "not a member of its half");
  sums.push_back(sum_over(half));
  report.expect(sums.back() == (me < 2 ? 1 : 5), "the half's allreduce");
  if (me == 1 || me == 2) {
    auto first = ddp::new_group({1, 2}, local);
    auto second = ddp::new_group({2, 1}, local);
    sums.push_back(sum_over(second));
    sums.push_back(sum_over(first));
    report.expect(sums[1] == 3 && sums[2] == 3, "the middle groups' allreduces");
    report.expect(ddp::group_ranks(first) == std::vector<int>{1, 2}, "the middle group's ranks");
  } else {
    auto outside = ddp::new_group({1, 2}, local); // returns at once
    report.expect(!ddp::is_member(outside), "a non-member got a member's group");
    expect_throws<c10::Error>(report, [&] { outside->barrier(); }, "this rank is not a member of group local",
                              "non-member barrier");
  }
  if (!out_prefix.empty()) {
    std::ofstream out(out_prefix + ".local_sync.rank" + std::to_string(me) + ".txt");
    for (double sum : sums) {
      out << sum << "\n";
    }
  }
  world->barrier()->wait();
  report.end_case();
}

} // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  if (argc > 1) {
    out_prefix = argv[1];
  }
  try {
    auto world = ddp::init_process_group();
    Report report("subgroups_main (rank " + std::to_string(world->rank()) + " of " +
                  std::to_string(world->size()) + ", " + world->backend_name() + ")");
    partitions(report);
    bad_arguments(report);
    mismatched_calls(report);
    replica_groups(report);
    mpi_needs_mpi(report);
    local_synchronization(report);
    missing_member(report);
    destroy_and_recreate(report);
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "subgroups_main: %s\n", e.what());
    return 1;
  }
}
