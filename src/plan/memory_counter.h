#pragma once

// The CPU tensor memory counter (private header): a wrapper around
// LibTorch's CPU allocator that counts the bytes of the tensors allocated
// through it, now and at their peak. See Note [Counting tensor memory].

#include <cstdint>

namespace ddp::internal {

// Puts the counter in front of LibTorch's CPU allocator, once per process
// (later calls do nothing). Tensors allocated before this call are not
// counted, nor are their frees.
void start_counting_cpu_tensor_memory();
// Whether the counter is in place.
bool counting_cpu_tensor_memory();
// Counts `delta` bytes of tensor memory that was not allocated through the
// CPU allocator (the shared-memory buffers of src/comm/shm/) when counting;
// returns whether it did, so that the matching release is counted alike.
bool count_tensor_bytes_outside_allocator(int64_t delta);
// The bytes of CPU tensors allocated since counting began and not yet freed;
// and the most there has been at once.
int64_t cpu_tensor_bytes();
int64_t peak_cpu_tensor_bytes();
// The most held at once since the previous call (or since counting began),
// and a new window from now.
int64_t start_new_peak_window();
// The most held at once in the current window.
int64_t peak_in_window();

} // namespace ddp::internal
