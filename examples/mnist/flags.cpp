#include "flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

namespace mnist {

namespace {

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < min) {
    throw FlagError(flag + " must be an integer >= " + std::to_string(min) + " (got '" + text +
                    "')");
  }
  return value;
}

double parse_double(const std::string& flag, const std::string& text, double min, double max,
                    const char* range) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(value) || value < min ||
      value > max) {
    throw FlagError(flag + " must be a number " + range + " (got '" + text + "')");
  }
  return value;
}

} // namespace

const char* usage() {
  return "usage: mnist_train [flags]\n"
         "  --epochs N             epochs to train in all (default 3)\n"
         "  --batch-size N         examples per step on each rank (default 64)\n"
         "  --lr X                 learning rate of SGD (default 0.01)\n"
         "  --momentum X           momentum of SGD, in [0, 1) (default 0.9)\n"
         "  --data DIR             read MNIST's IDX files from DIR (default: a synthetic set)\n"
         "  --train-size N         training examples (default 6000 synthetic, all of --data)\n"
         "  --test-size N          test examples (default 1000 synthetic, all of --data)\n"
         "  --seed N               seed of the data, the parameters and the shuffle (default 1)\n"
         "  --checkpoint-dir DIR   save a checkpoint there after every epoch (default: none)\n"
         "  --checkpoint-format F  ddp (default), dcp (a torch.distributed.checkpoint\n"
         "                         directory: resumes at any world size, optimizer\n"
         "                         state included), torch (torch.save-format state\n"
         "                         dicts) or safetensors (the model; the optimizer's\n"
         "                         state beside it in torch.save's format)\n"
         "  --checkpoint-every N   also save one every N steps within an epoch, with the\n"
         "                         sampler's position, to resume from that step (default:\n"
         "                         at the ends of epochs only)\n"
         "  --resume               continue from the newest checkpoint in --checkpoint-dir\n"
         "                         (implied when a launcher restarted the job: ddprun\n"
         "                         --max-restarts, torchrun --max-restarts, a requeued\n"
         "                         Slurm job)\n"
         "  --csv PATH             rank 0 writes one row of metrics per epoch there\n"
         "  --stop-after-epoch N   exit right after saving epoch N's checkpoint\n"
         "  --comm-hook NAME       gradient reduction: allreduce, fp16, bf16, powersgd or\n"
         "                         localsgd (post-local SGD with model averaging; default\n"
         "                         allreduce)\n"
         "  --bucket-cap-mb X      DDP's gradient bucket size in MiB (default 25; small\n"
         "                         values give several buckets to overlap with backward)\n"
         "  --powersgd-rank N      PowerSGD's matrix approximation rank (default 1)\n"
         "  --powersgd-start-iter N  plain steps before PowerSGD compresses (default 10,\n"
         "                         at least 2)\n"
         "  --local-sgd-period N   localsgd: average the parameters over every rank each\n"
         "                         N steps (default 4)\n"
         "  --local-sgd-start-iter N  localsgd: global steps before local SGD starts\n"
         "                         (default 10)\n"
         "  --local-sgd-group-size N  localsgd: ranks that average their gradients\n"
         "                         together in between (default: the ranks of a node)\n"
         "  --optimizer-sharding S  where SGD's momentum lives: none (every rank), zero1\n"
         "                         (sharded, ZeroRedundancyOptimizer) or zero2 (gradients\n"
         "                         sharded too, steps during backward; default none)\n"
         "  --fsdp S               shard the parameters too (FullyShardedDataParallel, each\n"
         "                         layer a unit): full or grad-op (default: DDP)\n"
         "  -h, --help             print this and exit\n";
}

