#pragma once

// Host buffers of the MPI backend's collectives (private header): packing a
// list of tensors into one flat host tensor and back, and an input that MPI
// may read while it writes the output.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ddp::internal::mpi {

// The elements, and the bytes, of `tensors` together.
int64_t total_numel(const std::vector<at::Tensor>& tensors);
int64_t bytes_of(const std::vector<at::Tensor>& tensors);

// `input` on the host, as a buffer MPI may read while it writes `output`:
// MPI forbids a send buffer that overlaps the receive buffer.
at::Tensor separate_input(const at::Tensor& input, const at::Tensor& output);

// A flat host tensor holding `tensors` one after the other.
at::Tensor packed_on_host(const std::vector<at::Tensor>& tensors);

// `inputs` as one flat host tensor, for a collective that writes `output`:
// a view when the non-empty ones lie end to end in one host storage that
// `output` does not share (a ZeRO stage-2 bucket, laid out by owner), else a
// packed copy.
at::Tensor inputs_on_host(const std::vector<at::Tensor>& inputs, const at::Tensor& output);

// Copies consecutive pieces of the flat `flat` into `outputs`.
void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& outputs);

} // namespace ddp::internal::mpi
