#!/bin/sh
# Checks what ddp says about the BLAS that LibTorch computes with, through
# the ToyModel example's header line ("..., BLAS OpenBLAS, 1 thread") and
# DistributedDataParallel's warning about the reference BLAS.
#
#   run_blas_check_test.sh DDPRUN TOY_MODEL REFERENCE_BLAS_DIR
#
# 1. As built and installed (scripts/setup.sh leaves OpenBLAS in use on
#    Debian): the header names the BLAS that the dynamic linker resolves for
#    the program, and nothing warns.
# 2. Under ddprun with 2 ranks (OMP_NUM_THREADS=1 for each): the BLAS uses 1
#    thread per rank; alone with OMP_NUM_THREADS=2 it may use 2.
# 3. When the program loads a shared libblas.so.3 (Debian's LibTorch):
#    with REFERENCE_BLAS_DIR (which holds the netlib libblas.so.3) first on
#    LD_LIBRARY_PATH, the header says "reference BLAS" and, on 2 ranks,
#    exactly one warning is printed (rank 0's) with the one-line fix. A
#    LibTorch that links its BLAS in (PyPI's wheels: MKL) has nothing to
#    swap, and this part is not run there; the count says so.
#
# Prints "blas check: N of N checks passed" and exits 0, or names each check
# that failed and exits 1.
set -u

if [ $# -ne 3 ]; then
  echo "usage: $0 DDPRUN TOY_MODEL REFERENCE_BLAS_DIR" >&2
  exit 2
fi
ddprun=$1
toy_model=$2
reference_dir=$3

work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-blas-check.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT

. "$(dirname "$0")/../testing/checks.sh"
contains() { grep -q -- "$2" "$1"; }
lacks() { ! grep -q -- "$2" "$1"; }
count_is() { [ "$(grep -c -- "$2" "$1")" -eq "$3" ]; }
show() { echo "--- $1 ---"; cat "$1"; }

# What the dynamic linker gives the program for libblas.so.3, if it loads one.
blas_file=$(ldd "$toy_model" | awk '$1 == "libblas.so.3" {print $3}')
case $(readlink -f "${blas_file:-/nonexistent}" 2>/dev/null) in
  */openblas*) expected="BLAS OpenBLAS" ;;
  */blas/libblas.so.3*) expected="BLAS reference BLAS" ;;
  *) expected="BLAS " ;;
esac
echo "libblas.so.3 of $toy_model: ${blas_file:-none (the BLAS is linked into LibTorch)}"

# 1. As installed.
OMP_NUM_THREADS=2 "$toy_model" >"$work/alone.out" 2>"$work/alone.err"
rc=$?
check "alone: exit status 0 (got $rc)" [ "$rc" -eq 0 ]
check "alone: the header names the linked BLAS ('$expected')" contains "$work/alone.out" "on cpu, backend gloo, $expected"
check "alone: no BLAS warning" lacks "$work/alone.err" "reference BLAS"
if [ "$expected" = "BLAS reference BLAS" ]; then
  echo "note: this machine's libblas.so.3 is the reference BLAS; scripts/setup.sh installs OpenBLAS"
  check "the installed BLAS is an optimized one" false
fi

# 2. Threads.
"$ddprun" --nproc-per-node 2 "$toy_model" >"$work/two.out" 2>"$work/two.err"
rc=$?
check "2 ranks: exit status 0 (got $rc)" [ "$rc" -eq 0 ]
check "2 ranks: each rank's BLAS uses 1 thread" count_is "$work/two.out" "$expected.*, 1 thread$" 2
check "alone with OMP_NUM_THREADS=2: the BLAS may use 2 threads" contains "$work/alone.out" ", 2 threads$"

# 3. The reference BLAS, swapped in.
if [ -n "$blas_file" ]; then
  if [ ! -e "$reference_dir/libblas.so.3" ]; then
    echo "$reference_dir/libblas.so.3 is missing: install the reference BLAS (Debian: apt-get install libblas3; scripts/setup.sh does)"
    check "the reference BLAS is installed" false
  else
    LD_LIBRARY_PATH="$reference_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$ddprun" --nproc-per-node 2 "$toy_model" >"$work/ref.out" 2>"$work/ref.err"
    rc=$?
    check "reference BLAS, 2 ranks: exit status 0 (got $rc)" [ "$rc" -eq 0 ]
    check "reference BLAS: both headers say so" count_is "$work/ref.out" "BLAS reference BLAS, 1 thread$" 2
    check "reference BLAS: exactly one warning, from rank 0" count_is "$work/ref.err" "computes with the reference BLAS" 1
    check "reference BLAS: the warning is rank 0's" contains "$work/ref.err" "\[rank 0\]: .*\[rank 0/2\] DistributedDataParallel: LibTorch computes with the reference BLAS"
    check "reference BLAS: the warning gives the fix" contains "$work/ref.err" "apt-get install libopenblas0-openmp"
  fi
fi

if [ "$checks_failed" -ne 0 ]; then
  for f in "$work"/*.out "$work"/*.err; do show "$f"; done
fi
checks_summary "blas check"
