#pragma once

/// The communication errors. Caller misuse raises `c10::Error` (as
/// TORCH_CHECK does); a failure of the network or of a peer raises one of the
/// `CommError` family below. After a CommError the process group that raised
/// it is unusable and must be destroyed (the contract of Gloo's
/// `docs/errors.md`): other ranks may be mid-collective with no way to resume.
///
/// Thread-safety: the error classes are immutable once thrown (as
/// std::runtime_error), and may be read from any thread.

#include <exception>
#include <stdexcept>
#include <string>

namespace ddp {

/// What to show a user of an error: its message, without the C++ backtrace
/// of internal frames that LibTorch's `c10::Error::what()` carries; with
/// DDP_BACKTRACE=1 in the environment, `what()` whole. The examples and
/// ddp's own messages that quote another error use it.
std::string error_message(const std::exception& error);

/// Base of every communication failure.
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& message) : std::runtime_error(message) {}
};

/// An operation ran past its deadline.
class TimeoutError : public CommError {
 public:
  explicit TimeoutError(const std::string& message) : CommError(message) {}
};

/// A peer failed: it closed its connection, died, or reported an error.
class RemoteError : public CommError {
 public:
  /// `peer_rank` is -1 when the failed peer is not known.
  RemoteError(const std::string& message, int peer_rank)
      : CommError(message), peer_rank_(peer_rank) {}

  /// The rank of the peer that failed, or -1 when it is not known.
  int peer_rank() const noexcept {
    return peer_rank_;
  }

 private:
  int peer_rank_;
};

/// The ranks called different collectives at the same point of their
/// sequence: another collective, or the same one with another dtype, element
/// count, reduce op or root. Raised on every rank that took part; the message
/// names both calls: "[rank 1/2] allreduce #4: rank 0 called allreduce #4
/// with float32[1000] SUM, this rank float32[2000] SUM". On Gloo and MPI no
/// data has moved between the mismatched calls. On NCCL the check runs on
/// the GPU with the collective itself, so the outputs of the mismatched call
/// are garbage, and the group is unusable afterwards (as after any NCCL
/// failure). See Note [Collective fingerprints].
class CollectiveMismatchError : public CommError {
 public:
  explicit CollectiveMismatchError(const std::string& message) : CommError(message) {}
};

/// A local I/O failure: a socket or file operation returned an error, or a
/// peer sent a message that does not parse.
class IoError : public CommError {
 public:
  explicit IoError(const std::string& message) : CommError(message) {}
};

} // namespace ddp
