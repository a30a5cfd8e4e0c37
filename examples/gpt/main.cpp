// gpt_train: a decoder-only transformer (examples/gpt/gpt.h) trained on the
// bytes of a text corpus by several ranks, with DistributedDataParallel,
// ZeroRedundancyOptimizer or FullyShardedDataParallel, optionally with
// activation checkpointing; progress with tokens/s, a checkpoint at the
// end in PyTorch's formats, and a sample generated at the end.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/examples/gpt_train --parallel fsdp --activation-checkpointing
// prints, on rank 0:
//   [rank 0]: gpt_train: 2 ranks on cpu (gloo); fsdp (kFullShard), activation checkpointing
//   [rank 0]: gpt_train: 4 layers, 4 heads, 128 wide, block 128: 0.86M parameters; corpus /usr/share/common-licenses (14 files, 262145 bytes)
//   [rank 0]: step 10/100  loss 2.9512  14823 tokens/s  peak RSS 312 MB
//   ...
//   [rank 0]: sample: "the Program ..."
// The corpus is the license texts every Debian system ships
// (/usr/share/common-licenses, package base-files), read as bytes (the
// tokenizer: one token per byte, 256 in all); --data names another file or
// directory. --help lists every flag. gpt.py is the same model in PyTorch
// 2.11 (FSDP2 and checkpoint_wrapper), the reference for results and speed.

#include <torch/torch.h>

#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "../common/checksum.h"
#include "gpt.h"
#include "snapshots.h"

namespace {

// ---- Flags ---------------------------------------------------------------------------

struct FlagError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Flags {
  std::string parallel = "fsdp";
  std::string strategy = "full";
  bool activation_checkpointing = false;
  bool meta_init = false;
  bool cpu_offload = false;
  std::string mixed_precision = "none";
  int64_t layers = 4, heads = 4, embd = 128, block = 128, batch = 8, steps = 100;
  double lr = 6e-4, dropout = 0.0, clip = 1.0;
  uint64_t seed = 1337;
  std::string data = "/usr/share/common-licenses";
  int64_t log_every = 10;
  std::string save_initial, losses, checkpoint, checkpoint_format = "dcp";
  bool resume = false;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int64_t sample = 200;
  std::string prompt = "The ";
  int threads = 1;
  bool report = false;
};

const char* kHelp = R"(gpt_train: trains a GPT on a text corpus with several ranks.
  --parallel ddp|zero|fsdp        DistributedDataParallel, ZeroRedundancyOptimizer (AdamW's
                                  state sharded) or FullyShardedDataParallel (default fsdp)
  --strategy full|grad-op|no-shard|hybrid   FSDP's sharding strategy (default full)
  --activation-checkpointing      recompute each block's activations in backward
  --meta-init                     build the blocks one at a time under FSDP, each rank keeping
                                  its shards only (ddp::deferred_unit); the same values as without
  --cpu-offload                   FSDP's shards, gradients and AdamW's state in pinned host
                                  memory, the step on the CPU (for a model on a GPU)
  --mixed-precision none|bf16     FSDP's compute dtype (default none: float32)
  --layers N --heads N --embd N   the model (default 4, 4, 128)
  --block N                       the sequence length (default 128)
  --batch N                       sequences per rank and step (default 8)
  --steps N                       optimizer steps (default 100)
  --lr F --dropout F --clip F     AdamW's learning rate (6e-4), dropout (0), gradient clipping (1; 0: none)
  --seed N                        the initial weights' seed, the same on every rank (1337)
  --data PATH                     a file, or a directory whose files are read in name order
                                  (default /usr/share/common-licenses)
  --log-every N                   a progress line every N steps (10)
  --save-initial FILE             rank 0 writes the initial weights (torch.save format)
  --losses FILE                   rank 0 writes each step's loss (the mean over every rank's batch)
  --checkpoint PATH               save the model and optimizer at the end
  --checkpoint-format dcp|torch|safetensors   (default dcp; safetensors: the model only)
  --resume                        load --checkpoint first (dcp or torch)
  --checkpoint-dir DIR            resumable training: start from the checkpoint DIR/latest names,
                                  if any, and save DCP checkpoints there (DIR/step-S, then
                                  DIR/latest names it) after the last step and every
                                  --checkpoint-every N steps (default 0: the last step only),
                                  and print the final weights' checksum;
                                  a resumed run ends bit for bit where an uninterrupted one does
  --sample N --prompt TEXT        bytes generated at the end by rank 0 (200, "The ")
  --threads N                     intra-op threads per rank (1)
  --report                        every rank prints a line of figures at the end, for
                                  bench/run_gpt_bench.py: "gpt_result key=value ..."
)";

