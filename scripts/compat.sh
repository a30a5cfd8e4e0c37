#!/usr/bin/env bash
# Builds and tests ddp against LibTorch 2.11 from PyPI, beside the Debian
# LibTorch 1.13 build of scripts/test.sh: the exact LibTorch that the GPU
# machines run (torch 2.11.0+cu130, with CUDA and NCCL).
#
# Usage: bash scripts/compat.sh [cpu|cuda|all]     (default: all)
#
#   cuda   configure with the wheel's LibTorch and -DDDP_WITH_NCCL=ON, build
#          everything: libddp.so with ProcessGroupNCCL, the GPU tests and the
#          CUDA benchmark must compile and link. Then run the whole CTest
#          suite on the CPU; the GPU tests skip, saying why. The PyTorch
#          parity tests, torchrun's test and the benchmarks' PyTorch side use
#          the wheel's PyTorch 2.11, so the reference is current PyTorch.
#   cpu    the same LibTorch with -DDDP_WITH_NCCL=OFF, the build of a user who
#          has no NCCL: everything, and the whole suite.
#   all    cuda (but the tests of code that uses no LibTorch, $torch_free_tests
#          below, the launcher and random-fault cases, $launcher_tests, repeats at
#          other sizes, $repeat_tests, and the CPU benchmarks with their smoke
#          tests), then cpu reduced to what differs without NCCL: libddp.so,
#          ddprun, the example and the tests whose code depends on it
#          ($cpu_tests below: backend choice and its errors, the installed
#          package, a 2-rank job). Everything else compiles the same in both
#          configurations, and cuda has just run it. (.ci/run runs this.)
#
# What it needs and keeps (outside the clone, so a second run reuses it):
#   $DDP_CACHE_DIR (default ~/.cache/ddp)
#     torch-<version>/   a virtual environment with torch==$DDP_TORCH_VERSION
#                        (default 2.11.0) and its nvidia-* wheels, ~4.7 GB
#     gloo-src/          a Gloo source tree for ddp's private Gloo
#                        (cmake/gloo.cmake), taken from the horovod 0.28.1
#                        source package on PyPI (its third_party/gloo),
#                        checked against a pinned SHA-256
#   the CUDA toolkit of the wheel's major version (13) in /usr/local/cuda, for
#   LibTorch's CMake package; python3 with venv; what scripts/setup.sh
#   installs (CMake, Ninja, g++, GoogleTest).
# Build trees: build-compat-cpu/ and build-compat-cuda/ in the clone
# (build-compat-<version>-<config>/ for another DDP_TORCH_VERSION).
# Optimization: -O1 ($DDP_COMPAT_OPT_FLAGS, default "-O1 -DNDEBUG", as the
# Release flags). These builds check that ddp compiles, links and works
# against this LibTorch; -O1 compiles the library, examples and benchmarks
# in about two thirds of -O3's time. The -O3 library is scripts/test.sh's
# (Debian's LibTorch), and what a benchmark on a GPU machine is built with
# (docs/gpu.md's commands keep the Release default).
#
# Time, measured on an idle 2-core Debian 12 machine (see README.md,
# "Supported versions"): `compat.sh all` with a cold cache took 12 minutes:
# `pip install torch==2.11.0` into a new venv 48 s (4.7 GB installed), the
# Gloo source package 5 s, cuda's build 6 min and its suite 2 min, then
# cpu's reduced build 2.4 min and its 3 tests 13 s.
#
# Prints what it does, then one count line per configuration
# ("compat cpu: 100% tests passed, 0 tests failed out of 45"); exits non-zero
# when a download, a build or a test fails.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
readonly root=$PWD
readonly version=${DDP_TORCH_VERSION:-2.11.0}
readonly cache=${DDP_CACHE_DIR:-$HOME/.cache/ddp}
readonly venv=$cache/torch-$version
readonly gloo_src=$cache/gloo-src
readonly gloo_sdist=horovod==0.28.1
readonly gloo_sdist_sha256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
readonly jobs=${DDP_JOBS:-$(nproc)}
readonly test_jobs=${DDP_TEST_JOBS:-2}
readonly opt_flags=${DDP_COMPAT_OPT_FLAGS:--O1 -DNDEBUG}
# The cpu configuration's targets and tests after cuda's (see the header).
readonly cpu_targets='ddp ddprun init_test toy_model'
readonly cpu_tests='^(init_test|install_consumer|toy_model_2_ranks)$'
# What cuda leaves out under `all`: the tests of code that does not use
# LibTorch (the stores, ddprun, the dump reader), compiled and run alike
# against any LibTorch; scripts/test.sh, which .ci/run runs first, has run
# them. `compat.sh cuda` alone runs them too.
readonly torch_free_tests='^(store_test|tcp_store_test|tcp_store_bounds_test|file_store_test|ddprun_options_test|ddprun_test|flight_recorder_json_test)$'
# And the launcher cases under a real Slurm (a minute) and torchrun's
# elastic agent (47 s): what they check is the environment the launchers
# give and how init.cpp reads it, the same against any LibTorch (init_test
# runs that code here too, toy_model_torchrun_* torchrun's rendezvous); and
# the random-fault runs (scripts/chaos.py, 30 to 45 s each): a launcher
# restarting a program killed at random, whose resume this run checks in
# mnist_train_resume, mnist_train_restart and gpt_train_parity.
readonly launcher_tests='^(slurm_cases|torchrun_elastic|mnist_chaos_short(_torchrun)?|gpt_chaos_short)$'
# And repeats of programs that this run already runs at another size or in
# another mode (as scripts/sanitize.sh's ASAN_SKIPPED): the MPI group at 3
# and 4 ranks (2 stays), ZeRO at 3 ranks (2 stays, and zero_mpi_2_ranks),
# FSDP's activation checkpointing, auto-wrap and deferred construction at
# 3 ranks (2 stays),
# the MNIST example's ZeRO, PowerSGD and IDX runs (accuracy, resume and
# restart stay), and the sweep of exits during start-up (init_test and
# gloo_reinit_test stay). scripts/test.sh has run them all against 1.13;
# about 2 minutes of this run's test time (2026-11-26).
readonly repeat_tests='^(process_group_mpi_test_[34]_ranks|zero_(mpi_)?3_ranks|activation_checkpoint_(mpi_)?3_ranks|fsdp_(auto_wrap|deferred_init)_3_ranks|mnist_train_(zero1|powersgd|idx)|init_exit_sweep)$'

