#include "comm/collective_checks.h"

#include <c10/util/StringUtil.h>

#include "internal/check.h"

namespace ddp::internal {

void check_strided(const at::Tensor& t, const std::string& who, const std::string& what,
                   const char* sparse_rule) {
  DDP_CHECK(!t.is_sparse(), who, ": ", what, " is sparse; ", sparse_rule);
  DDP_CHECK(t.layout() == at::kStrided, who, ": ", what, " has layout ", t.layout(),
            "; collectives take dense (strided) tensors");
}

void check_root(int root, int size, const std::string& who) {
  DDP_CHECK(root >= 0 && root < size, who, ": root rank ", root,
            " is out of range for world size ", size);
}

void check_same_as(const at::Tensor& t, const at::Tensor& reference, const std::string& who,
                   const std::string& what, const std::string& reference_name) {
  DDP_CHECK(t.scalar_type() == reference.scalar_type(), who, ": ", what, " has dtype ",
            t.scalar_type(), ", expected ", reference.scalar_type(), " like ", reference_name);
  DDP_CHECK(t.numel() == reference.numel(), who, ": ", what, " has ", t.numel(),
            " elements (sizes ", t.sizes(), "), expected ", reference.numel(), " like ",
            reference_name, " (sizes ", reference.sizes(), ")");
}

namespace {

// `where` is "" or "on the root, ", for the count message.
void check_list(const std::vector<at::Tensor>& list, int size, const std::string& who,
                const char* where, const char* what, ElementCheck check_element) {
  DDP_CHECK(static_cast<int>(list.size()) == size, who, ": ", where, what, " holds ",
            list.size(), " tensors, expected one per rank (", size, ")");
  for (size_t r = 0; r < list.size(); ++r) {
    check_element(list[r], c10::str(what, "[", r, "]"));
  }
}

} // namespace

void check_one_per_rank(const std::vector<at::Tensor>& list, int size, const std::string& who,
                        const char* what, ElementCheck check_element) {
  check_list(list, size, who, "", what, check_element);
}

void check_root_only_list(const std::vector<at::Tensor>& list, int rank, int root, int size,
                          const std::string& who, const char* what, ElementCheck check_element) {
  if (rank == root) {
    check_list(list, size, who, "on the root, ", what, check_element);
  } else {
    DDP_CHECK(list.empty(), who, ": ", what,
              " must be empty on a rank other than the root (rank ", root, "), got ",
              list.size(), " tensors");
  }
}

void check_matches(const at::Tensor& t, const at::Tensor& reference, const std::string& who,
                   const std::string& what, const std::string& reference_name,
                   const TensorRules& rules) {
  rules.check(t, who, what);
  check_same_as(t, reference, who, what, reference_name);
  if (rules.one_device_reason != nullptr) {
    DDP_CHECK(t.device() == reference.device(), who, ": ", what, " is on ", t.device(),
              ", expected ", reference.device(), " like ", reference_name, " (",
              rules.one_device_reason, ")");
  }
}

namespace {

// The element check of a list whose tensors must match `reference`.
// Holds references; use it within the call it is passed to.
auto matching(const at::Tensor& reference, const std::string& who, const char* reference_name,
              const TensorRules& rules) {
  return [&reference, &who, reference_name, &rules](const at::Tensor& t, const std::string& what) {
    check_matches(t, reference, who, what, reference_name, rules);
  };
}

} // namespace

void check_rooted(const at::Tensor& tensor, int root, int size, const std::string& who,
                  const TensorRules& rules) {
  rules.check(tensor, who, "tensor");
  check_root(root, size, who);
}

void check_allgather(const std::vector<at::Tensor>& outputs, const at::Tensor& input, int size,
                     const std::string& who, const TensorRules& rules) {
  rules.check(input, who, "input");
  check_one_per_rank(outputs, size, who, "outputs", matching(input, who, "input", rules));
}

void check_allgather_into_tensor(const at::Tensor& output, const at::Tensor& input, int size,
                                 const std::string& who, const TensorRules& rules) {
  rules.check(input, who, "input");
  rules.check(output, who, "output");
  DDP_CHECK(output.scalar_type() == input.scalar_type(), who, ": output has dtype ",
            output.scalar_type(), ", expected ", input.scalar_type(), " like input");
  if (rules.one_device_reason != nullptr) {
    DDP_CHECK(output.device() == input.device(), who, ": output is on ", output.device(),
              ", expected ", input.device(), " like input (", rules.one_device_reason, ")");
  }
  DDP_CHECK(output.numel() == input.numel() * size, who, ": output has ", output.numel(),
            " elements, expected world size x input elements = ", size, " x ", input.numel(),
            " = ", input.numel() * size);
}

void check_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input, int rank,
                  int root, int size, const std::string& who, const TensorRules& rules) {
  rules.check(input, who, "input");
  check_root(root, size, who);
  check_root_only_list(outputs, rank, root, size, who, "outputs", matching(input, who, "input", rules));
}

