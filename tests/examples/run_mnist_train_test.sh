#!/bin/sh
# Runs examples/mnist under ddprun with 2 ranks and checks what it wrote.
#
#   run_mnist_train_test.sh DDPRUN MNIST_TRAIN WORK_DIR accuracy
#     Three short epochs on the synthetic set; the last epoch's test accuracy
#     in the CSV file must be at least 0.85 (the run is deterministic for a
#     given BLAS: 0.912 with OpenBLAS; chance is 0.1, and a DDP that summed
#     instead of averaging, or reduced nothing, lands far below).
#   run_mnist_train_test.sh DDPRUN MNIST_TRAIN WORK_DIR resume
#     A run stopped after epoch 1 and resumed with --resume must end with
#     bit-identical parameters (same checksum) and the same epoch-2 metrics as
#     an uninterrupted run.
#   run_mnist_train_test.sh DDPRUN MNIST_TRAIN WORK_DIR restart
#     Under ddprun --max-restarts 1, rank 1 kills itself in the middle of
#     epoch 2 (MNIST_TRAIN_TEST_CRASH); ddprun restarts the group, which
#     resumes from epoch 1's checkpoint by itself and must end with the
#     parameters and epoch-2 metrics of an uninterrupted run.
#   run_mnist_train_test.sh DDPRUN MNIST_TRAIN WORK_DIR powersgd
#     The accuracy run's settings with the default hook and with
#     --comm-hook powersgd (rank 4, compressing from step 10 of 72, about 7
#     times fewer bytes per step): PowerSGD's final test accuracy must be
#     within 0.03 of the uncompressed run's (0.944 vs 0.946 seen), and it must
#     have sent fewer bytes.
#   run_mnist_train_test.sh DDPRUN MNIST_TRAIN WORK_DIR localsgd
#     The accuracy run's settings with the default hook and with
#     --comm-hook localsgd (post-local SGD from step 10, each rank alone in
#     between, parameters averaged over both ranks every 4 steps and at each
#     epoch's end): its final test accuracy must be within 0.03 of the
#     default hook's (0.938 vs 0.946 seen), it must have averaged fewer bytes
#     over all ranks per step (35187 vs 87360 seen), and the replicas must
#     agree at the end.
#   run_mnist_train_test.sh DDPRUN MNIST_TRAIN WORK_DIR zero1
#     --optimizer-sharding zero1 (each rank keeps the momentum of its shard)
#     must end bit for bit where the unsharded run ends, straight, stopped
#     after epoch 1 and resumed, and resumed from the unsharded run's epoch-1
#     checkpoint (a plain optimizer's state loaded into the sharded one); and
#     so must --optimizer-sharding zero2 (on 2 ranks the reduce-scatter's
#     sums and halvings are exactly the allreduce's).
#   run_mnist_train_test.sh DDPRUN MNIST_TRAIN WORK_DIR fsdp
#     --fsdp full (FullyShardedDataParallel, each layer a unit: every rank
#     keeps a shard of every layer) must end bit for bit where the DDP run
#     ends (on 2 ranks the reduce-scatter's sums and halvings are exactly the
#     allreduce's), straight and stopped after epoch 1 and resumed from its
#     sharded checkpoint; --fsdp grad-op too; and a 2-rank sharded checkpoint
#     must resume on 3 ranks (through a full state) to the end.
#   run_mnist_train_test.sh DDPRUN MNIST_TRAIN WORK_DIR formats
#     --checkpoint-format dcp, torch and safetensors: a run stopped after
#     epoch 1 and resumed ends bit for bit where the uninterrupted run does,
#     under DDP and under FSDP; the checkpoint files are where the README
#     says; and a 2-rank DCP checkpoint of FSDP resumes on 3 ranks, and as
#     ZeroRedundancyOptimizer, to the end.
#   run_mnist_train_test.sh DDPRUN MNIST_TRAIN WORK_DIR idx
#     Reads a small data set in MNIST's IDX format with --data, and reports a
#     truncated file clearly.
#
# Exits 0 on success; otherwise prints what differs and exits 1.
set -eu

