#!/usr/bin/env bash
# Sets up a Debian 12 machine for ddp and builds it.
#
# Usage: bash scripts/setup.sh [build-dir]
#
#   1. Installs the Debian packages ddp needs, if any is missing (apt-get,
#      through sudo when not root), and checks that Debian's LibTorch then
#      computes with OpenBLAS, not the reference BLAS (see "BLAS" below).
#   2. Configures the build in <build-dir> (default: build, or $DDP_BUILD_DIR):
#      CMake, Ninja, Release, with tests, examples and benchmarks, through
#      ccache (DDP_CCACHE). Extra CMake
#      arguments may be given in $DDP_CMAKE_ARGS; they come last, so that
#      e.g. DDP_CMAKE_ARGS="-DDDP_BUILD_BENCHMARKS=OFF" wins.
#   3. Builds with ninja -j<jobs> (default: the number of CPUs, fewer when
#      memory is short; or $DDP_JOBS) what the README's first command runs:
#      libddp.so, ddprun and the examples. $DDP_BUILD_TARGETS (space-separated)
#      names other targets instead: "all" builds everything (scripts/test.sh
#      does, reusing this build), scripts/sanitize.sh names its own.
#
# Running it again is cheap: nothing is installed when nothing is missing, and
# Ninja rebuilds only what changed. Runs from any directory; paths are
# relative to the repository root. Exits non-zero, naming the step that
# failed, when anything fails.

set -euo pipefail

# libopenmpi-dev and openmpi-bin: the MPI backend (ProcessGroupMPI) and the
# mpirun that its tests and benchmarks start jobs with.
# libopenblas0-openmp: see "BLAS" below. libblas3 is the reference BLAS
# itself: the test that checks ddp's warning about it loads it on purpose.
# ccache: the build compiles through it (DDP_CCACHE in CMakeLists.txt), so
# that another build tree of the same clone (the sanitizers') reuses this
# one's objects.
packages=(libtorch-dev libgloo-dev libgtest-dev nlohmann-json3-dev cmake ninja-build g++ python3-torch
          libopenmpi-dev openmpi-bin libopenblas0-openmp libblas3 ccache)
# The test suite's only: slurmctld, slurmd, slurm-client and munge for the
# launcher cases under a real Slurm (tests/launch/slurm/: the test starts
# its own daemons with its own configuration; on a machine with systemd,
# Debian's packages also enable munge.service and slurmd.service, which do
# nothing without an /etc/slurm/slurm.conf), iproute2 for its two-node
# cluster's network namespaces (and netem_cases' two hosts). Installed when the build includes the
# tests (DDP_BUILD_TARGETS=all, as scripts/test.sh sets it).
if [[ " ${DDP_BUILD_TARGETS:-} " == *" all "* ]]; then
  packages+=(slurmctld slurmd slurm-client munge iproute2)
fi
readonly packages
# What the README's first command builds and runs (the rest is test.sh's).
readonly default_targets="ddp ddprun toy_model"

say() {
  echo "setup.sh: $*"
}

die() {
  echo "setup.sh: ERROR: $*" >&2
  exit 1
}

step="starting"
on_exit() {
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "setup.sh: FAILED while $step (exit code $rc)" >&2
  fi
}
trap on_exit EXIT

# Prints a command, then runs it.
run() {
  echo "+ $*"
  "$@"
}

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_dir=${1:-${DDP_BUILD_DIR:-build}}

# ---- 1. Packages --------------------------------------------------------------
step="checking the Debian packages"
if [[ -r /etc/os-release ]]; then
  # shellcheck disable=SC1091
  os_id=$(. /etc/os-release && echo "${ID:-}:${VERSION_ID:-}")
  if [[ $os_id != "debian:12" ]]; then
    say "warning: this is '$os_id', not Debian 12; the package names below are Debian 12's"
  fi
fi
command -v dpkg-query >/dev/null 2>&1 ||
  die "dpkg-query not found: this script installs Debian packages with apt-get. On another \
system install ${packages[*]} (or their equivalents: LibTorch 1.13, Gloo, GoogleTest, nlohmann/json 3.x, CMake >= 3.18, \
Ninja, a C++17 compiler, an MPI with mpirun) and run: cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build"

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  say "packages: all installed (${packages[*]})"
else
  step="installing ${missing[*]}"
  say "packages: missing ${missing[*]}; installing them"
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 ||
      die "not root and sudo not found; as root, run: apt-get install ${missing[*]}"
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update ||
    die "apt-get update failed (is the network or the Debian mirror reachable?)"
  run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}" ||
    die "apt-get install ${missing[*]} failed"
fi