say() {
  echo "compat.sh: $*"
}

die() {
  echo "compat.sh: ERROR: $*" >&2
  exit 1
}

# Seconds since `started`, for the timing lines.
elapsed() {
  echo $(($(date +%s) - $1))
}

case ${1:-all} in
  cpu) configs=(cpu) ;;
  cuda) configs=(cuda) ;;
  all) configs=(cuda cpu) ;;
  *) die "unknown configuration '$1' (expected cpu, cuda or all)" ;;
esac

# ---- 1. The virtual environment with torch -----------------------------------------
started=$(date +%s)
if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
  say "torch $version: reusing $venv"
else
  say "torch $version: creating $venv (pip install torch==$version from PyPI, about 3 GB)"
  mkdir -p "$cache" || die "cannot create $cache"
  rm -rf "$venv"
  python=$(command -v python3) || die "python3 not found"
  "$python" -m venv "$venv" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
  "$venv/bin/pip" install --quiet --upgrade pip || die "pip upgrade failed"
  "$venv/bin/pip" install --quiet "torch==$version" numpy ||
    die "pip install torch==$version failed (is PyPI reachable?)"
fi
site=$("$venv/bin/python" -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))') ||
  die "cannot import torch from $venv"
say "torch $("$venv/bin/python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)') in $site ($(elapsed "$started") s)"

# ---- 2. A Gloo source tree ------------------------------------------------------------
started=$(date +%s)
if [[ -f $gloo_src/gloo/allreduce.cc ]]; then
  say "Gloo source: reusing $gloo_src"
else
  say "Gloo source: fetching $gloo_sdist's source package from PyPI for its third_party/gloo"
  download=$(mktemp -d) || die "mktemp failed"
  "$venv/bin/pip" download --quiet --no-deps --no-binary :all: "$gloo_sdist" -d "$download" ||
    die "pip download $gloo_sdist failed"
  archive=$(ls "$download"/*.tar.gz)
  echo "$gloo_sdist_sha256  $archive" | sha256sum --check --status ||
    die "$archive does not have the pinned SHA-256 $gloo_sdist_sha256"
  tar -xzf "$archive" -C "$download" || die "cannot unpack $archive"
  rm -rf "$gloo_src" && mkdir -p "$gloo_src" &&
    cp -r "$download"/horovod-*/third_party/gloo/. "$gloo_src"/ || die "cannot copy Gloo to $gloo_src"
  rm -rf "$download"
fi
say "Gloo source in $gloo_src ($(elapsed "$started") s)"

# ---- 3. Each configuration ------------------------------------------------------------
cuda_args=()
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cuda_args=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCUDAToolkit_ROOT=/usr/local/cuda)
fi

