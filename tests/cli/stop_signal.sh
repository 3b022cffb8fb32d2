#!/usr/bin/env bash
# SIGTERM and SIGINT stop a run after the step in progress with a checkpoint (every worker after
# the same step), exit 128 + the signal, and --resume then equals an uninterrupted run bit for
# bit; a second signal exits at once without a checkpoint; MPI ranks signalled one by one (as
# Slurm does) agree on the step.
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --quiet
      --set train.checkpoint_interval=0 --set algorithm=diloco --set outer.inner_steps=7)
long=(--set train.steps=100000)

# wait_for FILE TEXT: until FILE holds TEXT (at most 60 s).
wait_for() {
  for _ in $(seq 1 1200); do grep -q "$2" "$1" 2> /dev/null && return 0; sleep 0.05; done
  echo "FAIL: '$2' never appeared in $1"; cat "$1"; exit 1
}
# stopped_step DIR: the step of DIR's only checkpoint.
stopped_step() {
  [ "$(ls "$1/checkpoints" | grep -c '^step_')" -eq 1 ] || { echo "FAIL: $(ls "$1/checkpoints")"; exit 1; }
  sed 's/^step_0*//' "$1/checkpoints/latest"
}

for sig in TERM INT; do
  rm -rf "stop-$sig"
  set +e
  "$loco" train "${base[@]}" "${long[@]}" --set distributed.replicas=3 --set train.log_interval=1 \
    --set train.out_dir="stop-$sig" > "$sig.out" 2> "$sig.err" &
  pid=$!
  wait_for "stop-$sig/metrics.jsonl" '"step":20,'
  kill -"$sig" $pid
  wait $pid
  rc=$?
  set -e
  want=$((128 + $(kill -l "$sig")))
  [ $rc -eq $want ] || { echo "FAIL: SIG$sig: exit $rc, expected $want"; cat "$sig.err"; exit 1; }
  step=$(stopped_step "stop-$sig")
  grep -q "stopped by SIG$sig after step $step with a checkpoint; continue with: loco train --resume stop-$sig" "$sig.err"
  $py -c "import json, sys; s = json.load(open('stop-$sig/summary.json')); assert s['steps'] == $step, s['steps']"
  # Resumed to a fixed end, it equals the run that was never stopped.
  end=$((step + 30))
  "$loco" train --resume "stop-$sig" --until "$end" > /dev/null
  "$loco" train "${base[@]}" "${long[@]}" --set distributed.replicas=3 --set train.log_interval=1 \
    --set train.out_dir="straight-$sig" --until "$end" > /dev/null
  ck=checkpoints/$(printf 'step_%08d' "$end")
  for f in model.safetensors replica-0.safetensors replica-1.safetensors replica-2.safetensors; do
    cmp "stop-$sig/$ck/$f" "straight-$sig/$ck/$f"
  done
  echo "SIG$sig: stopped after step $step, resumed equal to uninterrupted"
done

# A second signal exits at once. The first is sent while a slow step runs; the process is frozen
# (SIGSTOP) before that step can end, the second is queued, and it is delivered on SIGCONT.
rm -rf twice
set +e
"$loco" train "${base[@]}" "${long[@]}" --set model.hidden_size=256 --set model.intermediate_size=1024 \
  --set data.batch_size=64 --set train.log_interval=1 --set train.out_dir=twice > twice.out 2> twice.err &
pid=$!
wait_for twice/metrics.jsonl '"step":2,'
kill -TERM $pid
wait_for twice.err "stopping after this step"
kill -STOP $pid
kill -TERM $pid
kill -CONT $pid
wait $pid
rc=$?
set -e
[ $rc -eq 143 ] || { echo "FAIL: second signal: exit $rc"; cat twice.err; exit 1; }
grep -q "second signal: exiting now, without a checkpoint" twice.err
[ ! -e twice/checkpoints/latest ]
echo "a second signal exits at once"

# MPI: each rank gets SIGTERM at its own time; both stop after one agreed step.
rm -rf mpi-stop
set +e
timeout 120 mpirun -np 2 "$loco" train "${base[@]}" "${long[@]}" --set train.out_dir=mpi-stop > mpi.out 2> mpi.err &
launcher=$!
set -e
wait_for mpi-stop/metrics.jsonl '"step":50,'
for p in $(pgrep -x loco); do
  if grep -qa "train.out_dir=mpi-stop" /proc/$p/cmdline 2> /dev/null; then kill -TERM $p; sleep 0.2; fi
done
set +e
wait $launcher
set -e
step=$(stopped_step mpi-stop)
grep -q "stopped by SIGTERM after step $step" mpi.err
end=$((step + 10))
timeout 120 mpirun -np 2 "$loco" train --resume mpi-stop --until $end > /dev/null
timeout 120 mpirun -np 2 "$loco" train "${base[@]}" "${long[@]}" --set train.out_dir=mpi-straight --until $end > /dev/null
ck=checkpoints/$(printf 'step_%08d' "$end")
for f in model.safetensors replica-0.safetensors replica-1.safetensors; do cmp "mpi-stop/$ck/$f" "mpi-straight/$ck/$f"; done
echo "MPI: both ranks stopped after step $step, resumed equal to uninterrupted"
echo "stop_signal: OK"
