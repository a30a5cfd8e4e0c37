#!/usr/bin/env bash
# Checkpoints between ddp (C++) and PyTorch (Python), both directions, with
# the PyTorch that PYTHON imports (Debian's 1.13, or 2.11 in the compat
# configuration): checkpoint_interop_main and interop.py train the same
# model (interop_model.h / .py) on the same batches, one side saves, the
# other loads, and one more step on each side must agree within 1e-6;
# where both sides hold the same state, bit for bit.
#
#   torch.save format (any PyTorch): each of Adam, AdamW, SGD, RMSprop and
#     Adagrad both ways in one process; ddp's DDP, ZeRO and FSDP at 2 ranks
#     saving, Python loading; Python saving, ddp's DDP and FSDP at 2 ranks
#     loading; safetensors read by Python's package (or, without it, by the
#     standard library).
#   DCP (PyTorch 2.x with torch.distributed.checkpoint.state_dict): ddp's
#     DDP, ZeRO and FSDP at 2 ranks saving; Python loading alone (bit for bit
#     against the same save in torch.save format), into FSDP2 (fully_shard)
#     and DDP at 1, 2 and 3 ranks; Python's FSDP2 at 2 ranks saving, ddp's
#     FSDP at 3 ranks and ZeRO at 1 loading (bit for bit against Python's
#     torch.save of the same state).
#
# Usage: interop_cases.sh <ddprun> <checkpoint_interop_main> <python3>
# Prints "checkpoint_interop: N of N checks passed" at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../testing/checks.sh"
. "$here/../testing/free_port.sh"
ddprun=$1
main=$2
python=$3
interop=$here/interop.py
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-interop.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
version=$("$python" -c 'import torch; print(torch.__version__)')
echo "PyTorch $version ($python)"

. "$here/cases_lib.sh"

