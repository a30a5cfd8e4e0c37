#!/usr/bin/env bash
# The install test: installs a ddp build into a temporary prefix, then builds
# the consumer project against that prefix and runs it under the installed
# ddprun with 2 ranks, and alone as a world of size 1.
#
# Usage: run_install_test.sh <cmake> <ddp-build-dir> <consumer-source-dir> [<c++ compiler> [<exe linker flags>]]
# (registered with CTest by tests/install/install.cmake). Exits 0 when every
# step passes; otherwise prints the step that failed and exits 1. The
# temporary directory is removed on success and kept on failure.

set -euo pipefail

if [[ $# -lt 3 || $# -gt 5 ]]; then
  echo "usage: $0 <cmake> <ddp-build-dir> <consumer-source-dir> [<c++ compiler> [<exe linker flags>]]" >&2
  exit 2
fi
cmake_bin=$1
build_dir=$2
consumer_src=$3
cxx=${4:-}
exe_linker_flags=${5:-}

work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-install-test.XXXXXX")
prefix=$work/prefix
consumer_build=$work/consumer-build
step="start"

on_exit() {
  local rc=$?
  if [[ $rc -eq 0 ]]; then
    rm -rf "$work"
  else
    echo "install test: FAILED at: $step (files kept in $work)" >&2
  fi
}
trap on_exit EXIT

# Every launcher variable that init_process_group reads, so that the run
# "alone" really is a world of size 1 even when the test itself runs under a
# launcher (Slurm, Open MPI, torchrun).
launcher_vars=(RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
  SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NTASKS_PER_NODE
  OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
  OMPI_COMM_WORLD_LOCAL_SIZE)
unset_launcher_vars=()
for var in "${launcher_vars[@]}"; do
  unset_launcher_vars+=(-u "$var")
done

run() {
  echo "+ $*"
  "$@"
}

step="cmake --install"
run "$cmake_bin" --install "$build_dir" --prefix "$prefix"

step="checking the installed files"
for file in bin/ddprun include/ddp/ddp.h; do
  [[ -e $prefix/$file ]] || { echo "missing in the install: $file" >&2; exit 1; }
done
config=$(find "$prefix" -name ddpConfig.cmake -print -quit)
[[ -n $config ]] || { echo "missing in the install: ddpConfig.cmake" >&2; exit 1; }

step="configuring the consumer"
configure_args=(-S "$consumer_src" -B "$consumer_build" -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_PREFIX_PATH="$prefix"
  # Only the prefix may provide ddp: not the package registry.
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
if [[ -n $cxx ]]; then
  configure_args+=(-DCMAKE_CXX_COMPILER="$cxx")
fi
if [[ -n $exe_linker_flags ]]; then
  configure_args+=(-DCMAKE_EXE_LINKER_FLAGS="$exe_linker_flags")
fi
run "$cmake_bin" "${configure_args[@]}"

step="checking which ddp the consumer found"
found_dir=$(sed -n 's/^ddp_DIR:PATH=//p' "$consumer_build/CMakeCache.txt")
if [[ $found_dir != "$prefix"/* ]]; then
  echo "the consumer found ddp in '$found_dir', not under $prefix" >&2
  exit 1
fi

step="building the consumer"
run "$cmake_bin" --build "$consumer_build" -j 2

step="checking that the consumer links the installed libddp"
lib=$(ldd "$consumer_build/consumer" | awk '/libddp\.so/ {print $3}')
if [[ $lib != "$prefix"/* ]]; then
  echo "the consumer loads libddp from '$lib', not from $prefix" >&2
  exit 1
fi

step="running the consumer under the installed ddprun with 2 ranks"
output=$(run env "${unset_launcher_vars[@]}" "$prefix/bin/ddprun" --nproc-per-node 2 \
  "$consumer_build/consumer" 2>&1) || { echo "$output"; exit 1; }
echo "$output"
for rank in 0 1; do
  if ! grep -q "^\[rank $rank\]: consumer: rank $rank of 2: allreduce sum 3 .*: OK$" <<<"$output"; then
    echo "rank $rank did not report a correct sum" >&2
    exit 1
  fi
done

step="running the consumer alone (a world of size 1)"
output=$(run env "${unset_launcher_vars[@]}" "$consumer_build/consumer" 2>&1) ||
  { echo "$output"; exit 1; }
echo "$output"
if ! grep -q "^consumer: rank 0 of 1: allreduce sum 1 .*: OK$" <<<"$output"; then
  echo "the consumer alone did not report a correct sum" >&2
  exit 1
fi

echo "install test: OK"