# ---- BLAS -------------------------------------------------------------------------
# Debian's LibTorch calls whatever libblas.so.3 the alternatives system points
# at. With only libblas3 installed that is the netlib reference BLAS, 3-4x
# slower on a model's matrix products (docs/benchmarks.md). OpenBLAS's OpenMP build, not its pthread one: Debian's
# LibTorch runs its own parallel loops on OpenMP (libgomp), and the OpenMP
# OpenBLAS shares that one thread pool, so OMP_NUM_THREADS (ddprun sets 1 per
# rank) and torch::set_num_threads bound both, a BLAS call made inside one
# of LibTorch's parallel regions runs on that thread instead of starting more,
# and no second pool of spinning pthreads competes with the other ranks.
# Correctness: Debian's OpenBLAS 0.3.21 is a DYNAMIC_ARCH build that picks its
# kernels from the processor (Zen on the AMD EPYC machines ddp is tested on;
# the whole suite and the parity tests pass with it). Some older OpenBLAS
# builds mis-detect newer processors and compute wrong results or crash there;
# OPENBLAS_CORETYPE (e.g. Haswell) then overrides the choice. setup.sh sets
# nothing: ddp::blas_in_use().config shows what OpenBLAS chose.
step="checking the BLAS that LibTorch uses"
torch_cpu=$(ls /usr/lib/*/libtorch_cpu.so* 2>/dev/null | head -n 1 || true)
if [[ -n $torch_cpu ]]; then
  blas=$(ldd "$torch_cpu" 2>/dev/null | awk '$1 == "libblas.so.3" {print $3}')
  if [[ -z $blas || $blas == "not" ]]; then
    say "warning: $torch_cpu does not load libblas.so.3 (ldd); cannot check its BLAS"
  else
    blas_file=$(readlink -f "$blas")
    case $blas_file in
      */openblas*) say "BLAS: LibTorch's libblas.so.3 is OpenBLAS ($blas_file)" ;;
      */blas/libblas.so.3*)
        say "warning: LibTorch's libblas.so.3 is the reference BLAS ($blas_file), 3-4x slower. \
The alternatives system was set by hand; to use OpenBLAS: update-alternatives --auto libblas.so.3-$(uname -m)-linux-gnu" ;;
      *) say "BLAS: LibTorch's libblas.so.3 is $blas_file" ;;
    esac
  fi
fi

# ---- 2. Configure ---------------------------------------------------------------
step="configuring $build_dir"
cache=$build_dir/CMakeCache.txt
if [[ -f $cache ]]; then
  generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$cache")
  if [[ $generator != "Ninja" ]]; then
    die "$build_dir was configured with the '$generator' generator, not Ninja; \
remove it (rm -rf $build_dir) or pass another build directory"
  fi
fi
# shellcheck disable=SC2206 # DDP_CMAKE_ARGS is split on spaces on purpose
extra_args=(${DDP_CMAKE_ARGS:-})
# Tests, examples and benchmarks are named ON explicitly: a build directory
# configured earlier with any of them OFF would otherwise keep it OFF from its
# cache, and test.sh would then run stale or missing tests. So is the MPI
# backend: the packages above provide it, and ON makes a missing MPI an error
# here rather than a backend silently left out.
say "configuring $build_dir (Release, Ninja, with tests, examples, benchmarks and the MPI backend)"
run cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DDDP_BUILD_TESTS=ON -DDDP_BUILD_EXAMPLES=ON -DDDP_BUILD_BENCHMARKS=ON -DDDP_WITH_MPI=ON \
  -DDDP_CCACHE=ON \
  "${extra_args[@]}"

# ---- 3. Build -------------------------------------------------------------------
step="building $build_dir"
jobs=${DDP_JOBS:-}
if [[ -z $jobs ]]; then
  jobs=$(nproc)
  # A translation unit that includes <torch/torch.h> takes up to ~1.5 GiB to
  # compile; keep 2 GiB per job so that a small machine does not run out of
  # memory.
  avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null || echo 0)
  if [[ $avail_kib -gt 0 ]]; then
    by_memory=$((avail_kib / (2 * 1024 * 1024)))
    ((by_memory >= 1)) || by_memory=1
    ((jobs <= by_memory)) || jobs=$by_memory
  fi
fi
# shellcheck disable=SC2206 # DDP_BUILD_TARGETS is split on spaces on purpose
targets=(${DDP_BUILD_TARGETS:-$default_targets})
say "building $build_dir with $jobs jobs${targets[*]:+ (targets: ${targets[*]})}"
run ninja -C "$build_dir" -j"$jobs" "${targets[@]}"

step="finishing"
say "done: built ${targets[*]} in $build_dir"
if [[ -x $build_dir/examples/toy_model ]]; then
  say "try: $build_dir/ddprun --nproc-per-node 2 $build_dir/examples/toy_model"
fi
