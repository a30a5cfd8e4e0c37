#!/usr/bin/env bash
# Copies what tests/gpu/verify.sh runs out of a CUDA build tree into a small
# folder, for a GPU machine that has PyTorch (the same LibTorch the build
# used) but no build tools: libddp, ddprun, the GPU tests and the programs
# they launch, toy_model, gpt_train, the benchmarks verify.sh runs, and CTest's files,
# with the binaries stripped (a few tens of MB where the tree has GBs).
#
# Usage: bash tests/gpu/pack.sh BUILD_DIR OUT_DIR
# On the GPU machine, from a checkout of the same commit:
#   mv OUT_DIR build-cuda && bash tests/gpu/unpack.sh build-cuda && bash tests/gpu/verify.sh build-cuda python3
set -euo pipefail
build=$(cd "${1:?usage: pack.sh BUILD_DIR OUT_DIR}" && pwd)
out=${2:?usage: pack.sh BUILD_DIR OUT_DIR}
rm -rf "$out"
mkdir -p "$out/tests" "$out/bench" "$out/examples"
out=$(cd "$out" && pwd)

programs=(ddprun examples/toy_model examples/gpt_train bench/gpu_ddp_step_bench bench/zero_bench bench/fsdp_bench
          tests/checkpoint_interop_main tests/gpu_ddp_parity_main tests/gpu_zero_parity_main tests/gpu_fsdp_parity_main)
# Every test labelled gpu that is a program of the build.
while read -r name; do
  programs+=("tests/$name")
done < <(ctest --test-dir "$build" -N -L gpu 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: \([a-z0-9_]*_test\)$/\1/p')
for p in "${programs[@]}"; do
  [[ -x $build/$p ]] || { echo "pack.sh: $build/$p is not built" >&2; exit 1; }
  cp "$build/$p" "$out/$p"
  strip --strip-debug "$out/$p"
done
cp -P "$build"/libddp.so* "$out/"
strip --strip-debug "$out"/libddp.so.*.*.*
# CTest's description of the tests, everywhere in the tree.
(cd "$build" && find . -name CTestTestfile.cmake -o -name DartConfiguration.tcl | while read -r f; do
  mkdir -p "$out/$(dirname "$f")"
  cp "$f" "$out/$f"
done)
echo "$build" > "$out/.packed_from"
# The interpreter the tests were configured with, which unpack.sh replaces.
sed -n 's/^DDP_TEST_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt" > "$out/.packed_python"
du -sh "$out"
