#!/usr/bin/env bash
# Equivalences of the distributed runtime, through `loco train`:
#  - DDP with M replicas == one worker with M x the batch (float tolerance);
#  - DiLoCo with M = 1, outer lr 1, momentum 0 == plain training (bitwise);
#  - in-process == MPI (mpirun -np 2): identical checkpoints after DiLoCo rounds (bitwise);
#  - DiLoCo with 2 replicas resumes bit for bit;
#  - DiLoCo after data-parallel steps (outer.start_step) starts as DDP and rounds from there;
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

# DiLoCo after data-parallel steps (outer.start_step = 4): steps 1-4 are DDP's, bit for bit, and
# the rounds then end every H = 3 steps from step 4 (7, 10 and the last, 12).
warm=(--set train.steps=12 --set distributed.replicas=2)
"$loco" train "${base[@]}" "${warm[@]}" --set algorithm=diloco --set outer.inner_steps=3 --set outer.start_step=4 \
  --set train.out_dir=warm
"$loco" train "${base[@]}" "${warm[@]}" --set algorithm=diloco --set outer.inner_steps=3 --set outer.start_step=4 \
  --set train.out_dir=warm4 --until 4
"$loco" train "${base[@]}" "${warm[@]}" --set algorithm=ddp --set train.out_dir=ddp4 --until 4
cmp warm4/checkpoints/step_00000004/model.safetensors ddp4/checkpoints/step_00000004/model.safetensors
$py - warm/summary.json <<'PY'
import json, sys
ops = json.load(open(sys.argv[1]))["workers"][0]["by_operation"]
got = (ops["gradients"]["instances"], ops["outer_gradients"]["instances"])
assert got == (4, 3), f"outer.start_step=4, H=3, 12 steps: {got} gradient all-reduces and rounds, expected (4, 3)"
PY
# ... and resumes bit for bit from inside the data-parallel steps.
"$loco" train --resume warm4 --quiet
cmp warm/$ck/model.safetensors warm4/$ck/model.safetensors

# A killed MPI worker (SIGKILL) or a stuck one (SIGSTOP): the run exits non-zero with a
# message, within the timeout (5 s) plus start-up.
for sig in KILL STOP; do
  signal_rank $sig 2 "worker 1 did not answer worker 0 within 5 s" "${base[@]}"
done
echo "distributed: OK"