Flags parse(int argc, char** argv) {
  Flags f;
  std::map<std::string, std::string*> strings{{"--parallel", &f.parallel},
                                              {"--strategy", &f.strategy},
                                              {"--mixed-precision", &f.mixed_precision},
                                              {"--data", &f.data},
                                              {"--save-initial", &f.save_initial},
                                              {"--losses", &f.losses},
                                              {"--checkpoint", &f.checkpoint},
                                              {"--checkpoint-format", &f.checkpoint_format},
                                              {"--checkpoint-dir", &f.checkpoint_dir},
                                              {"--prompt", &f.prompt}};
  std::map<std::string, int64_t*> ints{{"--layers", &f.layers}, {"--heads", &f.heads},   {"--embd", &f.embd},
                                       {"--block", &f.block},   {"--batch", &f.batch},   {"--steps", &f.steps},
                                       {"--log-every", &f.log_every}, {"--sample", &f.sample},
                                       {"--checkpoint-every", &f.checkpoint_every}};
  std::map<std::string, double*> doubles{{"--lr", &f.lr}, {"--dropout", &f.dropout}, {"--clip", &f.clip}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kHelp, stdout);
      std::exit(0);
    }
    if (flag == "--activation-checkpointing") {
      f.activation_checkpointing = true;
      continue;
    }
    if (flag == "--report") {
      f.report = true;
      continue;
    }
    if (flag == "--meta-init") {
      f.meta_init = true;
      continue;
    }
    if (flag == "--cpu-offload") {
      f.cpu_offload = true;
      continue;
    }
    if (flag == "--resume") {
      f.resume = true;
      continue;
    }
    if (i + 1 >= argc) {
      throw FlagError(flag + " takes a value (--help lists the flags)");
    }
    const std::string value = argv[++i];
    try {
      if (strings.count(flag)) {
        *strings[flag] = value;
      } else if (ints.count(flag)) {
        size_t used = 0;
        *ints[flag] = std::stoll(value, &used);
        if (used != value.size()) {
          throw std::invalid_argument(value);
        }
      } else if (doubles.count(flag)) {
        size_t used = 0;
        *doubles[flag] = std::stod(value, &used);
        if (used != value.size()) {
          throw std::invalid_argument(value);
        }
      } else if (flag == "--seed") {
        f.seed = std::stoull(value);
      } else if (flag == "--threads") {
        f.threads = std::stoi(value);
      } else {
        throw FlagError("unknown flag " + flag + " (--help lists the flags)");
      }
    } catch (const std::logic_error&) {
      throw FlagError(flag + " takes a number, not '" + value + "'");
    }
  }
  auto one_of = [](const std::string& flag, const std::string& value, std::vector<std::string> allowed) {
    if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) {
        list += (list.empty() ? "" : "|") + a;
      }
      throw FlagError(flag + " is " + list + ", not '" + value + "'");
    }
  };
  one_of("--parallel", f.parallel, {"ddp", "zero", "fsdp"});
  one_of("--strategy", f.strategy, {"full", "grad-op", "no-shard", "hybrid"});
  one_of("--mixed-precision", f.mixed_precision, {"none", "bf16"});
  one_of("--checkpoint-format", f.checkpoint_format, {"dcp", "torch", "safetensors"});
  for (const auto& [flag, value] : ints) {
    if (*value < (flag == "--steps" || flag == "--sample" || flag == "--checkpoint-every" ? 0 : 1)) {
      throw FlagError(flag + " must be positive, not " + std::to_string(*value));
    }
  }
  if (f.mixed_precision != "none" && f.parallel != "fsdp") {
    throw FlagError("--mixed-precision is FSDP's (--parallel fsdp)");
  }
  if (f.cpu_offload && f.parallel != "fsdp") {
    throw FlagError("--cpu-offload is FSDP's (--parallel fsdp)");
  }
  if (f.resume && f.checkpoint.empty()) {
    throw FlagError("--resume needs --checkpoint PATH");
  }
  if (f.checkpoint_every > 0 && f.checkpoint_dir.empty()) {
    throw FlagError("--checkpoint-every N saves into --checkpoint-dir DIR: give it too");
  }
  if (!f.checkpoint_dir.empty() && f.resume) {
    throw FlagError("--checkpoint-dir resumes from DIR/latest by itself; --resume is for --checkpoint PATH");
  }
  if (f.resume && f.checkpoint_format == "safetensors") {
    throw FlagError("--resume reads dcp or torch checkpoints (safetensors holds no optimizer state)");
  }
  return f;
}

