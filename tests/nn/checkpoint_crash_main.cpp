// Checkpoints that survive a crash: the program that checkpoint_crash_test
// runs under ddprun, in three modes.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/ddp_checkpoint_crash_main save DIR POINT
//     trains 2 steps and saves DIR/ckpt.pt ("the old save"), trains 2 more and
//     saves again ("the new save"), with rank 0 killing itself at POINT of
//     that second save (DDP_TEST_CHECKPOINT_CRASH_AT; "none": no crash).
//   build/ddprun --nproc-per-node 2 build/tests/ddp_checkpoint_crash_main verify DIR old|new
//     loads DIR/ckpt.pt with its optimizer state into fresh replicas, checks
//     that they hold the old or the new save as expected, and that training
//     on from them matches an uninterrupted run (the optimizer state is the
//     one of the same save); then saves again and checks that nothing but
//     ckpt.pt and ckpt.pt.optimizer is left in DIR.
//   build/ddprun --nproc-per-node 2 build/tests/ddp_checkpoint_crash_main errors DIR
//     mismatched, incomplete and old-format pairs, and the removal of a
//     killed save's files.
// Each rank prints one line per case ("[ok] ..." or "[FAILED] ...") and a
// summary; exits 1 if a case failed.

#include <torch/torch.h>

#include <dirent.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

using ddp_test::Report;

constexpr double kLearningRate = 0.2;
// The old save is taken after kOldSteps steps, the new one after kNewSteps.
constexpr int kOldSteps = 2;
constexpr int kNewSteps = 4;
// Training on from a loaded pair must end where the uninterrupted run ends:
// the same operations on the same values. A momentum buffer of another save
// would be off by far more (momentum 0.9, learning rate 0.2).
constexpr double kTolerance = 1e-6;

// A replica and its optimizer.
struct Replica {
  torch::nn::Sequential net;
  ddp::DistributedDataParallel model;
  torch::optim::SGD optimizer;
};

// Closed-form parameters when `closed_form`, else random ones that differ
// per rank (what a load must overwrite).
Replica make_replica(bool closed_form, int rank) {
  torch::manual_seed(77 + rank);
  auto net = ddp_test::make_bn_mlp();
  if (closed_form) {
    ddp_test::init_closed_form(*net);
  }
  ddp::DistributedDataParallel model(net);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(kLearningRate).momentum(0.9));
  return Replica{net, model, std::move(optimizer)};
}

void train(Replica& replica, int from_step, int to_step) {
  auto group = ddp::default_process_group();
  for (int step = from_step; step < to_step; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, group->rank(), group->size());
    replica.optimizer.zero_grad();
    torch::mse_loss(replica.model(x), y).backward();
    replica.optimizer.step();
  }
}

std::vector<torch::Tensor> parameters_copy(const torch::nn::Module& module) {
  std::vector<torch::Tensor> copy;
  for (const auto& p : module.parameters()) {
    copy.push_back(p.detach().clone());
  }
  return copy;
}

double max_difference(const torch::nn::Module& module, const std::vector<torch::Tensor>& values) {
  const auto mine = module.parameters();
  double worst = 0;
  for (size_t i = 0; i < mine.size() && i < values.size(); ++i) {
    worst = std::max(worst, (mine[i].detach() - values[i]).abs().max().item<double>());
  }
  return mine.size() == values.size() ? worst : 1e30;
}

std::set<std::string> list_directory(const std::string& dir) {
  std::set<std::string> names;
  if (DIR* listing = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") {
        names.insert(name);
      }
    }
    ::closedir(listing);
  }
  return names;
}

std::string joined(const std::set<std::string>& names) {
  std::string text;
  for (const auto& name : names) {
    text += (text.empty() ? "" : " ") + name;
  }
  return text;
}