if [ $# -ne 4 ]; then
  echo "usage: $0 DDPRUN MNIST_TRAIN WORK_DIR accuracy|resume|restart|powersgd|localsgd|zero1|fsdp|formats|idx" >&2
  exit 2
fi
ddprun=$1
train=$2
work=$3
mode=$4

rm -rf "$work"
mkdir -p "$work"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# "SENT DEFAULT" from the hook's closing line (matching PATTERN) in LOG:
# "... (SENT per step; the default hook: DEFAULT per step...".
bytes_per_step() {
  line=$(grep "$2" "$1") || fail "no line matching '$2' in $1"
  sent=$(echo "$line" | sed -n 's/.*(\([0-9]*\) per step; the default hook: \([0-9]*\) per step.*/\1 \2/p')
  [ -n "$sent" ] || fail "cannot read the bytes per step in: $line"
  echo "$sent"
}

# run NAME ARGS...: runs mnist_train on 2 ranks, output in $work/NAME.log.
# ddprun also gets $ddprun_flags.
ddprun_flags=""
run() {
  name=$1
  shift
  echo "+ ddprun --nproc-per-node 2 $ddprun_flags mnist_train $*"
  # shellcheck disable=SC2086 # $ddprun_flags is a list of flags
  if ! "$ddprun" --nproc-per-node 2 $ddprun_flags "$train" "$@" >"$work/$name.log" 2>&1; then
    cat "$work/$name.log"
    fail "mnist_train ($name) exited with an error"
  fi
  grep -v ' step [0-9]' "$work/$name.log" || true
}

# The CSV field `column` (1-based) of the row of epoch `epoch`.
csv_field() {
  awk -F, -v epoch="$2" -v column="$3" '$1 == epoch { print $column }' "$1"
}

# be32 N: N as 4 big-endian bytes, the integers of an IDX header.
be32() {
  # shellcheck disable=SC2059 # the format is the octal escapes themselves
  printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) \
    $(($1 >> 8 & 255)) $(($1 & 255)))"
}

# within_accuracy LABEL CSV: passes when epoch 3's test accuracy in CSV is
# at most 0.03 below plain.csv's (DDP with its default hook), leaving both
# in $accuracy and $plain; fails naming LABEL otherwise.
within_accuracy() {
  plain=$(csv_field "$work/plain.csv" 3 3)
  accuracy=$(csv_field "$2" 3 3)
  awk -v p="$plain" -v c="$accuracy" 'BEGIN { exit !(c >= p - 0.03) }' ||
    fail "$1's test accuracy $accuracy is more than 0.03 below the default hook's $plain"
}

# write_idx DIR PREFIX COUNT: COUNT black 28x28 images, all labelled 0.
write_idx() {
  { printf '\000\000\010\003'; be32 "$3"; be32 28; be32 28; head -c $(($3 * 784)) /dev/zero; } \
    >"$1/$2-images-idx3-ubyte"
  { printf '\000\000\010\001'; be32 "$3"; head -c "$3" /dev/zero; } >"$1/$2-labels-idx1-ubyte"
}

# The checksum of the "final parameters: checksum X (...)" line.
checksum() {
  sed -n 's/.*final parameters: checksum \([0-9a-f]*\) .*/\1/p' "$1"
}