// ---- Data ------------------------------------------------------------------------------

// The bytes of `path` (a file), or of every regular file of `path` (a
// directory) in name order; `files` counts them.
std::string read_corpus(const std::string& path, int* files) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    throw FlagError("--data " + path + ": no such file or directory");
  }
  std::vector<std::string> paths;
  if (S_ISDIR(info.st_mode)) {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) {
      throw FlagError("--data " + path + ": cannot list the directory");
    }
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      struct stat item {};
      if (name[0] != '.' && ::stat((path + "/" + name).c_str(), &item) == 0 && S_ISREG(item.st_mode)) {
        paths.push_back(path + "/" + name);
      }
    }
    ::closedir(dir);
    std::sort(paths.begin(), paths.end());
  } else {
    paths.push_back(path);
  }
  std::string text;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    text += bytes.str();
  }
  *files = static_cast<int>(paths.size());
  return text;
}

// Step `step`'s rows [first, first + count) of the global batch of
// `global` rows: row j starts at ((step * global + j) * 9973) mod (N - T - 1)
// (gpt.py draws the same). Inputs and targets (shifted by one), int64.
std::pair<torch::Tensor, torch::Tensor> batch_rows(const torch::Tensor& corpus, int64_t step, int64_t global,
                                                   int64_t first, int64_t count, int64_t block) {
  const int64_t span = corpus.size(0) - block - 1;
  std::vector<torch::Tensor> xs, ys;
  for (int64_t j = first; j < first + count; ++j) {
    const int64_t start = ((step * global + j) * 9973) % span;
    xs.push_back(corpus.narrow(0, start, block));
    ys.push_back(corpus.narrow(0, start + 1, block));
  }
  return {torch::stack(xs), torch::stack(ys)};
}

// ---- Reporting --------------------------------------------------------------------------

double peak_rss_mb() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// Memory of a phase (--report): Linux's resident set now (VmRSS) and its
// peak since the last reset (VmHWM, reset by writing 5 to clear_refs).
double status_mb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      return std::stod(line.substr(prefix.size())) / 1024.0; // kB
    }
  }
  return 0;
}

// The resident pages of other ranks' shared buffers that this process maps
// (ddp's buckets and shards on one host: /dev/shm/ddp-<key>-<rank>-<id>,
// Note [Shared buffers]), in MB: the peer's own resident set counts them
// too, so a rank's resident set less them is what it alone holds. A
// buffer that all `size` ranks use together (FSDP's gathered parameters:
// /dev/shm/ddp-<key>-common-<id>) counts (size - 1) / size as the others'.
double peer_shared_mb(int rank, int size) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  double share = 0; // of the current mapping's pages, the others'
  double kb = 0;
  while (std::getline(in, line)) {
    const char first = line.empty() ? ' ' : line[0];
    if (std::isdigit(static_cast<unsigned char>(first)) || (first >= 'a' && first <= 'f')) {
      // A mapping's first line ("7f..-7f.. rw-s ... /dev/shm/ddp-..."); its
      // fields ("Rss:   1024 kB") follow.
      const auto name = line.find(" /dev/shm/ddp-");
      int owner = -1;
      unsigned long long key = 0;
      long long id = 0;
      share = 0;
      if (name == std::string::npos) {
        continue;
      }
      if (std::sscanf(line.c_str() + name, " /dev/shm/ddp-%llx-common-%lld", &key, &id) == 2) {
        share = static_cast<double>(size - 1) / size;
      } else if (std::sscanf(line.c_str() + name, " /dev/shm/ddp-%llx-%d-%lld", &key, &owner, &id) == 3 &&
                 owner != rank) {
        share = 1;
      }
    } else if (share > 0 && line.rfind("Rss:", 0) == 0) {
      kb += share * std::stod(line.substr(4));
    }
  }
  return kb / 1024.0;
}

void reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

