# Sourced by interop_cases.sh and dcp_cases.sh, after they set `work` (a
# scratch directory), `ddprun`, `main` (checkpoint_interop_main), `python`
# and `interop` (interop.py):
#
#   quietly CMD...      runs CMD, showing its output only when it fails
#   cpp N ARGS...       checkpoint_interop_main on N ranks (0: alone, no launcher)
#   agree A B [TOL]     two torch.save'd state dicts agree within TOL (1e-6)
quietly() {
  local log
  log=$(mktemp "$work/log.XXXXXX")
  if "$@" >"$log" 2>&1; then
    return 0
  fi
  echo "--- $* failed:"
  tail -n 25 "$log"
  return 1
}
cpp() {
  local n=$1
  shift
  if [ "$n" -eq 0 ]; then
    quietly "$main" --parallel plain "$@"
  else
    quietly "$ddprun" --nproc-per-node "$n" "$main" "$@"
  fi
}
agree() {
  quietly "$python" "$interop" compare "$1" "$2" "${3:-1e-6}"
}
