#pragma once

// Argument checks that every ProcessGroup backend makes alike (private
// header): the root rank, list lengths, and tensors against the one
// they must match. Each throws c10::Error through DDP_CHECK with the message
// shape of STYLE.md §4; `who` is "[rank R/W] op".
//
// What a backend supports (devices, dtypes, one GPU per process) stays in the
// backend: the list checks take it as `check_element`, which the backend
// calls with each element and its name ("outputs[2]").

#include <ATen/core/Tensor.h>
#include <c10/util/FunctionRef.h>

#include <string>
#include <vector>

namespace ddp::internal {

// Checks one tensor argument named `what` ("tensor", "outputs[2]").
using ElementCheck = c10::function_ref<void(const at::Tensor& t, const std::string& what)>;

// `root` names a rank of a group of `size`.
void check_root(int root, int size, const std::string& who);

// `t` (named `what`) has the dtype and element count of `reference` (named
// `reference_name`). Devices are the backend's concern.
void check_same_as(const at::Tensor& t, const at::Tensor& reference, const std::string& who,
                   const std::string& what, const std::string& reference_name);

// The tensors of allreduce_coalesced: at least one, each passing
// `check_element`, all of the dtype and device of the first. One tensor is
// named "tensor", several "tensors[i]".
void check_coalesced(const std::vector<at::Tensor>& tensors, const std::string& who,
                     ElementCheck check_element);

// `list` (named `what`: "outputs", "inputs") holds one tensor per rank, each
// passing `check_element` (allgather, reduce_scatter).
void check_one_per_rank(const std::vector<at::Tensor>& list, int size, const std::string& who,
                        const char* what, ElementCheck check_element);

// Like check_one_per_rank on the root; empty on every other rank (gather's
// outputs, scatter's inputs).
void check_root_only_list(const std::vector<at::Tensor>& list, int rank, int root, int size,
                          const std::string& who, const char* what, ElementCheck check_element);

} // namespace ddp::internal