// The mean of `value` over the ranks.
double mean_over_ranks(double value, ddp::ProcessGroup& group, const torch::Device& device) {
  auto t = torch::tensor({value}, torch::kDouble).to(device);
  group.allreduce(t)->wait();
  return t.cpu().item<double>() / group.size();
}

torch::Device pick_device(const ddp::WorldInfo& world) {
  if (!torch::cuda::is_available()) {
    return torch::kCPU;
  }
  if (world.local_rank >= static_cast<int>(torch::cuda::device_count())) {
    throw FlagError("LOCAL_RANK is " + std::to_string(world.local_rank) + " but this node has " +
                    std::to_string(torch::cuda::device_count()) + " CUDA device(s)");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank));
}

ddp::ShardingStrategy strategy_of(const std::string& name) {
  if (name == "grad-op") {
    return ddp::ShardingStrategy::kShardGradOp;
  }
  if (name == "no-shard") {
    return ddp::ShardingStrategy::kNoShard;
  }
  if (name == "hybrid") {
    return ddp::ShardingStrategy::kHybridShard;
  }
  return ddp::ShardingStrategy::kFullShard;
}

int run(const Flags& flags) {
  const double base_mb = status_mb("VmRSS");
  torch::set_num_threads(flags.threads);
  const auto world = ddp::world_info_from_env();
  const torch::Device device = pick_device(world);
  auto group = ddp::init_process_group();
  const int rank = group->rank(), size = group->size();
  auto say = [&](const std::string& line) {
    if (rank == 0) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  };

  int files = 0;
  const std::string text = read_corpus(flags.data, &files);
  if (static_cast<int64_t>(text.size()) < flags.block + 2) {
    throw FlagError("--data " + flags.data + " holds " + std::to_string(text.size()) +
                    " bytes, fewer than a block (--block " + std::to_string(flags.block) + ") and 2");
  }
  auto corpus = torch::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())}, torch::kUInt8)
                    .to(torch::kLong);

  gpt::Config config;
  config.n_layer = flags.layers;
  config.n_head = flags.heads;
  config.n_embd = flags.embd;
  config.block_size = flags.block;
  config.dropout = flags.dropout;
  config.activation_checkpointing = flags.activation_checkpointing;
  config.deferred = flags.meta_init;

  // The same initial weights on every rank: each module's from the seed and
  // its name (ddp::seeded_init), so that a model built block by block
  // (--meta-init) holds the values of one built whole.
  const auto init = ddp::ParamInit().seed(flags.seed).init(gpt::init_module(flags.layers)).device(device);
  gpt::GPT net(config);
  if (!flags.meta_init) {
    ddp::seeded_init(*net, init);
  } else if (flags.parallel != "fsdp") {
    ddp::materialize(*net, init); // DDP and ZeRO hold the whole model on every rank
  }
  net->to(device);

  std::string how = flags.parallel;
  std::unique_ptr<ddp::DistributedDataParallel> ddp_model;
  std::unique_ptr<ddp::FullyShardedDataParallel> fsdp_model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  const auto adamw = torch::optim::AdamWOptions(flags.lr).betas({0.9, 0.95}).weight_decay(0.1);
  if (flags.parallel == "fsdp") {
    auto options = ddp::FullyShardedDataParallelOptions().sharding_strategy(strategy_of(flags.strategy));
    if (flags.meta_init) {
      options.param_init(init);
    }
    if (flags.cpu_offload) {
      options.cpu_offload(ddp::CPUOffload().offload_params(true));
    }
    if (flags.mixed_precision == "bf16") {
      options.mixed_precision(ddp::MixedPrecision().param_dtype(torch::kBFloat16));
    }
    fsdp_model = std::make_unique<ddp::FullyShardedDataParallel>(net, options);
    optimizer = std::make_unique<torch::optim::AdamW>((*fsdp_model)->parameters(), adamw);
    how += std::string(" (") + ddp::to_string(strategy_of(flags.strategy)) + ")";
  } else {
    ddp_model = std::make_unique<ddp::DistributedDataParallel>(net);
    if (flags.parallel == "zero") {
      optimizer = std::make_unique<ddp::optim::ZeroRedundancyOptimizer<torch::optim::AdamW>>((*ddp_model)->parameters(),
                                                                                      adamw);
    } else {
      optimizer = std::make_unique<torch::optim::AdamW>((*ddp_model)->parameters(), adamw);
    }
  }
  if (flags.activation_checkpointing) {
    how += ", activation checkpointing";
  }
  if (flags.meta_init) {
    how += ", deferred construction";
  }
  if (flags.cpu_offload) {
    how += device.is_cuda() ? ", CPU offload" : ", CPU offload (no effect: the model is on the CPU)";
  }
  const double construction_peak = peak_rss_mb();
  const double construction_extra_mb = status_mb("VmHWM") - base_mb;
  const int64_t parameters = gpt::parameter_count(config);
  if (!flags.save_initial.empty()) {
    auto initial = fsdp_model ? (*fsdp_model)->full_state_dict(ddp::FullStateDictOptions().rank0_only(true))
                              : ddp::module_state_dict(*net);
    if (rank == 0) {
      ddp::save_torch_state_dict(initial, flags.save_initial);
    }
  }
  say("gpt_train: " + std::to_string(size) + (size == 1 ? " rank" : " ranks") + " on " + device.str() + " (" +
      group->backend_name() + "); " + how);
  char line[512];
  std::snprintf(line, sizeof(line),
                "gpt_train: %lld layers, %lld heads, %lld wide, block %lld: %.2fM parameters; corpus %s (%d files, "
                "%zu bytes); batch %lld per rank; AdamW lr %g",
                static_cast<long long>(flags.layers), static_cast<long long>(flags.heads),
                static_cast<long long>(flags.embd), static_cast<long long>(flags.block), parameters / 1e6,
                flags.data.c_str(), files, text.size(), static_cast<long long>(flags.batch), flags.lr);
  say(line);

  int64_t first_step = 0;
  if (flags.resume) {
    if (flags.checkpoint_format == "dcp") {
      fsdp_model ? ddp::dcp::load(*fsdp_model, *optimizer, flags.checkpoint)
                 : ddp::dcp::load(*ddp_model, *optimizer, flags.checkpoint);
    } else if (fsdp_model) {
      ddp::load_torch_checkpoint(*fsdp_model, optimizer.get(), flags.checkpoint + "/model.pt",
                                 flags.checkpoint + "/optim.pt");
    } else {
      ddp::load_torch_checkpoint(*ddp_model, optimizer.get(), flags.checkpoint + "/model.pt",
                                 flags.checkpoint + "/optim.pt");
    }
    std::ifstream in(flags.checkpoint + "/gpt_train.step");
    if (!(in >> first_step)) {
      throw FlagError("--resume: " + flags.checkpoint + "/gpt_train.step, which gpt_train writes with its checkpoint, "
                      "is missing or unreadable");
    }
    say("gpt_train: resumed from " + flags.checkpoint + " after step " + std::to_string(first_step));
  }
  // --checkpoint-dir: rank 0 alone reads DIR/latest and clears what a save
  // killed half-way left, then tells the others where to start (-1: it
  // failed, its error follows); every rank then loads its part.
  if (!flags.checkpoint_dir.empty()) {
    std::string error;
    int64_t latest = -1;
    if (rank == 0) {
      try {
        gpt::make_directory(flags.checkpoint_dir);
        latest = gpt::read_latest(flags.checkpoint_dir);
        gpt::remove_other_snapshots(flags.checkpoint_dir, latest);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    auto start = torch::tensor({latest, static_cast<int64_t>(error.empty() ? 0 : 1)}, torch::kLong).to(device);
    group->broadcast(start)->wait();
    if (start[1].item<int64_t>() != 0) {
      throw FlagError(rank == 0 ? error : "rank 0 could not start from --checkpoint-dir " + flags.checkpoint_dir +
                                                " (rank 0's error says why)");
    }
    latest = start[0].item<int64_t>();
    if (latest >= 0) {
      const std::string path = flags.checkpoint_dir + "/" + gpt::snapshot_name(latest);
      fsdp_model ? ddp::dcp::load(*fsdp_model, *optimizer, path) : ddp::dcp::load(*ddp_model, *optimizer, path);
      first_step = latest;
      say("gpt_train: resumed from " + path + " after step " + std::to_string(latest) + " of " +
          std::to_string(flags.steps));
    }
  }
  // Saves the checkpoint after `done` steps in --checkpoint-dir (every rank
  // writes its part), then, once every rank has, rank 0 names it in
  // `latest` and removes the older ones.
  const auto save_snapshot = [&](int64_t done) {
    const std::string path = flags.checkpoint_dir + "/" + gpt::snapshot_name(done);
    fsdp_model ? ddp::dcp::save(*fsdp_model, *optimizer, path) : ddp::dcp::save(*ddp_model, *optimizer, path);
    group->barrier()->wait();
    if (rank == 0) {
      gpt::write_latest(flags.checkpoint_dir, done);
      gpt::remove_other_snapshots(flags.checkpoint_dir, done);
    }
  };

  std::FILE* losses = nullptr;
  if (!flags.losses.empty() && rank == 0) {
    losses = std::fopen(flags.losses.c_str(), "w");
    if (losses == nullptr) {
      throw FlagError("--losses " + flags.losses + ": cannot write");
    }
  }
  auto forward = [&](const torch::Tensor& x) { return fsdp_model ? (*fsdp_model)(x) : (*ddp_model)(x); };
  const int64_t global = flags.batch * size;
  auto window_start = std::chrono::steady_clock::now();
  int64_t window_steps = 0;
  // --report: the largest rise of the resident set over a step (from its
  // start), after the first step (which allocates the optimizer's state),
  // and the time of the steps after the first.
  double step_extra_mb = 0, timed_seconds = 0, overall_peak_mb = 0;
  int64_t timed_steps = 0;
  for (int64_t step = first_step; step < flags.steps; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    double step_base_mb = 0;
    if (flags.report) {
      overall_peak_mb = std::max(overall_peak_mb, status_mb("VmHWM"));
      reset_peak();
      step_base_mb = status_mb("VmRSS");
    }
    // Dropout's masks differ across ranks, as each rank's batch does, and
    // are drawn from the step too, so that a resumed run draws what an
    // uninterrupted one does.
    torch::manual_seed(flags.seed + 1 + static_cast<uint64_t>(rank + step * size));
    auto [x, y] = batch_rows(corpus, step, global, rank * flags.batch, flags.batch, flags.block);
    x = x.to(device);
    y = y.to(device);
    optimizer->zero_grad();
    auto loss = gpt::loss_of(forward(x), y);
    loss.backward();
    if (flags.clip > 0) {
      if (fsdp_model) {
        (*fsdp_model)->clip_grad_norm(flags.clip);
      } else {
        torch::nn::utils::clip_grad_norm_((*ddp_model)->parameters(), flags.clip);
      }
    }
    optimizer->step();
    if (flags.report && step > first_step) {
      if (device.is_cuda()) {
        torch::cuda::synchronize(device.index());
      }
      step_extra_mb = std::max(step_extra_mb, status_mb("VmHWM") - step_base_mb);
      timed_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      ++timed_steps;
    }
    ++window_steps;
    const bool log = (step + 1) % flags.log_every == 0 || step + 1 == flags.steps;
    if (!flags.losses.empty() || log) { // a collective: every rank
      const double mean = mean_over_ranks(loss.item<double>(), *group, device);
      if (losses != nullptr) {
        std::fprintf(losses, "%.9g\n", mean);
      }
      if (log) {
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
        std::snprintf(line, sizeof(line), "step %lld/%lld  loss %.4f  %.0f tokens/s  peak RSS %.0f MB",
                      static_cast<long long>(step + 1), static_cast<long long>(flags.steps), mean,
                      window_steps * global * flags.block / seconds, peak_rss_mb());
        say(line);
        window_start = std::chrono::steady_clock::now();
        window_steps = 0;
      }
    }
    if (!flags.checkpoint_dir.empty() &&
        (step + 1 == flags.steps || (flags.checkpoint_every > 0 && (step + 1) % flags.checkpoint_every == 0))) {
      save_snapshot(step + 1);
    }
  }
  if (losses != nullptr) {
    std::fclose(losses);
  }
  // Training's peak, before the checkpoint and the sample gather full states.
  const double training_peak_mb = std::max(overall_peak_mb, status_mb("VmHWM"));

  if (!flags.checkpoint.empty()) {
    if (flags.checkpoint_format == "dcp") {
      fsdp_model ? ddp::dcp::save(*fsdp_model, *optimizer, flags.checkpoint)
                 : ddp::dcp::save(*ddp_model, *optimizer, flags.checkpoint);
    } else {
      if (rank == 0) {
        ::mkdir(flags.checkpoint.c_str(), 0755);
      }
      group->barrier()->wait();
      if (flags.checkpoint_format == "torch") {
        fsdp_model ? ddp::save_torch_checkpoint(*fsdp_model, optimizer.get(), flags.checkpoint + "/model.pt",
                                                flags.checkpoint + "/optim.pt")
                   : ddp::save_torch_checkpoint(*ddp_model, optimizer.get(), flags.checkpoint + "/model.pt",
                                                flags.checkpoint + "/optim.pt");
      } else {
        auto state = fsdp_model ? (*fsdp_model)->full_state_dict(ddp::FullStateDictOptions().rank0_only(true))
                                : ddp::module_state_dict(*net);
        if (rank == 0) {
          ddp::save_safetensors(state, flags.checkpoint + "/model.safetensors");
        }
        group->barrier()->wait();
      }
    }
    if (rank == 0) {
      std::ofstream(flags.checkpoint + "/gpt_train.step") << flags.steps << "\n";
    }
    group->barrier()->wait();
    say("gpt_train: saved " + flags.checkpoint + " (" + flags.checkpoint_format + ")");
  }

  // The sample, and with --checkpoint-dir the final weights' checksum (by
  // which a resumed run is compared with an uninterrupted one), from the
  // full weights on rank 0, gathered by every rank; nothing is gathered
  // without them (a model near the memory's limit would not hold it).
  const bool with_checksum = !flags.checkpoint_dir.empty();
  const auto state = flags.sample == 0 && !with_checksum ? ddp::StateDict()
                     : fsdp_model ? (*fsdp_model)->full_state_dict(ddp::FullStateDictOptions().rank0_only(true))
                                  : ddp::module_state_dict(*net);
  if (rank == 0 && with_checksum) {
    examples::Checksum checksum;
    for (const auto& item : state) {
      checksum.add(item.value());
    }
    say("final parameters: checksum " + checksum.hex() + " (" + std::to_string(checksum.values()) + " values)");
  }
  if (rank == 0 && flags.sample > 0) {
    auto plain_config = config;
    plain_config.activation_checkpointing = false;
    plain_config.deferred = false;
    gpt::GPT plain(plain_config);
    ddp::load_module_state_dict(*plain, state);
    plain->to(device);
    std::string sample = gpt::sample(plain, flags.prompt, flags.sample, 0.8, flags.seed);
    for (auto& c : sample) {
      const auto byte = static_cast<unsigned char>(c);
      if ((byte < 32 && c != '\n') || byte > 126) {
        c = '?'; // a byte that is not printable ASCII (early in training, most)
      }
    }
    say("sample: \"" + flags.prompt + sample + "\"");
  }
  std::snprintf(line, sizeof(line), "gpt_train: peak RSS %.0f MB (%.0f MB by the end of construction) on rank 0",
                peak_rss_mb(), construction_peak);
  say(line);
  if (flags.report) {
    std::snprintf(line, sizeof(line),
                  "gpt_result impl=ddp rank=%d world=%d parallel=%s ac=%d meta=%d layers=%lld embd=%lld block=%lld "
                  "batch=%lld params=%lld tokens_per_s=%.1f step_extra_mb=%.0f construction_extra_mb=%.0f "
                  "peak_rss_mb=%.0f base_mb=%.0f peer_shared_mb=%.0f",
                  rank, size, flags.parallel.c_str(), flags.activation_checkpointing ? 1 : 0, flags.meta_init ? 1 : 0,
                  static_cast<long long>(flags.layers), static_cast<long long>(flags.embd),
                  static_cast<long long>(flags.block), static_cast<long long>(flags.batch),
                  static_cast<long long>(parameters),
                  timed_steps > 0 ? static_cast<double>(timed_steps * global * flags.block) / timed_seconds : 0.0,
                  step_extra_mb, construction_extra_mb, training_peak_mb, base_mb, peer_shared_mb(rank, size));
    std::printf("%s\n", line);
    std::fflush(stdout);
  }
  ddp::destroy_process_group();
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {
    flags = parse(argc, argv);
  } catch (const FlagError& e) {
    std::fprintf(stderr, "gpt_train: %s\n", e.what());
    return 2;
  }
  try {
    return run(flags);
  } catch (const FlagError& e) {
    std::fprintf(stderr, "gpt_train: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_train: %s\n", ddp::error_message(e).c_str());
    return 1;
  }
}
