#!/usr/bin/env bash
# NoLoCo through `loco train`:
#  - the replica spread in metrics.jsonl equals the spread of the replicas' saved weights
#    computed here from the checkpoint files (docs/noloco.md's definition, pooled over stages);
#  - resume with slow weights in flight (sent after an outer step, awaited at the next) ==
#    uninterrupted, without and with stages (3 replicas: a group of three);
#  - fixed routing with 2 stages == the same run on one worker per replica (bitwise);
#  - random routing: deterministic, different from fixed, MPI (mpirun -np 4) == in-process;
#  - the three evaluation modes give three numbers (4 replicas differ); no data-parallel
#    collective in training;
#  - network.compute_jitter changes the timing only (bitwise the same model).
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --quiet
      --set algorithm=noloco --set noloco.inner_steps=5 --set train.steps=30 --set train.eval_interval=10
      --set pipeline.microbatches=2)
ck=checkpoints/step_00000030

# Spread: from the files (params of each worker's stage; stages pooled) vs the metric at step 30.
"$loco" train "${base[@]}" --set distributed.replicas=4 --set train.out_dir=dp4
"$loco" train "${base[@]}" --set distributed.replicas=4 --set pipeline.stages=2 --set train.out_dir=pp4
$py - <<'PY'
import glob, json, struct, sys
import numpy as np
def params(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        base = 8 + n
        b, e = h["params"]["data_offsets"]
        f.seek(base + b)
        return np.frombuffer(f.read(e - b), dtype=np.float32).astype(np.float64)
ok = True
for run, pattern in (("dp4", "replica-*.safetensors"), ("pp4", "stage-%d-replica-*.safetensors")):
    stages = [pattern] if "%d" not in pattern else [pattern % s for s in range(2)]
    sq = count = 0
    for st in stages:
        ws = np.stack([params(p) for p in sorted(glob.glob(f"{run}/checkpoints/step_00000030/{st}"))])
        sq += ((ws - ws.mean(axis=0)) ** 2).sum()
        count += ws.size
    spread = (sq / count) ** 0.5
    logged = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
    last = [r for r in logged if "replica_spread" in r][-1]
    print(f"{run}: spread from files {spread:.6g}, logged {last['replica_spread']:.6g} at step {last['step']}")
    ok = ok and last["step"] == 30 and spread > 0 and abs(spread - last["replica_spread"]) <= 1e-5 * spread
    # No data-parallel collective during training: only point-to-point outer traffic, plus the
    # diagnostic spread and evaluation.
    ops = json.load(open(f"{run}/summary.json"))["workers"][0]["by_operation"]
    ok = ok and "outer_progress" in ops and "outer_weights" in ops
    ok = ok and not {"gradients", "outer_gradients", "all_reduce"} & set(ops)
sys.exit(0 if ok else 1)
PY

# Resume with weights in flight (outer step at 10, next at 15, stopped at 12).
for stages in 1 2; do
  three=(--set distributed.replicas=3 --set pipeline.stages=$stages)
  "$loco" train "${base[@]}" "${three[@]}" --set train.out_dir=full$stages
  "$loco" train "${base[@]}" "${three[@]}" --set train.out_dir=part$stages --until 12
  grep -q '"noloco.weights_for":"3"' part$stages/checkpoints/step_00000012/*replica-0.safetensors ||
    { echo "FAIL: no weights in flight at step 12"; exit 1; }
  "$loco" train --resume part$stages --quiet
  for f in $(cd full$stages/$ck && ls *.safetensors | grep -v '^state'); do cmp full$stages/$ck/$f part$stages/$ck/$f; done
done

# Fixed routing through 2 stages == one worker per replica (the pipeline is exact, and every
# stage's replicas use the same groups).
"$loco" train "${base[@]}" --set distributed.replicas=2 --set train.out_dir=flat
"$loco" train "${base[@]}" --set distributed.replicas=2 --set pipeline.stages=2 --set noloco.routing=fixed \
  --set train.out_dir=fixed
cmp flat/$ck/model.safetensors fixed/$ck/model.safetensors
# Random routing: deterministic, not the fixed pipelines, MPI == in-process.
"$loco" train "${base[@]}" --set distributed.replicas=2 --set pipeline.stages=2 --set train.out_dir=pp2
"$loco" train "${base[@]}" --set distributed.replicas=2 --set pipeline.stages=2 --set train.out_dir=again
cmp pp2/$ck/model.safetensors again/$ck/model.safetensors
if cmp -s pp2/$ck/model.safetensors fixed/$ck/model.safetensors; then echo "FAIL: random == fixed routing"; exit 1; fi
timeout 120 mpirun -np 4 "$loco" train "${base[@]}" --set distributed.replicas=2 --set pipeline.stages=2 \
  --set train.out_dir=mpi > mpi.out 2>&1 || { cat mpi.out; exit 1; }
for f in $(cd pp2/$ck && ls *.safetensors | grep -v '^state'); do cmp pp2/$ck/$f mpi/$ck/$f; done

# The other evaluation modes.
for mode in replica0 average; do
  "$loco" train "${base[@]}" --set distributed.replicas=4 --set noloco.eval=$mode --set train.out_dir=eval_$mode
done
$py - <<'PY'
import json, sys
runs = {"shards": "dp4", "replica0": "eval_replica0", "average": "eval_average"}
v = {m: [json.loads(l) for l in open(f"{d}/metrics.jsonl") if "val_loss" in l][-1]["val_loss"] for m, d in runs.items()}
print("final val loss by evaluation mode:", v)
sys.exit(0 if len(set(v.values())) == 3 else 1)
PY
# Emulated stragglers change the timing only: the same model, bitwise, with idle time counted.
"$loco" train "${base[@]}" --set distributed.replicas=4 --set network.compute_jitter=0.5 --set train.out_dir=jitter
cmp dp4/$ck/model.safetensors jitter/$ck/model.safetensors
$py - <<'PY'
import json, sys
w = json.load(open("jitter/summary.json"))["workers"]
print("jitter_s per worker:", [round(x["jitter_s"], 4) for x in w])
# The idle time is compute (once): compute utilization stays a fraction.
sys.exit(0 if all(0 < x["jitter_s"] < x["compute_s"] and x["compute_utilization"] <= 1 for x in w) else 1)
PY
echo "noloco: OK"