# The wheel's libtorch_cuda.so needs the libraries of its nvidia-* wheels
# (NCCL among them, which can be newer than /usr/local/cuda's): it finds them
# at run time through its own RUNPATH, but the linker needs to be told where
# they are when it links an executable against it.
nvidia_libs=$(printf '%s:' "$site"/nvidia/*/lib)
link_args=("-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,${nvidia_libs%:}"
           "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath-link,${nvidia_libs%:}")

# Through ccache when it is there (scripts/setup.sh installs it): cpu then
# takes from cuda's objects all but the NCCL backend's (CMakeLists.txt,
# "Compiler cache").
ccache_args=()
command -v ccache >/dev/null 2>&1 && ccache_args=(-DDDP_CCACHE=ON)

declare -A summary
failed=0
for config in "${configs[@]}"; do
  build=$root/build-compat-$config
  [[ $version == 2.11.0 ]] || build=$root/build-compat-$version-$config
  nccl=OFF
  [[ $config == cuda ]] && nccl=ON
  # Under `all`, the CPU benchmarks (and their smoke tests) are left to the
  # Debian build, which scripts/test.sh has built and run; the CUDA one
  # still compiles and links here.
  cpu_benchmarks=ON
  [[ ${#configs[@]} -gt 1 ]] && cpu_benchmarks=OFF
  started=$(date +%s)
  say "[$config] configuring $build (LibTorch $version, DDP_WITH_NCCL=$nccl)"
  # The wheel's torch/ first in the prefix path: its lib/ must win over a
  # Debian LibTorch in /usr/lib. TORCH_CUDA_ARCH_LIST only quiets LibTorch's
  # GPU detection: ddp compiles no CUDA kernels.
  if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=$opt_flags" \
      "-DCMAKE_PREFIX_PATH=$site/torch;$site/torch/share/cmake" \
      -DDDP_WITH_NCCL=$nccl -DNCCL_ROOT="$site/nvidia/nccl" \
      -DDDP_GLOO_SOURCE_DIR="$gloo_src" -DTORCH_CUDA_ARCH_LIST=9.0 \
      -DDDP_TEST_PYTHON="$venv/bin/python" \
      -DDDP_BUILD_TESTS=ON -DDDP_BUILD_EXAMPLES=ON -DDDP_BUILD_BENCHMARKS=ON \
      -DDDP_BUILD_CPU_BENCHMARKS=$cpu_benchmarks \
      "${cuda_args[@]}" "${link_args[@]}" "${ccache_args[@]}" > "$build.configure.log" 2>&1; then
    cat "$build.configure.log"
    summary[$config]="configure FAILED"
    failed=1
    continue
  fi
  grep -E '^-- ddp:' "$build.configure.log"
  targets=()
  filter=()
  if [[ $config == cpu && ${#configs[@]} -gt 1 ]]; then
    # shellcheck disable=SC2206 # split on spaces on purpose
    targets=($cpu_targets)
    filter=(-R "$cpu_tests")
  elif [[ ${#configs[@]} -gt 1 ]]; then
    # Each list is ^(...)$, so they alternate without parentheses of their
    # own: CMake's regular expressions hold at most 10 groups, and CTest
    # runs every test, silently, when its filter has more (found so).
    filter=(-E "$torch_free_tests|$launcher_tests|$repeat_tests")
  fi
  say "[$config] building with $jobs jobs${targets[*]:+ (targets: ${targets[*]})}"
  if ! ninja -C "$build" -j"$jobs" "${targets[@]}"; then
    summary[$config]="build FAILED"
    failed=1
    continue
  fi
  say "[$config] built in $(elapsed "$started") s"
  if [[ $config == cuda ]]; then
    # The proof that the NCCL backend links: libddp.so needs libnccl.
    readelf -d "$build/libddp.so" | grep -q 'libnccl' ||
      { say "[$config] libddp.so does not link libnccl"; summary[$config]="link check FAILED"; failed=1; continue; }
    say "[$config] libddp.so links $(readelf -d "$build/libddp.so" | grep -o 'lib\(nccl\|cudart\|c10_cuda\)[^]]*' | tr '\n' ' ')"
  fi
  if [[ ${#filter[@]} -gt 0 ]]; then
    # A filter that CTest could not compile selects every test: refuse it.
    all=$(ctest --test-dir "$build" -N | grep -cE '^ *Test +#')
    chosen=$(ctest --test-dir "$build" -N "${filter[@]}" | grep -cE '^ *Test +#')
    if [[ $chosen -eq 0 || $chosen -eq $all ]]; then
      say "[$config] the test filter ${filter[*]} selects $chosen of $all tests: not a filter CTest can use"
      summary[$config]="test filter FAILED"
      failed=1
      continue
    fi
    say "[$config] running $chosen of $all tests (${filter[0]} ${filter[1]})"
  fi
  started=$(date +%s)
  log=$build.ctest.log
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$test_jobs" "${filter[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  count=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  summary[$config]=${count:-"ctest printed no summary (exit code $rc)"}
  say "[$config] tests ran in $(elapsed "$started") s"
  [[ $rc -eq 0 ]] || failed=1
done

echo
for config in "${configs[@]}"; do
  echo "compat $config (LibTorch $version): ${summary[$config]}"
done
exit "$failed"
