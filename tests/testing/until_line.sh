# Sourced by the shell tests that wait for a process to reach a point
# (flight_recorder_cases.sh, slurm_cases.sh, torchrun_elastic.sh).
#
#   until_line FILE REGEX [SECONDS]   waits (default 30 s) until a line of
#                                     FILE matches REGEX (grep -E); on time
#                                     out says so and returns 1
until_line() {
  local i
  for ((i = 0; i < ${3:-30} * 10; i++)); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "until_line: no line matching '$2' in $1 after ${3:-30} s"
  return 1
}