Flags parse_flags(int argc, char** argv) {
  Flags flags;
  // Flags that take a value, and what to do with it.
  const std::map<std::string, std::function<void(const std::string&, const std::string&)>> with_value = {
      {"--epochs", [&](auto& f, auto& v) { flags.epochs = parse_int(f, v, 1); }},
      {"--batch-size", [&](auto& f, auto& v) { flags.batch_size = parse_int(f, v, 1); }},
      {"--lr", [&](auto& f, auto& v) { flags.lr = parse_double(f, v, 1e-12, 1e6, "> 0"); }},
      {"--momentum",
       [&](auto& f, auto& v) { flags.momentum = parse_double(f, v, 0, 0.999999, "in [0, 1)"); }},
      {"--data", [&](auto&, auto& v) { flags.data = v; }},
      {"--train-size", [&](auto& f, auto& v) { flags.train_size = parse_int(f, v, 1); }},
      {"--test-size", [&](auto& f, auto& v) { flags.test_size = parse_int(f, v, 1); }},
      {"--seed", [&](auto& f, auto& v) { flags.seed = static_cast<uint64_t>(parse_int(f, v, 0)); }},
      {"--checkpoint-dir", [&](auto&, auto& v) { flags.checkpoint_dir = v; }},
      {"--checkpoint-format",
       [&](auto& f, auto& v) {
         if (v != "ddp" && v != "dcp" && v != "torch" && v != "safetensors") {
           throw FlagError(f + " must be ddp, dcp, torch or safetensors (got '" + v + "')");
         }
         flags.checkpoint_format = v;
       }},
      {"--csv", [&](auto&, auto& v) { flags.csv = v; }},
      {"--checkpoint-every", [&](auto& f, auto& v) { flags.checkpoint_every = parse_int(f, v, 1); }},
      {"--stop-after-epoch", [&](auto& f, auto& v) { flags.stop_after_epoch = parse_int(f, v, 1); }},
      {"--comm-hook",
       [&](auto& f, auto& v) {
         if (v != "allreduce" && v != "fp16" && v != "bf16" && v != "powersgd" && v != "localsgd") {
           throw FlagError(f + " must be allreduce, fp16, bf16, powersgd or localsgd (got '" + v + "')");
         }
         flags.comm_hook = v;
       }},
      {"--optimizer-sharding",
       [&](auto& f, auto& v) {
         if (v != "none" && v != "zero1" && v != "zero2") {
           throw FlagError(f + " must be none, zero1 or zero2 (got '" + v + "')");
         }
         flags.optimizer_sharding = v;
       }},
      {"--fsdp",
       [&](auto& f, auto& v) {
         if (v != "full" && v != "grad-op") {
           throw FlagError(f + " must be full or grad-op (got '" + v + "')");
         }
         flags.fsdp = v;
       }},
      {"--bucket-cap-mb",
       [&](auto& f, auto& v) { flags.bucket_cap_mb = parse_double(f, v, 1e-6, 1e6, "> 0"); }},
      {"--powersgd-rank", [&](auto& f, auto& v) { flags.powersgd_rank = parse_int(f, v, 1); }},
      {"--powersgd-start-iter",
       [&](auto& f, auto& v) { flags.powersgd_start_iter = parse_int(f, v, 2); }},
      {"--local-sgd-period", [&](auto& f, auto& v) { flags.local_sgd_period = parse_int(f, v, 1); }},
      {"--local-sgd-start-iter",
       [&](auto& f, auto& v) { flags.local_sgd_start_iter = parse_int(f, v, 0); }},
      {"--local-sgd-group-size",
       [&](auto& f, auto& v) { flags.local_sgd_group_size = parse_int(f, v, 1); }},
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      flags.help = true;
      continue;
    }
    if (arg == "--resume") {
      flags.resume = true;
      continue;
    }
    std::string name = arg;
    std::optional<std::string> value;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    const auto handler = with_value.find(name);
    if (handler == with_value.end()) {
      throw FlagError(arg.rfind("-", 0) == 0 ? "unknown flag '" + name + "'"
                                             : "unexpected argument '" + arg + "'");
    }
    if (!value) {
      if (i + 1 >= argc) {
        throw FlagError(name + " needs a value");
      }
      value = argv[++i];
    }
    handler->second(name, *value);
  }
  if (flags.resume && flags.checkpoint_dir.empty()) {
    throw FlagError("--resume needs --checkpoint-dir (where the checkpoints are)");
  }
  if (flags.stop_after_epoch > 0 && flags.checkpoint_dir.empty()) {
    throw FlagError("--stop-after-epoch needs --checkpoint-dir (stopping without a checkpoint "
                    "would lose the epochs trained)");
  }
  if (flags.checkpoint_every > 0 && flags.checkpoint_dir.empty()) {
    throw FlagError("--checkpoint-every needs --checkpoint-dir (where the checkpoints go)");
  }
  if (flags.checkpoint_every > 0 && flags.comm_hook == "localsgd") {
    throw FlagError("--checkpoint-every with --comm-hook localsgd: within an epoch each rank's parameters differ "
                    "between averagings, and a checkpoint keeps rank 0's; checkpoint at the ends of epochs, where "
                    "the ranks agree");
  }
  if (flags.comm_hook == "localsgd" && flags.optimizer_sharding != "none") {
    throw FlagError("--comm-hook localsgd lets each rank's parameters diverge between averagings, which sharded "
                    "optimizer state cannot follow: it takes no --optimizer-sharding");
  }
  if (flags.comm_hook == "localsgd" && flags.checkpoint_format != "ddp") {
    throw FlagError("--comm-hook localsgd trains through a PostLocalSGDOptimizer, whose state only "
                    "--checkpoint-format ddp saves");
  }
  if (!flags.fsdp.empty() && (flags.optimizer_sharding != "none" || flags.comm_hook != "allreduce")) {
    throw FlagError("--fsdp shards the optimizer state and reduce-scatters the gradients itself: it "
                    "takes neither --optimizer-sharding nor --comm-hook");
  }
  return flags;
}

} // namespace mnist