# Each comparison would be a Python start of its own (about 2 s for PyTorch
# 2.11's import, some 40 of them): the checks that compare run their
# command now and record their comparisons (this `agree` replaces
# cases_lib.sh's), and one Python process makes them all at the end
# (interop.py compare-many). Such a check passes when its command succeeded
# and every comparison it recorded agreed; it is reported at the end.
later=()
agree() {
  printf '%s\t%s\t%s\t%s\n' "$current" "$1" "$2" "${3:-1e-6}" >>"$work/compare.list"
}
# check_later DESCRIPTION COMMAND [ARGS...]
check_later() {
  current=${#later[@]}
  later+=("$1")
  shift
  if "$@"; then echo 0 >"$work/status.$current"; else echo 1 >"$work/status.$current"; fi
}
# Whether deferred check $1 passed: its command succeeded, it recorded a
# comparison, and each one it recorded agreed. Shows its comparisons when
# it did not.
verdict() {
  local recorded agreed
  recorded=$(grep -c "^$1	" "$work/compare.list")
  agreed=$(grep -c "^$1 ok " "$work/verdicts")
  if [ "$(cat "$work/status.$1")" = 0 ] && [ "$recorded" -gt 0 ] && [ "$agreed" -eq "$recorded" ]; then
    return 0
  fi
  grep "^$1 " "$work/verdicts" | sed 's/^[0-9]* /  /'
  return 1
}
finish_later() {
  touch "$work/compare.list"
  "$python" "$interop" compare-many "$work/compare.list" >"$work/verdicts" 2>&1
  local i
  for i in "${!later[@]}"; do
    check "${later[$i]}" verdict "$i"
  done
}
# py N ARGS: PyTorch's side on N ranks (0: alone).
py() {
  local n=$1
  shift
  if [ "$n" -eq 0 ]; then
    quietly "$python" "$interop" run --parallel plain "$@"
  else
    quietly "$python" -m torch.distributed.run --nproc_per_node "$n" --master_port "$(free_port "$python")" \
      "$interop" run "$@"
  fi
}

# ---- The cases: each a function, so that a check runs it whole ----
# torch.save format, one process each side, optimizer $1 in $2.
torch_cpp_to_py() {
  cpp 0 --optim "$1" --steps 3 --save-torch "$2/cpp" --then-steps 2 --final "$2/cpp.pt" &&
    py 0 --optim "$1" --load-torch "$2/cpp" --first-step 3 --then-steps 2 --final "$2/py_loaded.pt" &&
    agree "$2/py_loaded.pt" "$2/cpp.pt"
}
torch_py_to_cpp() {
  py 0 --optim "$1" --steps 3 --save-torch "$2/py" --then-steps 2 --final "$2/py.pt" &&
    cpp 0 --optim "$1" --load-torch "$2/py" --first-step 3 --then-steps 2 --final "$2/cpp_loaded.pt" &&
    agree "$2/cpp_loaded.pt" "$2/py.pt"
}
# PyTorch ($1 on $2 ranks, 0: alone) loads what ddp saved in $3 (format $4:
# torch or dcp; with a 5th argument, bit for bit the torch.save files of the
# same state), then one step, against ddp's own next step.
py_loads() {
  local out=$3/py-$1-$2-$4.pt
  py "$2" --parallel "$1" "--load-$4" "$3/$4" ${5:+--expect-torch "$3/torch"} --first-step 3 --then-steps 1 \
    --final "$out" && agree "$out" "$3/final.pt"
}
# ddp ($1 on $2 ranks) loads what PyTorch saved in $3 (format $4).
cpp_loads() {
  local out=$3/cpp-$1-$2-$4.pt
  cpp "$2" --parallel "$1" "--load-$4" "$3/$4" ${5:+--expect-torch "$3/torch"} --first-step 3 --then-steps 1 \
    --final "$out" && agree "$out" "$3/final.pt"
}

# ---- torch.save format ------------------------------------------------------------
for optim in adam adamw sgd rmsprop adagrad; do
  mkdir -p "$work/torch-$optim"
  check_later "$optim, torch.save format: ddp saves, PyTorch loads, the next steps agree" \
    torch_cpp_to_py "$optim" "$work/torch-$optim"
  check_later "$optim, torch.save format: PyTorch saves, ddp loads, the next steps agree" \
    torch_py_to_cpp "$optim" "$work/torch-$optim"
done

for parallel in ddp zero fsdp; do
  d=$work/$parallel
  mkdir -p "$d"
  check "$parallel at 2 ranks saves a torch.save checkpoint, a DCP directory and safetensors" \
    cpp 2 --parallel $parallel --steps 3 --save-torch "$d/torch" --save-dcp "$d/dcp" \
      --save-safetensors "$d/model.safetensors" --then-steps 1 --final "$d/final.pt"
  check_later "$parallel: PyTorch loads the torch.save checkpoint alone, the next step agrees" py_loads plain 0 "$d" torch
  check "$parallel: the safetensors file holds the state dict's tensors, bit for bit" \
    quietly "$python" "$interop" safetensors "$d/model.safetensors" "$d/torch/model.pt"
done
d=$work/from-python
mkdir -p "$d"
check "PyTorch saves in torch.save format (Adam)" py 0 --steps 3 --save-torch "$d/torch" --then-steps 1 --final "$d/final.pt"
for parallel in ddp fsdp; do
  check_later "$parallel at 2 ranks loads PyTorch's torch.save checkpoint, the next step agrees" cpp_loads $parallel 2 "$d" torch
done

# ---- torch.distributed.checkpoint ------------------------------------------------------
if ! "$python" -c 'import torch.distributed.checkpoint.state_dict' >/dev/null 2>&1; then
  echo "PyTorch $version: no torch.distributed.checkpoint.state_dict, the DCP layout ddp writes (PyTorch 2.x's);"
  echo "the DCP cases run in the LibTorch 2.11 configuration (scripts/compat.sh), with PyTorch 2.11"
  check "PyTorch $version has no torch.distributed.checkpoint.state_dict (the reason)" \
    bash -c "! '$python' -c 'import torch.distributed.checkpoint.state_dict' >/dev/null 2>&1"
  finish_later
  checks_summary checkpoint_interop
  exit $?
fi
for parallel in ddp zero fsdp; do
  d=$work/$parallel
  check_later "$parallel's DCP: PyTorch loads it alone, bit for bit, the next step agrees" py_loads plain 0 "$d" dcp bitwise
done
# PyTorch's $1 on $2 ranks loads each of ddp's three DCP saves in turn, in
# one launch (a launch of PyTorch 2.11 costs more than the run), and ends
# each with one step; the checks below compare each against ddp's own step.
py_loads_each() {
  local dirs="" finals="" parallel
  for parallel in ddp zero fsdp; do
    dirs+="${dirs:+,}$work/$parallel/dcp"
    finals+="${finals:+,}$work/$parallel/py-$1-$2-dcp.pt"
  done
  py "$2" --parallel "$1" --load-dcp "$dirs" --first-step 3 --then-steps 1 --final "$finals"
}
for into in fsdp2 ddp; do
  for n in 1 2 3; do
    py_loads_each $into $n # a failure shows as its log, and in the checks: no file to compare
    for parallel in ddp zero fsdp; do
      d=$work/$parallel
      check_later "$parallel's DCP (2 ranks) into PyTorch's $into at $n ranks: the next step agrees" \
        agree "$d/py-$into-$n-dcp.pt" "$d/final.pt"
    done
  done
done
d=$work/fsdp2
mkdir -p "$d"
check "PyTorch's FSDP2 at 2 ranks saves DCP (and the same state in torch.save format)" \
  py 2 --parallel fsdp2 --steps 3 --save-dcp "$d/dcp" --save-torch "$d/torch" --then-steps 1 --final "$d/final.pt"
check_later "PyTorch's FSDP2 DCP into ddp's FSDP at 3 ranks: bit for bit, the next step agrees" cpp_loads fsdp 3 "$d" dcp bitwise
check_later "PyTorch's FSDP2 DCP into ddp's ZeRO at 1 rank: bit for bit, the next step agrees" cpp_loads zero 1 "$d" dcp bitwise
finish_later
checks_summary checkpoint_interop