void check_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int rank,
                   int root, int size, const std::string& who, const TensorRules& rules) {
  rules.check(output, who, "output");
  check_root(root, size, who);
  check_root_only_list(inputs, rank, root, size, who, "inputs", matching(output, who, "output", rules));
}

void check_reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int rank,
                          int size, const std::string& who, const TensorRules& rules) {
  rules.check(output, who, "output");
  // As PyTorch: inputs[r] is reduced into rank r's output, so the chunks may
  // differ in size from rank to rank (each inputs[r] alike on every rank);
  // this rank's output has the size of its own chunk.
  check_one_per_rank(inputs, size, who, "inputs",
                     [&](const at::Tensor& t, const std::string& what) {
                       rules.check(t, who, what);
                       DDP_CHECK(t.scalar_type() == output.scalar_type(), who, ": ", what,
                                 " has dtype ", t.scalar_type(), ", expected ",
                                 output.scalar_type(), " like output");
                       if (rules.one_device_reason != nullptr) {
                         DDP_CHECK(t.device() == output.device(), who, ": ", what, " is on ",
                                   t.device(), ", expected ", output.device(), " like output (",
                                   rules.one_device_reason, ")");
                       }
                     });
  const at::Tensor& mine = inputs[static_cast<size_t>(rank)];
  DDP_CHECK(output.numel() == mine.numel(), who, ": output has ", output.numel(),
            " elements (sizes ", output.sizes(), "), expected ", mine.numel(), " like inputs[",
            rank, "] (sizes ", mine.sizes(), "), this rank's chunk");
}

void check_coalesced(const std::vector<at::Tensor>& tensors, const std::string& who,
                     const TensorRules& rules) {
  DDP_CHECK(!tensors.empty(), who, ": no tensors given");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto name = tensors.size() == 1 ? std::string("tensor") : c10::str("tensors[", i, "]");
    rules.check(tensors[i], who, name);
    if (i > 0) {
      DDP_CHECK(tensors[i].scalar_type() == tensors[0].scalar_type(), who, ": ", name,
                " has dtype ", tensors[i].scalar_type(), ", expected ", tensors[0].scalar_type(),
                " like tensors[0]");
      DDP_CHECK(tensors[i].device() == tensors[0].device(), who, ": ", name, " is on ",
                tensors[i].device(), ", expected ", tensors[0].device(), " like tensors[0]");
    }
  }
}

void check_sparse_allreduce(const at::Tensor& tensor, ReduceOp op, const std::string& who,
                            const TensorRules& rules) {
  DDP_INTERNAL_ASSERT(rules.check_sparse != nullptr, who, ": a sparse allreduce on a backend without one");
  rules.check_sparse(tensor, who, "tensor");
  DDP_CHECK(op == ReduceOp::kSum, who, ": ", to_string(op),
            " is not defined for a sparse tensor; a sparse allreduce adds up every rank's entries "
            "(use SUM)");
}

void check_point_to_point(const at::Tensor& tensor, int peer, int tag, int rank, int size,
                          const std::string& who, const char* role, const TensorRules& rules) {
  rules.check(tensor, who, "tensor");
  DDP_CHECK(peer >= 0 && peer < size && peer != rank, who, ": ", role, " rank ", peer,
            " is invalid (expected another rank in [0, ", size, "), this is rank ", rank, ")");
  DDP_CHECK(tag >= 0, who, ": tag must be non-negative (got ", tag, ")");
}

} // namespace ddp::internal