bool file_exists(const std::string& path) {
  return std::ifstream(path).good();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// The message of the c10::Error that `load` throws, or "" when it throws none.
template <typename Load>
std::string error_of(Load&& load) {
  try {
    load();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- save --------------------------------------------------------------------------

int save_mode(const std::string& dir, const std::string& point) {
  auto group = ddp::default_process_group();
  Replica replica = make_replica(/*closed_form=*/true, group->rank());
  train(replica, 0, kOldSteps);
  ddp::save_checkpoint(replica.model, replica.optimizer, dir + "/ckpt.pt");
  train(replica, kOldSteps, kNewSteps);
  if (point != "none") {
    ::setenv("DDP_TEST_CHECKPOINT_CRASH_AT", point.c_str(), 1); // read by rank 0, which writes
  }
  ddp::save_checkpoint(replica.model, replica.optimizer, dir + "/ckpt.pt");
  std::printf("saved twice without a crash\n");
  return 0;
}

// ---- verify -------------------------------------------------------------------------

int verify_mode(const std::string& dir, const std::string& expected) {
  auto group = ddp::default_process_group();
  const int rank = group->rank();
  Report report("ddp_checkpoint_crash_main verify (rank " + std::to_string(rank) + ")");
  const std::string path = dir + "/ckpt.pt";

  // The uninterrupted run, and its parameters after each save and one step on.
  Replica straight = make_replica(/*closed_form=*/true, rank);
  train(straight, 0, kOldSteps);
  const auto old_save = parameters_copy(*straight.net);
  train(straight, kOldSteps, kNewSteps);
  const auto new_save = parameters_copy(*straight.net);
  train(straight, kNewSteps, kNewSteps + 1);
  const auto after_new = parameters_copy(*straight.net);

  report.begin_case("load the pair that the crash left, expecting the " + expected + " save");
  Replica loaded = make_replica(/*closed_form=*/false, rank);
  const std::string error =
      error_of([&] { ddp::load_checkpoint(loaded.model, loaded.optimizer, path); });
  report.expect(error.empty(), "load_checkpoint failed: " + error);
  const bool is_old = max_difference(*loaded.net, old_save) == 0;
  const bool is_new = max_difference(*loaded.net, new_save) == 0;
  const std::string found = is_old ? "old" : is_new ? "new" : "neither";
  report.expect(found == expected, "loaded the " + found + " save, expected the " + expected);
  report.note("loaded the " + found + " save");
  // Train on to one step after the new save: the optimizer state must be the
  // one saved with these parameters.
  train(loaded, is_old ? kOldSteps : kNewSteps, kNewSteps + 1);
  report.expect_at_most(max_difference(*loaded.net, after_new), kTolerance,
                        "trained on from the loaded pair, max |loaded - uninterrupted|");
  report.end_case();

  report.begin_case("the next save removes what the crash left");
  ddp::save_checkpoint(loaded.model, loaded.optimizer, path);
  if (rank == 0) {
    const auto names = list_directory(dir);
    report.expect(names == std::set<std::string>{"ckpt.pt", "ckpt.pt.optimizer"},
                  "after the next save the directory holds: " + joined(names));
  }
  report.end_case();
  return report.finish();
}

// ---- errors -------------------------------------------------------------------------

int errors_mode(const std::string& dir) {
  auto group = ddp::default_process_group();
  const int rank = group->rank();
  const std::string who = "[rank " + std::to_string(rank) + "/" + std::to_string(group->size()) +
                          "] load_checkpoint: ";
  Report report("ddp_checkpoint_crash_main errors (rank " + std::to_string(rank) + ")");
  const std::string path = dir + "/ckpt.pt";
  const std::string optimizer_path = path + ".optimizer";

  Replica replica = make_replica(/*closed_form=*/true, rank);
  train(replica, 0, kOldSteps);
  ddp::save_checkpoint(replica.model, replica.optimizer, path);
  const std::string old_optimizer_bytes = rank == 0 ? read_file(optimizer_path) : "";
  train(replica, kOldSteps, kNewSteps);
  ddp::save_checkpoint(replica.model, replica.optimizer, path);
  const auto saved = parameters_copy(*replica.net);

  report.begin_case("an optimizer file of another save is refused");
  if (rank == 0) {
    write_file(optimizer_path, old_optimizer_bytes);
  }
  group->barrier()->wait();
  {
    Replica fresh = make_replica(/*closed_form=*/false, rank);
    const auto before = parameters_copy(*fresh.net);
    const std::string error =
        error_of([&] { ddp::load_checkpoint(fresh.model, fresh.optimizer, path); });
    report.expect(contains(error, who + "'" + optimizer_path + "' does not belong to '" + path +
                                      "': expected the optimizer state written by the same save"),
                  "unexpected error: '" + error + "'");
    report.expect(max_difference(*fresh.net, before) == 0,
                  "the refused load changed the model's parameters");
    report.note(error.substr(0, error.find(" (a file")));
    // The model alone still loads.
    const std::string model_error = error_of([&] { ddp::load_checkpoint(fresh.model, path); });
    report.expect(model_error.empty(), "load_checkpoint(model, path) failed: " + model_error);
    report.expect(max_difference(*fresh.net, saved) == 0, "the model alone did not load");
  }
  report.end_case();

  report.begin_case("a missing optimizer file is refused");
  group->barrier()->wait(); // every rank has read the file before it goes
  if (rank == 0) {
    std::remove(optimizer_path.c_str());
  }
  group->barrier()->wait();
  {
    Replica fresh = make_replica(/*closed_form=*/false, rank);
    const std::string error =
        error_of([&] { ddp::load_checkpoint(fresh.model, fresh.optimizer, path); });
    report.expect(contains(error, who + "the optimizer state of '" + path +
                                      "' is missing: expected '" + optimizer_path + "'"),
                  "unexpected error: '" + error + "'");
  }
  // Every rank has looked before rank 0's next save writes the same
  // optimizer state (same checksum) back.
  group->barrier()->wait();
  report.end_case();

  report.begin_case("a save without an optimizer replaces the pair, and says so when loaded");
  ddp::save_checkpoint(replica.model, replica.optimizer, path);
  ddp::save_checkpoint(replica.model, path);
  report.expect(!file_exists(optimizer_path),
                "the optimizer file of the earlier save is still there");
  {
    Replica fresh = make_replica(/*closed_form=*/false, rank);
    const std::string error =
        error_of([&] { ddp::load_checkpoint(fresh.model, fresh.optimizer, path); });
    report.expect(contains(error, who + "'" + path + "' holds no optimizer state"),
                  "unexpected error: '" + error + "'");
    const std::string model_error = error_of([&] { ddp::load_checkpoint(fresh.model, path); });
    report.expect(model_error.empty(), "load_checkpoint(model, path) failed: " + model_error);
    report.expect(max_difference(*fresh.net, saved) == 0, "the model did not load");
  }
  report.end_case();

  report.begin_case("files of an older ddp (torch::save of the module and optimizer) load");
  const std::string old_path = dir + "/old.pt";
  const std::string single_path = dir + "/single.pt";
  group->barrier()->wait();
  if (rank == 0) {
    torch::save(replica.net, old_path);
    torch::save(replica.optimizer, old_path + ".optimizer");
    torch::save(replica.net, single_path);
  }
  group->barrier()->wait();
  {
    Replica fresh = make_replica(/*closed_form=*/false, rank);
    const std::string error =
        error_of([&] { ddp::load_checkpoint(fresh.model, fresh.optimizer, old_path); });
    report.expect(error.empty(), "load_checkpoint of the old pair failed: " + error);
    report.expect(max_difference(*fresh.net, saved) == 0, "the old pair's model did not load");
    // The momentum came back too: one more step on both ends equal.
    train(fresh, kNewSteps, kNewSteps + 1);
    Replica reference = make_replica(/*closed_form=*/true, rank);
    train(reference, 0, kNewSteps + 1);
    report.expect_at_most(max_difference(*fresh.net, parameters_copy(*reference.net)), kTolerance,
                          "one step on from the old pair, max |loaded - uninterrupted|");

    Replica single = make_replica(/*closed_form=*/false, rank);
    const std::string single_error =
        error_of([&] { ddp::load_checkpoint(single.model, single_path); });
    report.expect(single_error.empty(), "load_checkpoint of a single old file failed: " +
                                            single_error);
    report.expect(max_difference(*single.net, saved) == 0, "the single old file did not load");
  }
  report.end_case();

  report.begin_case("a save removes the files of killed saves, and only those");
  const std::vector<std::string> killed = {"ckpt.pt.tmp.4242", "ckpt.pt.optimizer.tmp.4243",
                                           "ckpt.pt.optimizer.0123456789abcdef"};
  const std::vector<std::string> unrelated = {"ckpt.pt.tmp.notes", "ckpt.pt.optimizer.old",
                                              "other.pt.tmp.99"};
  group->barrier()->wait();
  if (rank == 0) {
    for (const auto& name : killed) {
      write_file(dir + "/" + name, "left by a killed save");
    }
    for (const auto& name : unrelated) {
      write_file(dir + "/" + name, "not ours");
    }
  }
  ddp::save_checkpoint(replica.model, replica.optimizer, path);
  if (rank == 0) {
    const auto names = list_directory(dir);
    for (const auto& name : killed) {
      report.expect(names.count(name) == 0, name + " is still there after a save");
    }
    for (const auto& name : unrelated) {
      report.expect(names.count(name) == 1, name + " was removed by a save");
    }
  }
  report.end_case();

  report.begin_case("plain LibTorch reads both files of a pair");
  if (rank == 0) {
    auto plain_net = ddp_test::make_bn_mlp();
    torch::optim::SGD plain_optimizer(plain_net->parameters(),
                                      torch::optim::SGDOptions(kLearningRate).momentum(0.9));
    try {
      torch::load(plain_net, path);
      torch::load(plain_optimizer, optimizer_path);
      report.expect(max_difference(*plain_net, saved) == 0, "torch::load gave other parameters");
    } catch (const std::exception& e) {
      report.expect(false, std::string("torch::load failed: ") + e.what());
    }
  }
  report.end_case();
  return report.finish();
}

} // namespace

int main(int argc, char** argv) {
  const std::string mode = argc >= 2 ? argv[1] : "";
  if (!((mode == "save" || mode == "verify") && argc == 4) && !(mode == "errors" && argc == 3)) {
    std::fprintf(stderr,
                 "usage: ddp_checkpoint_crash_main save DIR POINT | verify DIR old|new | "
                 "errors DIR\n");
    return 2;
  }
  try {
    ddp::init_process_group();
    int status = 0;
    if (mode == "save") {
      status = save_mode(argv[2], argv[3]);
    } else if (mode == "verify") {
      status = verify_mode(argv[2], argv[3]);
    } else {
      status = errors_mode(argv[2]);
    }
    ddp::destroy_process_group();
    return status;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "ddp_checkpoint_crash_main: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_checkpoint_crash_main: %s\n", e.what());
    return 1;
  }
}
