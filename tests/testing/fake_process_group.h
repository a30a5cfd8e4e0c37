#pragma once

// The one fake process group of the unit tests (header-only): a rank of a
// group that does not exist. Every operation completes at once and is
// recorded by name. Used where a test needs to see what a component asks
// of its group (SyncBatchNorm, PowerSGD, the composite group's routing), or
// a backend with no sparse allreduce (as NCCL and MPI).

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>
#include <ddp/comm/work.h>

namespace ddp::testing {

// Rank `rank` of `size`; backend "fake". What it does besides recording:
//   mirror             behaves as a group of `size` ranks that all hold
//                      this rank's tensors: allreduce multiplies by the
//                      size, allgather_into_tensor repeats the input; else
//                      no operation touches its tensors;
//   fail_allreduce_at  the allreduce numbered so (from 0) fails with "lost
//                      connection to rank 1";
//   expected_ops       when not empty, the only operations the test
//                      expects: any other is a test failure naming it.
// It declares no sparse allreduce (ProcessGroup's default).
// Thread-safety: one thread at a time, as the tests use it.
class FakeProcessGroup : public ProcessGroup {
 public:
  explicit FakeProcessGroup(int rank = 0, int size = 1) : ProcessGroup(rank, size, std::chrono::seconds(30)) {}

  bool mirror = false;
  int fail_allreduce_at = -1;
  std::vector<std::string> expected_ops;

  std::vector<std::string> calls;          // every operation, in order
  std::vector<int64_t> allreduce_numels;   // every allreduce's element count

  std::string backend_name() const override {
    return "fake";
  }
  std::shared_ptr<Work> allreduce(const at::Tensor& tensor, const AllreduceOptions&) override {
    const int number = static_cast<int>(allreduce_numels.size());
    allreduce_numels.push_back(tensor.numel());
    if (number == fail_allreduce_at) {
      record("allreduce");
      auto work = Work::create("[rank " + std::to_string(rank()) + "/" + std::to_string(size()) + "] allreduce #" +
                               std::to_string(number));
      work->set_error(std::make_exception_ptr(std::runtime_error("lost connection to rank 1")));
      return work;
    }
    if (mirror) {
      tensor.mul_(size());
    }
    return done("allreduce", {tensor});
  }
  std::shared_ptr<Work> allreduce_coalesced(const std::vector<at::Tensor>& tensors, const AllreduceOptions&) override {
    return done("allreduce_coalesced", tensors);
  }
  std::shared_ptr<Work> broadcast(const at::Tensor& tensor, const BroadcastOptions&) override {
    return done("broadcast", {tensor});
  }
  std::shared_ptr<Work> reduce(const at::Tensor& tensor, const ReduceOptions&) override {
    return done("reduce", {tensor});
  }
  std::shared_ptr<Work> allgather(const std::vector<at::Tensor>& outputs, const at::Tensor&,
                                  const AllgatherOptions&) override {
    return done("allgather", outputs);
  }
  std::shared_ptr<Work> allgather_into_tensor(const at::Tensor& output, const at::Tensor& input,
                                              const AllgatherOptions&) override {
    if (mirror) {
      output.copy_(input.repeat({size()}));
    }
    return done("allgather_into_tensor", {output});
  }
  std::shared_ptr<Work> gather(const std::vector<at::Tensor>& outputs, const at::Tensor&,
                               const GatherOptions&) override {
    return done("gather", outputs);
  }
  std::shared_ptr<Work> scatter(const at::Tensor& output, const std::vector<at::Tensor>&,
                                const ScatterOptions&) override {
    return done("scatter", {output});
  }
  std::shared_ptr<Work> reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>&,
                                       const ReduceScatterOptions&) override {
    return done("reduce_scatter", {output});
  }
  std::shared_ptr<Work> alltoall(const at::Tensor& output, const at::Tensor&, const AlltoallOptions&) override {
    return done("alltoall", {output});
  }
  std::shared_ptr<Work> barrier(const BarrierOptions&) override {
    return done("barrier", {});
  }
  std::shared_ptr<Work> send(const at::Tensor& tensor, int, const PointToPointOptions&) override {
    return done("send", {tensor});
  }
  std::shared_ptr<Work> recv(const at::Tensor& tensor, int, const PointToPointOptions&) override {
    return done("recv", {tensor});
  }

 private:
  void record(const std::string& name) {
    calls.push_back(name);
    if (!expected_ops.empty() && std::find(expected_ops.begin(), expected_ops.end(), name) == expected_ops.end()) {
      ADD_FAILURE() << "the fake process group was asked for " << name << ", which the test does not expect";
    }
  }
  std::shared_ptr<Work> done(const std::string& name, std::vector<at::Tensor> result) {
    record(name);
    return Work::completed(std::move(result));
  }
};

} // namespace ddp::testing
