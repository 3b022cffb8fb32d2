#!/usr/bin/env bash
# Equivalences of the distributed runtime, through `loco train`:
#  - DDP with M replicas == one worker with M x the batch (float tolerance);
#  - DiLoCo with M = 1, outer lr 1, momentum 0 == plain training (bitwise);
#  - in-process == MPI (mpirun -np 2): identical checkpoints after DiLoCo rounds (bitwise);
#  - DiLoCo with 2 replicas resumes bit for bit;
#  - a killed or stuck MPI worker makes the run exit non-zero with a message within the timeout.
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --quiet)
ck=checkpoints/step_00000012

params_close() { $py "$here/../tools/params_close.py" "$@"; }  # A B TOL

# DDP, 2 replicas x batch 2 == 1 worker x batch 4 (same windows each step).
"$loco" train "${base[@]}" --set train.steps=12 --set data.batch_size=2 --set distributed.replicas=2 --set train.out_dir=ddp2
"$loco" train "${base[@]}" --set train.steps=12 --set data.batch_size=4 --set train.out_dir=single4
params_close ddp2/$ck/model.safetensors single4/$ck/model.safetensors 1e-4
# ... and it is not trivially equal to a different run.
"$loco" train "${base[@]}" --set train.steps=12 --set data.batch_size=4 --set data.seed=99 --set train.out_dir=other
if params_close other/$ck/model.safetensors single4/$ck/model.safetensors 1e-4 > /dev/null; then
  echo "FAIL: a different data order gave the same parameters"; exit 1
fi

# DiLoCo M=1, eta=1, mu=0 == plain training, bitwise.
"$loco" train "${base[@]}" --set train.steps=12 --set algorithm=diloco --set outer.inner_steps=4 \
  --set outer.lr=1.0 --set outer.momentum=0.0 --set train.out_dir=fedavg1
"$loco" train "${base[@]}" --set train.steps=12 --set train.out_dir=plain1
cmp fedavg1/$ck/model.safetensors plain1/$ck/model.safetensors

# In-process == MPI, DiLoCo with 2 replicas, 3 rounds.
dl=(--set train.steps=12 --set algorithm=diloco --set outer.inner_steps=4)
"$loco" train "${base[@]}" "${dl[@]}" --set distributed.replicas=2 --set train.out_dir=inproc
timeout 120 mpirun -np 2 "$loco" train "${base[@]}" "${dl[@]}" --set train.out_dir=mpi > mpi.out 2>&1 ||
  { cat mpi.out; exit 1; }
for f in model.safetensors replica-0.safetensors replica-1.safetensors; do cmp inproc/$ck/$f mpi/$ck/$f; done

# DiLoCo with 2 replicas: pause at step 6 (mid-round) and resume == uninterrupted.
"$loco" train "${base[@]}" "${dl[@]}" --set distributed.replicas=2 --set train.out_dir=paused --until 6
"$loco" train --resume paused --quiet
for f in model.safetensors replica-0.safetensors replica-1.safetensors; do cmp inproc/$ck/$f paused/$ck/$f; done

# A killed MPI worker (SIGKILL) or a stuck one (SIGSTOP): the run exits non-zero with a
# message, within the timeout (5 s) plus start-up.
for sig in KILL STOP; do
  rm -rf dead
  start=$(date +%s)
  set +e
  timeout 60 mpirun -np 2 "$loco" train "${base[@]}" --set train.steps=100000 --set network.timeout=5s \
    --set train.out_dir=dead --set train.checkpoint_interval=0 > dead.out 2>&1 &
  launcher=$!
  victim=""
  for _ in $(seq 1 100); do
    for p in $(pgrep -f "train.out_dir=dead" || true); do
      if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$p; fi
    done
    [ -n "$victim" ] && [ -s dead/metrics.jsonl ] && break
    sleep 0.1
  done
  [ -n "$victim" ] || { echo "FAIL: rank 1 not found"; kill $launcher; exit 1; }
  kill -$sig "$victim"
  wait $launcher
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  [ "$sig" = STOP ] && kill -KILL "$victim" 2> /dev/null || true
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $took -gt 40 ]; then
    echo "FAIL: SIG$sig of rank 1: exit $rc after $took s"; cat dead.out; exit 1
  fi
  if [ "$sig" = STOP ]; then
    grep -q "worker 1 did not answer worker 0 within 5 s" dead.out || { cat dead.out; exit 1; }
  else
    grep -qiE "rank 1|worker 1|signal 9|killed" dead.out || { cat dead.out; exit 1; }
  fi
  echo "SIG$sig of rank 1: exit $rc after $took s: $(grep -m1 -iE 'loco: error|signal|rank 1' dead.out)"
done
echo "distributed: OK"