case "$mode" in
  accuracy)
    run accuracy --epochs 3 --train-size 3000 --test-size 500 --lr 0.03 --csv "$work/metrics.csv"
    rows=$(grep -c '^[0-9]' "$work/metrics.csv" || true)
    [ "$rows" = 3 ] || fail "expected 3 rows in metrics.csv, found $rows"
    head -n 1 "$work/metrics.csv" | grep -qx 'epoch,train_loss,test_accuracy,samples_per_s,seconds' ||
      fail "unexpected CSV header: $(head -n 1 "$work/metrics.csv")"
    accuracy=$(csv_field "$work/metrics.csv" 3 3)
    awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.85) }' ||
      fail "test accuracy after 3 epochs is $accuracy, expected >= 0.85 (0.912 seen; chance: 0.1)"
    echo "OK: test accuracy $accuracy after 3 epochs (chance: 0.1)"
    ;;
  resume)
    common="--epochs 2 --train-size 1200 --test-size 200 --lr 0.03"
    # shellcheck disable=SC2086 # $common is a list of flags
    run straight $common --checkpoint-dir "$work/straight" --csv "$work/straight.csv"
    # shellcheck disable=SC2086
    run stopped $common --checkpoint-dir "$work/resumed" --csv "$work/resumed.csv" --stop-after-epoch 1
    grep -q 'final parameters' "$work/stopped.log" && fail "the stopped run trained to the end"
    grep -qx 'completed_epochs 1' "$work/resumed/latest" || fail "the sidecar does not say epoch 1"
    # shellcheck disable=SC2086
    run resumed $common --checkpoint-dir "$work/resumed" --csv "$work/resumed.csv" --resume
    grep -q 'resumed from .*epoch-1.pt' "$work/resumed.log" || fail "the run did not resume from epoch 1"

    a=$(checksum "$work/straight.log")
    b=$(checksum "$work/resumed.log")
    [ -n "$a" ] || fail "no checksum in the uninterrupted run's output"
    [ "$a" = "$b" ] || fail "final parameters differ: checksum $a uninterrupted, $b stopped and resumed"
    for column in 2 3; do # train_loss, test_accuracy
      x=$(csv_field "$work/straight.csv" 2 $column)
      y=$(csv_field "$work/resumed.csv" 2 $column)
      [ "$x" = "$y" ] || fail "epoch 2, CSV column $column: $x uninterrupted, $y resumed"
    done
    rows=$(grep -c '^[0-9]' "$work/resumed.csv" || true)
    [ "$rows" = 2 ] || fail "expected 2 rows in the resumed run's CSV, found $rows"
    echo "OK: stopped after epoch 1 and resumed, the parameters match an uninterrupted run (checksum $a)"
    ;;
  restart)
    common="--epochs 2 --train-size 1200 --test-size 200 --lr 0.03"
    # shellcheck disable=SC2086 # $common is a list of flags
    run straight $common --checkpoint-dir "$work/straight" --csv "$work/straight.csv"
    # 10 steps per epoch: rank 1 dies at step 5 of epoch 2, after epoch 1's checkpoint.
    ddprun_flags="--max-restarts 1"
    # shellcheck disable=SC2086
    MNIST_TRAIN_TEST_CRASH=1:2:5 run restarted $common --checkpoint-dir "$work/restarted" \
      --csv "$work/restarted.csv"
    ddprun_flags=""
    grep -q 'rank 1 kills itself after epoch 2 step 5' "$work/restarted.log" ||
      fail "rank 1 did not kill itself in epoch 2"
    grep -q '^ddprun: rank [01] .*; restarting the group (restart 1 of 1)$' "$work/restarted.log" ||
      fail "ddprun did not say that it restarted the group"
    grep -q 'the launcher restarted the job (restart 1): resuming' "$work/restarted.log" ||
      fail "mnist_train did not see the restart"
    grep -q 'resumed from .*restarted/epoch-1.pt' "$work/restarted.log" ||
      fail "the restarted run did not resume from epoch 1"

    a=$(checksum "$work/straight.log")
    b=$(checksum "$work/restarted.log")
    [ -n "$a" ] || fail "no checksum in the uninterrupted run's output"
    [ "$a" = "$b" ] || fail "final parameters differ: checksum $a uninterrupted, $b killed and restarted"
    for column in 2 3; do # train_loss, test_accuracy
      x=$(csv_field "$work/straight.csv" 2 $column)
      y=$(csv_field "$work/restarted.csv" 2 $column)
      [ "$x" = "$y" ] || fail "epoch 2, CSV column $column: $x uninterrupted, $y restarted"
    done
    rows=$(grep -c '^[0-9]' "$work/restarted.csv" || true)
    [ "$rows" = 2 ] || fail "expected 2 rows in the restarted run's CSV, found $rows"
    echo "OK: rank 1 killed in epoch 2, the group restarted and resumed; the parameters match an uninterrupted run (checksum $a)"
    ;;
  powersgd)
    common="--epochs 3 --train-size 3000 --test-size 500 --lr 0.03"
    # shellcheck disable=SC2086 # $common is a list of flags
    run plain $common --csv "$work/plain.csv"
    # shellcheck disable=SC2086
    run powersgd $common --csv "$work/powersgd.csv" --comm-hook powersgd --powersgd-rank 4 \
      --powersgd-start-iter 10
    grep -q 'communication hook powersgd: rank 4, plain for the first 10 steps' \
      "$work/powersgd.log" || fail "mnist_train did not say that it uses PowerSGD"
    # shellcheck disable=SC2046 # two numbers
    set -- $(bytes_per_step "$work/powersgd.log" 'powersgd: .* bytes allreduced')
    [ "$1" -lt "$2" ] || fail "PowerSGD sent $1 bytes per step, the default hook $2"
    within_accuracy PowerSGD "$work/powersgd.csv"
    echo "OK: test accuracy $accuracy with PowerSGD (rank 4), $plain uncompressed (margin 0.03); $1 bytes per step vs $2"
    ;;
  localsgd)
    common="--epochs 3 --train-size 3000 --test-size 500 --lr 0.03"
    # shellcheck disable=SC2086 # $common is a list of flags
    run plain $common --csv "$work/plain.csv"
    # shellcheck disable=SC2086
    run localsgd $common --csv "$work/localsgd.csv" --comm-hook localsgd --local-sgd-period 4 \
      --local-sgd-start-iter 10 --local-sgd-group-size 1
    grep -q 'communication hook localsgd: gradients over every rank for the first 10 steps' \
      "$work/localsgd.log" || fail "mnist_train did not say that it uses local SGD"
    grep -q 'they agree across 2 ranks' "$work/localsgd.log" || fail "the replicas differ at the end"
    # shellcheck disable=SC2046 # two numbers
    set -- $(bytes_per_step "$work/localsgd.log" 'localsgd: .* bytes averaged over all')
    [ "$1" -lt "$2" ] || fail "local SGD averaged $1 bytes per step over all ranks, the default hook $2"
    within_accuracy "local SGD" "$work/localsgd.csv"
    echo "OK: test accuracy $accuracy with local SGD (period 4), $plain with DDP's default (margin 0.03); $1 bytes per step over all ranks vs $2"
    ;;
  zero1)
    common="--epochs 2 --train-size 1200 --test-size 200 --lr 0.03"
    # shellcheck disable=SC2086 # $common is a list of flags
    run plain $common --checkpoint-dir "$work/plain"
    # shellcheck disable=SC2086
    run sharded $common --checkpoint-dir "$work/sharded" --optimizer-sharding zero1
    grep -q 'SGD lr 0.03 momentum 0.9, sharded over the ranks (zero1)' "$work/sharded.log" ||
      fail "mnist_train did not say that its optimizer state is sharded"
    # shellcheck disable=SC2086
    run stopped $common --checkpoint-dir "$work/resumed" --optimizer-sharding zero1 --stop-after-epoch 1
    # shellcheck disable=SC2086
    run resumed $common --checkpoint-dir "$work/resumed" --optimizer-sharding zero1 --resume
    # shellcheck disable=SC2086
    run plain_stopped $common --checkpoint-dir "$work/from_plain" --stop-after-epoch 1
    # shellcheck disable=SC2086
    run from_plain $common --checkpoint-dir "$work/from_plain" --optimizer-sharding zero1 --resume
    grep -q 'resumed from .*from_plain/epoch-1.pt' "$work/from_plain.log" ||
      fail "the sharded run did not resume from the unsharded run's epoch 1"
    a=$(checksum "$work/plain.log")
    [ -n "$a" ] || fail "no checksum in the unsharded run's output"
    # shellcheck disable=SC2086
    run stage2 $common --checkpoint-dir "$work/stage2" --optimizer-sharding zero2
    grep -q 'SGD lr 0.03 momentum 0.9, sharded over the ranks (zero2)' "$work/stage2.log" ||
      fail "mnist_train did not say that its gradients are sharded"
    for name in sharded resumed from_plain stage2; do
      b=$(checksum "$work/$name.log")
      [ "$a" = "$b" ] || fail "final parameters differ: checksum $a unsharded, $b $name"
    done
    echo "OK: sharded SGD state (zero1) ends where the unsharded run ends, straight, resumed and resumed from an unsharded checkpoint, and so do sharded gradients (zero2) (checksum $a)"
    ;;
  fsdp)
    common="--epochs 2 --train-size 1200 --test-size 200 --lr 0.03"
    # shellcheck disable=SC2086 # $common is a list of flags
    run plain $common
    # shellcheck disable=SC2086
    run full $common --fsdp full
    grep -q 'SGD lr 0.03 momentum 0.9, FullyShardedDataParallel (full)' "$work/full.log" ||
      fail "mnist_train did not say that it runs under FullyShardedDataParallel"
    # shellcheck disable=SC2086
    run stopped $common --checkpoint-dir "$work/resumed" --fsdp full --stop-after-epoch 1
    ls "$work/resumed" | grep -qE '^epoch-1\.pt\.[0-9a-f]{16}\.rank1$' ||
      fail "no sharded checkpoint (one file per rank) in $work/resumed: $(ls "$work/resumed")"
    # shellcheck disable=SC2086
    run resumed $common --checkpoint-dir "$work/resumed" --fsdp full --resume
    # shellcheck disable=SC2086
    run grad_op $common --fsdp grad-op
    a=$(checksum "$work/plain.log")
    [ -n "$a" ] || fail "no checksum in the DDP run's output"
    for name in full resumed grad_op; do
      b=$(checksum "$work/$name.log")
      [ "$a" = "$b" ] || fail "final parameters differ: checksum $a under DDP, $b $name"
    done
    # shellcheck disable=SC2086
    run stopped3 $common --checkpoint-dir "$work/other_world" --fsdp full --stop-after-epoch 1
    echo "+ ddprun --nproc-per-node 3 mnist_train $common --fsdp full --resume"
    # shellcheck disable=SC2086
    "$ddprun" --nproc-per-node 3 "$train" $common --checkpoint-dir "$work/other_world" --fsdp full \
      --resume >"$work/other_world.log" 2>&1 || { cat "$work/other_world.log"; fail "resuming on 3 ranks failed"; }
    grep -q 'resumed from .*other_world/epoch-1.pt' "$work/other_world.log" &&
      grep -q 'final parameters: checksum [0-9a-f]* (21840 values); sharded over 3 ranks' "$work/other_world.log" ||
      fail "a 2-rank sharded checkpoint did not resume on 3 ranks: $(cat "$work/other_world.log")"
    echo "OK: FSDP (full and grad-op) ends where DDP ends, straight and resumed from its sharded checkpoint (checksum $a); a 2-rank checkpoint resumes on 3 ranks"
    ;;
  formats)
    common="--epochs 2 --train-size 1200 --test-size 200 --lr 0.03"
    # shellcheck disable=SC2086 # $common is a list of flags
    run plain $common
    a=$(checksum "$work/plain.log")
    [ -n "$a" ] || fail "no checksum in the DDP run's output"
    for format in dcp torch safetensors; do
      for wrapper in ddp fsdp; do
        extra=""
        [ $wrapper = fsdp ] && extra="--fsdp full"
        ck=$format-$wrapper
        # shellcheck disable=SC2086
        run "$ck-stopped" $common $extra --checkpoint-dir "$work/$ck" --checkpoint-format $format --stop-after-epoch 1
        case $format in
          dcp) files="epoch-1.dcp" ;;
          torch) files="epoch-1.model.pt epoch-1.optim.pt" ;;
          safetensors) files="epoch-1.optim.pt epoch-1.safetensors" ;;
        esac
        [ "$(ls "$work/$ck" | grep '^epoch' | tr '\n' ' ')" = "$files " ] ||
          fail "$ck: expected $files in $work/$ck, found $(ls "$work/$ck")"
        cp -r "$work/$ck" "$work/$ck-epoch1"
        # shellcheck disable=SC2086
        run "$ck-resumed" $common $extra --checkpoint-dir "$work/$ck" --checkpoint-format $format --resume
        b=$(checksum "$work/$ck-resumed.log")
        [ "$a" = "$b" ] || fail "$ck: resumed, final parameters differ: checksum $a uninterrupted, $b resumed"
      done
    done
    # A 2-rank FSDP checkpoint in DCP resumes on 3 ranks, and under ZeRO.
    # shellcheck disable=SC2086
    "$ddprun" --nproc-per-node 3 "$train" $common --checkpoint-dir "$work/dcp-fsdp-epoch1" --checkpoint-format dcp \
      --fsdp full --resume >"$work/three.log" 2>&1 || { cat "$work/three.log"; fail "resuming on 3 ranks failed"; }
    grep -q 'resumed from .*dcp-fsdp-epoch1/epoch-1.dcp: 1 of 2' "$work/three.log" &&
      grep -q 'sharded over 3 ranks' "$work/three.log" || fail "no resume on 3 ranks: $(cat "$work/three.log")"
    # shellcheck disable=SC2086
    run as_zero $common --checkpoint-dir "$work/dcp-ddp-epoch1" --checkpoint-format dcp --optimizer-sharding zero1 --resume
    grep -q 'resumed from .*dcp-ddp-epoch1/epoch-1.dcp: 1 of 2' "$work/as_zero.log" || fail "ZeRO did not resume epoch 1"
    [ "$(checksum "$work/as_zero.log")" = "$a" ] || fail "DDP's DCP checkpoint resumed under ZeRO ends elsewhere"
    echo "OK: dcp, torch and safetensors checkpoints resume bit for bit under DDP and FSDP (checksum $a); a 2-rank DCP checkpoint resumes on 3 ranks and under ZeRO"
    ;;
  idx)
    mkdir -p "$work/data"
    write_idx "$work/data" train 300
    write_idx "$work/data" t10k 50
    run idx --epochs 2 --batch-size 16 --lr 0.05 --data "$work/data"
    grep -q "MNIST files in $work/data: 300 training and 50 test images" "$work/idx.log" ||
      fail "mnist_train did not report reading 300 + 50 images"
    grep -q 'test accuracy .* (50/50)' "$work/idx.log" ||
      fail "the network did not learn that every image is a 0"
    # A truncated file: a clear error naming it, exit status 1.
    head -c 1000 "$work/data/t10k-images-idx3-ubyte" >"$work/data/short" &&
      mv "$work/data/short" "$work/data/t10k-images-idx3-ubyte"
    status=0
    "$train" --data "$work/data" >"$work/truncated.log" 2>&1 || status=$?
    [ "$status" = 1 ] || fail "a truncated file gave exit status $status, expected 1"
    grep -q 't10k-images-idx3-ubyte: truncated' "$work/truncated.log" ||
      fail "unclear error for a truncated file: $(cat "$work/truncated.log")"
    echo "OK: read the IDX files; a truncated one is reported as: $(cat "$work/truncated.log")"
    ;;
  *)
    echo "$0: unknown mode '$mode' (expected accuracy, resume, restart, powersgd, zero1, fsdp or idx)" >&2
    exit 2
    ;;
esac
