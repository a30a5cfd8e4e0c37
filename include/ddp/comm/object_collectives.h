#pragma once

/// Object collectives, PyTorch's `broadcast_object_list`,
/// `all_gather_object`, `gather_object` and `scatter_object_list`, and
/// its point-to-point `send_object_list` and `recv_object_list`: send
/// what a C++ program has to send (a config, a metrics dict, a vocabulary)
/// to every rank. Objects are `c10::IValue`s (tensors, strings, numbers,
/// lists, dicts, tuples, in any nesting), serialized with
/// `torch::pickle_save` (which Python's `torch.load` reads too), or raw
/// bytes (`std::string`). Ranks (`src`, `dst`) are global ranks, as in
/// PyTorch; `group` nullptr is the default group. Each call blocks until the
/// transfer is done (within the group's timeout). See
/// docs/collectives.md.
///
/// What travels: every object is framed (a header with its length and a
/// checksum), so that a damaged or truncated one is a `c10::Error` naming
/// the rank it came from, never a crash; then, as PyTorch does, the sizes
/// first and one byte buffer padded to the largest. On NCCL the buffers
/// are on the current CUDA device.

#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>

namespace ddp {

/// On `src`, sends `objects`; elsewhere, replaces them with `src`'s. Every
/// rank passes a list of the same length.
void broadcast_object_list(std::vector<c10::IValue>& objects, int src = 0,
                           const std::shared_ptr<ProcessGroup>& group = nullptr);

/// `objects` becomes every rank's `object`, in group-rank order.
void all_gather_object(std::vector<c10::IValue>& objects, const c10::IValue& object,
                       const std::shared_ptr<ProcessGroup>& group = nullptr);

/// On `dst`, `*gathered` becomes every rank's `object` (pass a list there,
/// nullptr elsewhere).
void gather_object(const c10::IValue& object, std::vector<c10::IValue>* gathered, int dst = 0,
                   const std::shared_ptr<ProcessGroup>& group = nullptr);

/// On `src`, `inputs` holds one object per rank; every rank's `output[0]`
/// becomes its own (`output` must hold at least one element, as PyTorch's
/// `scatter_object_output_list`).
void scatter_object_list(std::vector<c10::IValue>& output, const std::vector<c10::IValue>& inputs,
                         int src = 0, const std::shared_ptr<ProcessGroup>& group = nullptr);

/// Sends `objects` to global rank `dst`, which receives them with
/// `recv_object_list` (PyTorch's `send_object_list`). Blocks until they are
/// sent; throws `c10::Error` when `dst` is this rank or not in the group.
void send_object_list(const std::vector<c10::IValue>& objects, int dst,
                      const std::shared_ptr<ProcessGroup>& group = nullptr);

/// Replaces `objects` with the list that global rank `src` sends with
/// `send_object_list` (PyTorch's `recv_object_list`, with a source always
/// given); returns `src`, as PyTorch returns the sender. `objects` must have
/// the sent list's length: when it has not, every message is still taken
/// (the pair stays in step) and `c10::Error` says both lengths.
int recv_object_list(std::vector<c10::IValue>& objects, int src,
                     const std::shared_ptr<ProcessGroup>& group = nullptr);

/// Raw bytes: the same, for byte strings the program encodes itself.
void broadcast_bytes_list(std::vector<std::string>& objects, int src = 0,
                          const std::shared_ptr<ProcessGroup>& group = nullptr);
void all_gather_bytes(std::vector<std::string>& objects, const std::string& object,
                      const std::shared_ptr<ProcessGroup>& group = nullptr);
void gather_bytes(const std::string& object, std::vector<std::string>* gathered, int dst = 0,
                  const std::shared_ptr<ProcessGroup>& group = nullptr);
void scatter_bytes_list(std::vector<std::string>& output, const std::vector<std::string>& inputs, int src = 0,
                        const std::shared_ptr<ProcessGroup>& group = nullptr);
void send_bytes_list(const std::vector<std::string>& objects, int dst,
                     const std::shared_ptr<ProcessGroup>& group = nullptr);
int recv_bytes_list(std::vector<std::string>& objects, int src, const std::shared_ptr<ProcessGroup>& group = nullptr);

} // namespace ddp
