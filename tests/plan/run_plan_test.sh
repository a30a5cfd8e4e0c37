#!/bin/sh
# The plan (`ddprun --plan`, docs/scaling.md) against what can be checked.
#
# memory: a plan's peak memory against a real run's. examples/gpt as DDP,
# ZeRO and FSDP, planned with `ddprun --plan 2,3` (one process, the fake
# backend) and run for real on 2 and 3 ranks with DDP_PLAN_REPORT, each
# writing its peak CPU tensor memory. Every real rank's peak must be within
# 10% of the plan's. DDP and ZeRO match to the byte (ZeRO's last rank owns a
# little less); FSDP on Gloo within one host reduces its gradients in
# buffers that the ranks map and gathers its units in common memory, which
# the fake by default, like NCCL or Gloo across hosts, does not use: 3.4%
# here. With DDP_FAKE_SHM=1 the fake shares buffers as Gloo does, and the
# plan of FSDP must then be within 1% of the real runs (it is to the byte).
# And a run that fails is reported with its output, and ddprun --plan
# exits 1.
#
# large-world: a plan at a world no machine here has. examples/gpt, 303M
# parameters (1.2 GB of float32), as rank 0 of 1024 under FSDP with
# deferred construction, in one process (`ddprun --plan 1024`). The process
# must never hold the whole model: its peak CPU tensor memory stays under
# 35% of the parameters' bytes (it holds 1/1024 of each unit, one gathered
# unit at a time, activations and construction's transients). And the step
# must send what full sharding sends: each unit gathered in forward and in
# backward and its gradients reduce-scattered, 3 (W - 1)/W of the
# parameters' bytes, less the units not gathered again in backward (between
# 2.9 and 3.0 of them). docs/scaling.md runs the same for 7B.
#
#   run_plan_test.sh memory|large-world DDPRUN GPT_TRAIN PYTHON WORK_DIR
set -eu
if [ $# -ne 5 ]; then
  echo "usage: $0 memory|large-world DDPRUN GPT_TRAIN PYTHON WORK_DIR" >&2
  exit 2
fi
mode=$1
ddprun=$2
train=$3
python=$4
work=$5
rm -rf "$work"
mkdir -p "$work"

memory() {
  model="--steps 3 --sample 0 --layers 4 --embd 256"

  echo "+ ddprun --plan 2,3 --plan-variant ddp=... zero=... fsdp=... gpt_train $model"
  # shellcheck disable=SC2086 # $model is several arguments
  if ! "$ddprun" --plan 2,3 --plan-dir "$work/plan" --plan-variant "ddp=--parallel ddp" \
      --plan-variant "zero=--parallel zero" --plan-variant "fsdp=--parallel fsdp" \
      "$train" $model >"$work/plan.log" 2>&1; then
    cat "$work/plan.log"
    echo "FAIL: ddprun --plan exited with an error"
    exit 1
  fi
  cat "$work/plan.log"
  echo "+ DDP_FAKE_SHM=1 ddprun --plan 2,3 --plan-variant fsdp=... gpt_train $model"
  # shellcheck disable=SC2086
  if ! DDP_FAKE_SHM=1 "$ddprun" --plan 2,3 --plan-dir "$work/plan_shm" --plan-variant "fsdp=--parallel fsdp" \
      "$train" $model >"$work/plan_shm.log" 2>&1; then
    cat "$work/plan_shm.log"
    echo "FAIL: ddprun --plan with DDP_FAKE_SHM=1 exited with an error"
    exit 1
  fi
  cat "$work/plan_shm.log"
  for variant in ddp zero fsdp; do
    for world in 2 3; do
      echo "+ DDP_PLAN_REPORT=$work/real_${variant}_$world ddprun --nproc-per-node $world gpt_train $model --parallel $variant"
      # shellcheck disable=SC2086
      if ! DDP_PLAN_REPORT="$work/real_${variant}_$world" "$ddprun" --nproc-per-node "$world" \
          "$train" $model --parallel "$variant" >"$work/real_${variant}_$world.log" 2>&1; then
        cat "$work/real_${variant}_$world.log"
        echo "FAIL: the real run of $variant on $world ranks exited with an error"
        exit 1
      fi
    done
  done
  # A run that fails is reported with its output, and ddprun --plan exits 1.
  echo "+ ddprun --plan 2 gpt_train --no-such-flag"
  if "$ddprun" --plan 2 --plan-dir "$work/bad" "$train" --no-such-flag >"$work/bad.log" 2>&1; then
    cat "$work/bad.log"
    echo "FAIL: ddprun --plan exited 0 although the program failed"
    exit 1
  fi
  grep -q "at world 2 exited with code" "$work/bad.log" && grep -q "no-such-flag" "$work/bad.log" &&
    grep -q "1 of 1 runs failed" "$work/bad.log" ||
    { cat "$work/bad.log"; echo "FAIL: ddprun --plan did not report the failed run and its output"; exit 1; }
  "$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
worst = 0.0
failed = False
# (variant, where its plan is, its tolerance): fsdp_shm is fsdp planned with DDP_FAKE_SHM=1.
for variant, folder, tolerance in (("ddp", "plan", 0.10), ("zero", "plan", 0.10), ("fsdp", "plan", 0.10),
                                   ("fsdp", "plan_shm", 0.01)):
    for world in (2, 3):
        plan = json.load(open(f"{work}/{folder}/{variant}_w{world}/plan_rank_0.json"))
        assert plan["backend"] == "fake" and plan["world_size"] == world, plan
        for rank in range(world):
            real = json.load(open(f"{work}/real_{variant}_{world}/plan_rank_{rank}.json"))
            assert real["backend"] == "gloo" and real["rank"] == rank, real
            ratio = plan["peak_tensor_bytes"] / real["peak_tensor_bytes"]
            worst = max(worst, abs(ratio - 1))
            ok = abs(ratio - 1) <= tolerance
            failed |= not ok
            name = variant + (" (DDP_FAKE_SHM=1)" if folder == "plan_shm" else "")
            print(f"{name:21} world {world} rank {rank}: plan {plan['peak_tensor_bytes'] / 2**20:8.2f} MiB, "
                  f"real {real['peak_tensor_bytes'] / 2**20:8.2f} MiB, plan/real {ratio:.4f}" +
                  ("" if ok else f"  <- more than {tolerance:.0%} apart"))
print(f"check_plan_memory: worst difference {worst:.1%}")
print("check_plan_memory: FAIL" if failed else "check_plan_memory: OK")
sys.exit(1 if failed else 0)
PY
}

large_world() {
  echo "+ ddprun --plan 1024 gpt_train --parallel fsdp --meta-init --layers 24 --embd 1024 ..."
  if ! "$ddprun" --plan 1024 --plan-dir "$work" "$train" --parallel fsdp --meta-init --layers 24 --embd 1024 \
      --heads 16 --block 16 --batch 1 --steps 1 --sample 0 >"$work/plan.log" 2>&1; then
    cat "$work/plan.log"
    echo "FAIL: ddprun --plan exited with an error"
    exit 1
  fi
  cat "$work/plan.log"
  "$python" - "$work" <<'PY'
import json, re, sys
work = sys.argv[1]
output = open(f"{work}/run_w1024/output.txt").read()
print(output.strip())
parameters = float(re.search(r"([0-9.]+)M parameters", output).group(1)) * 1e6
report = json.load(open(f"{work}/run_w1024/plan_rank_0.json"))
world = report["world_size"]
assert world == 1024 and report["backend"] == "fake", report
param_bytes = 4 * parameters
held = report["peak_tensor_bytes"] / param_bytes
sent = report["step_bytes_sent"][0] / (param_bytes * (world - 1) / world)
print(f"check_plan_large_world: peak tensor memory {report['peak_tensor_bytes'] / 2**20:.1f} MiB = "
      f"{held:.3f} of the parameters' {param_bytes / 2**20:.1f} MiB; a step sends {sent:.3f} x (W-1)/W of them")
ok = held < 0.35 and 2.9 <= sent <= 3.0
print("check_plan_large_world: OK" if ok else "check_plan_large_world: FAIL")
sys.exit(0 if ok else 1)
PY
}

case $mode in
  memory) memory ;;
  large-world) large_world ;;
  *) echo "usage: $0 memory|large-world DDPRUN GPT_TRAIN PYTHON WORK_DIR" >&2; exit 2 ;;
esac
