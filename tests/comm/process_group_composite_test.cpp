// CompositeProcessGroup routes each operation to the backend of its tensors'
// device type. Here the CPU backend is a real Gloo group and a second device
// type (Meta, which any LibTorch has) is served by a recording fake, so that
// the routing is checked without a GPU; tests/gpu/composite_cuda_test.cpp
// runs the real cpu:gloo,cuda:nccl pair.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/store/hash_store.h>
#include <ddp/comm/process_group_composite.h>

#include "testing/errors.h"
#include "testing/fake_process_group.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using RecordingGroup = testing::FakeProcessGroup; // records every operation

struct Pair {
  std::shared_ptr<CompositeProcessGroup> group;
  std::shared_ptr<RecordingGroup> fake;
};

Pair make_pair_of_one() {
  auto fake = std::make_shared<RecordingGroup>(0, 1);
  std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> backends;
  backends[c10::DeviceType::CPU] = testing::make_gloo_group_of_one();
  backends[c10::DeviceType::Meta] = fake;
  return {std::make_shared<CompositeProcessGroup>(std::move(backends)), fake};
}

at::Tensor meta(int64_t n) {
  return torch::empty({n}, torch::TensorOptions().device(torch::kMeta));
}

TEST(CompositeProcessGroup, NamesItsBackendsAsPyTorchDoes) {
  auto [group, fake] = make_pair_of_one();
  EXPECT_EQ(group->backend_name(), "cpu:gloo,meta:fake");
  EXPECT_EQ(group->backend_for(c10::DeviceType::Meta), fake);
  DDP_EXPECT_ERROR(group->backend_for(c10::DeviceType::CUDA), "has no backend for device type cuda");
}

// The capabilities that FSDP and the object collectives ask a group for,
// instead of its backend's name: Gloo reduces shared buffers in shared
// memory and needs no device buffers; a composite group, whose buffers are
// not shared, states neither (so FSDP reduce-scatters over it).
TEST(CompositeProcessGroup, StatesItsCapabilitiesAndGlooItsOwn) {
  auto [group, fake] = make_pair_of_one();
  const auto gloo = group->backend_for(c10::DeviceType::CPU);
  EXPECT_TRUE(gloo->reduces_in_shared_memory());
  EXPECT_FALSE(gloo->needs_device_buffers());
  EXPECT_FALSE(group->reduces_in_shared_memory());
  EXPECT_FALSE(group->needs_device_buffers());
  EXPECT_FALSE(fake->reduces_in_shared_memory());
}

TEST(CompositeProcessGroup, RoutesEveryOperationByTheDeviceOfItsTensors) {
  auto [group, fake] = make_pair_of_one();
  group->allreduce(meta(3))->wait();
  group->allreduce_coalesced({meta(1), meta(2)})->wait();
  group->broadcast(meta(3))->wait();
  group->reduce(meta(3))->wait();
  group->allgather({meta(3)}, meta(3))->wait();
  group->allgather_into_tensor(meta(3), meta(3))->wait();
  group->gather({meta(3)}, meta(3))->wait();
  group->scatter(meta(3), {meta(3)})->wait();
  group->reduce_scatter(meta(3), {meta(3)})->wait();
  group->alltoall(meta(3), meta(3))->wait();
  group->send(meta(3), 0)->wait();
  group->recv(meta(3), 0)->wait();
  EXPECT_EQ(fake->calls, (std::vector<std::string>{
                             "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather",
                             "allgather_into_tensor", "gather", "scatter", "reduce_scatter", "alltoall",
                             "send", "recv"}));

  // CPU tensors and the barrier go to Gloo, never to the other backend.
  auto t = torch::full({4}, 2.0);
  group->allreduce(t)->wait();
  group->barrier()->wait();
  EXPECT_TRUE(torch::equal(t, torch::full({4}, 2.0)));
  EXPECT_EQ(fake->calls.size(), 12u);
}

TEST(CompositeProcessGroup, RefusesTensorsOnTwoDeviceTypesOrOnOneWithNoBackend) {
  auto [group, fake] = make_pair_of_one();
  DDP_EXPECT_ERROR(group->allgather({meta(2)}, torch::ones({2})), "allgather: tensors on meta and cpu in one operation");
  EXPECT_TRUE(fake->calls.empty());

  std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> cpu_only;
  cpu_only[c10::DeviceType::CPU] = testing::make_gloo_group_of_one();
  CompositeProcessGroup only_gloo(std::move(cpu_only));
  DDP_EXPECT_ERROR(only_gloo.allreduce(meta(2)), "has no backend for meta tensors");
}

TEST(CompositeProcessGroup, NeedsACpuBackendAndBackendsThatAgreeOnRankAndSize) {
  std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> no_cpu;
  no_cpu[c10::DeviceType::Meta] = std::make_shared<RecordingGroup>(0, 1);
  DDP_EXPECT_ERROR(CompositeProcessGroup{no_cpu}, "no backend for cpu");

  std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> disagree;
  disagree[c10::DeviceType::CPU] = std::make_shared<RecordingGroup>(0, 2);
  disagree[c10::DeviceType::Meta] = std::make_shared<RecordingGroup>(1, 2);
  DDP_EXPECT_ERROR(CompositeProcessGroup{disagree}, "expected rank 0 of 2");
}

} // namespace
} // namespace ddp
