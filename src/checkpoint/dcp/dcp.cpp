// The public entry points of DCP (dcp.h): which items each wrapper has, and
// over which group its ranks meet.

#include <ddp/comm/error.h>
#include <ddp/checkpoint/dcp.h>

#include <torch/torch.h>

#include <ddp/nn/distributed_data_parallel.h>
#include <ddp/nn/fully_sharded_data_parallel.h>
#include <ddp/optim/zero_redundancy_optimizer.h>

#include "checkpoint/dcp/boxes.h"
#include "checkpoint/dcp/engine.h"
#include "internal/check.h"

namespace ddp::dcp {

namespace cd = checkpoint::dcp;

namespace {

void check_zero_group(const torch::optim::Optimizer* optimizer, const std::shared_ptr<ProcessGroup>& group,
                      const char* op) {
  if (const auto* zero = dynamic_cast<const optim::ZeroRedundancyOptimizerBase*>(optimizer)) {
    DDP_CHECK(zero->process_group() == group, op,
              ": the ZeroRedundancyOptimizer shards its state over another process group than the model's; "
              "build both over the same group");
  }
}

} // namespace

void save(const DistributedDataParallel& model, const std::string& path) {
  cd::save_items_to(model->process_group(), cd::save_items(*model->module(), nullptr), path);
}

void save(const DistributedDataParallel& model, torch::optim::Optimizer& optimizer, const std::string& path) {
  check_zero_group(&optimizer, model->process_group(), "dcp::save");
  cd::save_items_to(model->process_group(), cd::save_items(*model->module(), &optimizer), path);
}

void save(FullyShardedDataParallel& model, const std::string& path) {
  cd::save_items_to(model->shard_group(), cd::save_items(model, nullptr), path);
}

void save(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer, const std::string& path) {
  cd::save_items_to(model->shard_group(), cd::save_items(model, &optimizer), path);
}

void save(torch::nn::Module& module, torch::optim::Optimizer* optimizer, const std::string& path,
          const std::shared_ptr<ProcessGroup>& group) {
  check_zero_group(optimizer, group, "dcp::save");
  cd::save_items_to(group, cd::save_items(module, optimizer), path);
}

IncompatibleKeys load(DistributedDataParallel& model, const std::string& path, const LoadOptions& options) {
  return load(*model->module(), nullptr, path, model->process_group(), options);
}

IncompatibleKeys load(DistributedDataParallel& model, torch::optim::Optimizer& optimizer, const std::string& path,
                      const LoadOptions& options) {
  return load(*model->module(), &optimizer, path, model->process_group(), options);
}

IncompatibleKeys load(torch::nn::Module& module, torch::optim::Optimizer* optimizer, const std::string& path,
                      const std::shared_ptr<ProcessGroup>& group, const LoadOptions& options) {
  check_zero_group(optimizer, group, "dcp::load");
  return cd::load_items_from(group, path, options.strict(),
                             [&](const cd::Metadata& md) { return cd::load_items(md, module, optimizer); });
}

IncompatibleKeys load(FullyShardedDataParallel& model, const std::string& path, const LoadOptions& options) {
  return cd::load_items_from(model->shard_group(), path, options.strict(),
                             [&](const cd::Metadata& md) { return cd::load_items(md, model, nullptr); });
}

IncompatibleKeys load(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer, const std::string& path,
                      const LoadOptions& options) {
  return cd::load_items_from(model->shard_group(), path, options.strict(),
                             [&](const cd::Metadata& md) { return cd::load_items(md, model, &optimizer); });
}

StateDict read_model_state(const std::string& path) {
  try {
    const auto metadata = cd::read_metadata(path);
    StateDict state;
    for (const auto& [key, entry] : metadata.entries) {
      const auto* t = std::get_if<cd::TensorEntry>(&entry);
      if (t == nullptr || key.compare(0, 6, "model.") != 0) {
        continue;
      }
      auto full = at::empty(t->size, at::TensorOptions(t->dtype));
      cd::Box all{std::vector<int64_t>(t->size.size(), 0), t->size};
      int64_t covered = 0;
      for (size_t c = 0; c < t->chunks.size(); ++c) {
        cd::narrow_to(full, all, t->chunks[c]).copy_(cd::read_chunk(path, metadata, key, c));
        covered += t->chunks[c].numel();
      }
      DDP_CHECK(covered == all.numel(), "dcp::read_model_state: '", path, "': the chunks of '", key, "' hold ", covered,
                " of its ", all.numel(), " elements");
      state.insert(key.substr(6), full);
    }
    return state;
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    DDP_CHECK(false, "dcp::read_model_state: ", error_message(e));
  }
}

} // namespace ddp::dcp
