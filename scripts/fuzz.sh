#!/usr/bin/env bash
# Builds the TCPStore protocol fuzzer (tests/store/fuzz) with clang and runs
# it for a fixed time. CI calls it.
#
# Usage: bash scripts/fuzz.sh [seconds]
#
#   seconds   how long libFuzzer runs (default: 60, or $DDP_FUZZ_SECONDS)
#
# 1. Installs clang and its fuzzer runtime if missing (Debian 12: clang,
#    libclang-rt-14-dev; through sudo when not root), plus what any ddp build
#    needs (libtorch-dev, cmake, ninja-build).
# 2. Configures build-fuzz/ (or $DDP_FUZZ_BUILD_DIR) with clang++ and
#    -DDDP_BUILD_FUZZERS=ON, tests, examples and benchmarks off, and builds
#    only tcp_store_protocol_fuzz (8 translation units, with ASan and UBSan).
# 3. Runs it on a working corpus in the build directory, seeded from
#    tests/store/fuzz/corpus, for the given time.
#
# Exit code: 0 when the run ended without a finding; libFuzzer's non-zero code
# when it found a crash, a sanitizer report, a leak or a failed oracle, with
# the input that did it saved as build-fuzz/fuzz-artifacts/crash-* (reproduce:
# build-fuzz/tcp_store_protocol_fuzz build-fuzz/fuzz-artifacts/crash-...);
# non-zero, naming the step, when the build fails.
#
# Time, measured on a 2-CPU Debian 12 machine (shared with other builds)
# with the packages installed, from an empty build directory: configure and
# build 13-20 s, run 60 s, 74-82 s in all; a second call rebuilds nothing.
# Where clang or libclang-rt-14-dev is missing, add the time to install them.
# A run makes about 1.6 million executions and peaks at ~550 MB of memory
# (AddressSanitizer's quarantine).

set -euo pipefail

say() {
  echo "fuzz.sh: $*"
}

die() {
  echo "fuzz.sh: ERROR: $*" >&2
  exit 1
}

cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-${DDP_FUZZ_SECONDS:-60}}
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || die "seconds must be a positive integer (got '$seconds')"
build_dir=${DDP_FUZZ_BUILD_DIR:-build-fuzz}
target=tcp_store_protocol_fuzz

# ---- 1. Packages --------------------------------------------------------------
packages=(clang libclang-rt-14-dev libtorch-dev cmake ninja-build)
if command -v dpkg-query >/dev/null 2>&1; then
  missing=()
  for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$package")
    fi
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    say "installing ${missing[*]}"
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
      command -v sudo >/dev/null 2>&1 || die "not root and sudo not found; as root, run: apt-get install ${missing[*]}"
      sudo=(sudo)
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update || die "apt-get update failed"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "${missing[@]}" || die "apt-get install ${missing[*]} failed"
  fi
fi
command -v clang++ >/dev/null 2>&1 || die "clang++ not found; install clang (and its libFuzzer runtime)"

# ---- 2. Configure and build ----------------------------------------------------
start=$SECONDS
say "configuring $build_dir with clang++"
mkdir -p "$build_dir"
log=$build_dir/fuzz-configure.log
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DDDP_BUILD_FUZZERS=ON \
  -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_EXAMPLES=OFF -DDDP_BUILD_BENCHMARKS=OFF -DDDP_WITH_MPI=OFF \
  >"$log" 2>&1 || {
  tail -n 30 "$log" >&2
  die "configuring $build_dir failed (log: $log)"
}
grep -q "^DDP_HAVE_LIBFUZZER:INTERNAL=1" "$build_dir/CMakeCache.txt" ||
  die "clang++ cannot link -fsanitize=fuzzer (on Debian 12: apt-get install libclang-rt-14-dev)"
say "building $target"
ninja -C "$build_dir" "$target" || die "building $target failed"
say "built in $((SECONDS - start)) s"

# ---- 3. Run ---------------------------------------------------------------------
corpus=$build_dir/fuzz-corpus
artifacts=$build_dir/fuzz-artifacts
mkdir -p "$corpus" "$artifacts"
cp -n tests/store/fuzz/corpus/* "$corpus/"
say "running $target for $seconds s (corpus $corpus, findings in $artifacts)"
rc=0
# -max_len: a few messages; longer inputs find nothing more in a parser whose
# every length is checked against what is left. -rss_limit_mb: a parser that
# allocated what a length prefix announced would trip it.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
  "$build_dir/$target" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=1024 \
  -timeout=10 -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" || rc=$?
if [[ $rc -ne 0 ]]; then
  say "FAILED: libFuzzer exited with code $rc; the input is in $artifacts/"
  exit "$rc"
fi
say "no finding in $seconds s"
