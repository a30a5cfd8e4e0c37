#pragma once

/// Which BLAS this process's LibTorch computes with, found at run time.
///
/// Debian's LibTorch calls whatever `libblas.so.3` resolves to. On a machine
/// with no optimized BLAS that is the netlib reference implementation, about
/// 3-4 times slower on a model's matrix products than OpenBLAS; nothing
/// fails, training is just slow. `blas_in_use()` names what was loaded, so
/// that a program (the examples and benchmarks do) can print it, and
/// `DistributedDataParallel` warns once, on rank 0, when it is the reference
/// one. Thread-safe; the answer is computed once per process.

#include <string>

namespace ddp {

/// What `blas_in_use()` found.
struct BlasInfo {
  /// "OpenBLAS", "MKL", "BLIS", "ATLAS", "reference BLAS" (netlib), or
  /// "unknown" when no BLAS library is loaded and LibTorch names none.
  std::string name;
  /// The implementation's own description when it has one, e.g. OpenBLAS's
  /// `openblas_get_config()`: "OpenBLAS 0.3.21 USE_OPENMP Zen MAX_THREADS=64".
  /// Empty otherwise.
  std::string config;
  /// The file the loaded `libblas.so*` resolves to (symbolic links followed,
  /// e.g. "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3"), or the
  /// vendor library's; empty when the BLAS is linked into LibTorch itself
  /// (PyPI's wheels link MKL statically).
  std::string library;
  /// True for the netlib reference BLAS: a `libblas.so*` that exports none
  /// of the optimized implementations' entry points.
  bool is_reference = false;

  /// One line: "OpenBLAS 0.3.21 USE_OPENMP Zen MAX_THREADS=64 (/usr/lib/...)".
  std::string describe() const;
  /// A single word for key=value result lines: "OpenBLAS", "MKL",
  /// "reference-BLAS", ...
  std::string token() const;
};

/// How many threads the BLAS of this process uses for one call now:
/// OpenBLAS's own count (`openblas_get_num_threads()`; Debian's OpenMP build
/// follows OMP_NUM_THREADS, which ddprun sets to 1 per rank, and
/// torch::set_num_threads), 1 for the reference BLAS, LibTorch's intra-op
/// thread count for an MKL linked into LibTorch (LibTorch sets MKL's), and -1
/// when it cannot be known.
int blas_num_threads();

/// The BLAS of this process, as loaded now. Computed on the first call (it
/// loads LibTorch's CPU kernels if they are not already loaded) and cached.
const BlasInfo& blas_in_use();

} // namespace ddp
