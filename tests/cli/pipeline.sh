#!/usr/bin/env bash
# Pipeline parallelism through `loco train` (tiny model with 4 blocks, one compute thread):
#  - S in {2, 3, 4} stages x {1f1b, gpipe} == one worker accumulating the same 4 micro-batches:
#    parameters, and every logged loss, gradient norm and validation loss, bitwise;
#  - tied embeddings: the two copies (first and last stage) stay bitwise identical for DDP,
#    DiLoCo and Streaming DiLoCo with 3 replicas; the model equals one worker's to 1e-5 (the
#    embedding's two gradient contributions are added in another order: per stage over all
#    micro-batches, then the two sums, instead of micro-batch by micro-batch);
#  - the grid: S = 2, R = 2 == S = 1, R = 2 bitwise for DDP, DiLoCo, Streaming DiLoCo (fp4) and
#    partial updates (two replicas: a + b == b + a, so the ring's order does not matter); with
#    R = 4 within 1e-6 (the ring sums an element in an order set by its offset, and offsets
#    differ between the whole model and a stage);
#  - MPI (mpirun -np 4) == in-process, and a paused and resumed pipelined run == uninterrupted;
#  - traffic: per microbatch and boundary b*T*d*4 bytes of activations forward and of
#    gradients backward, b*(T+1)*4 of token ids; activations held: 1F1B <= S - s in flight;
#  - a stuck or killed stage (MPI) ends the run within the timeout, naming it.
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --quiet
      --set model.num_layers=4 --set train.steps=12 --set train.threads=1)
ck=checkpoints/step_00000012
params_close() { $py "$here/../tools/params_close.py" "$@"; }  # A B TOL
curve() { $py -c "import json,sys
for l in open(sys.argv[1]): r = json.loads(l); print(r['step'], repr(r['train_loss']), repr(r['grad_norm']), repr(r.get('val_loss')))" "$1"; }

# Stages == gradient accumulation on one worker, bitwise.
"$loco" train "${base[@]}" --set pipeline.microbatches=4 --set train.out_dir=one
for S in 2 3 4; do
  for sched in 1f1b gpipe; do
    "$loco" train "${base[@]}" --set pipeline.microbatches=4 --set pipeline.stages=$S --set pipeline.schedule=$sched \
      --set train.out_dir=s$S-$sched
    cmp one/$ck/model.safetensors s$S-$sched/$ck/model.safetensors
    diff <(curve one/metrics.jsonl) <(curve s$S-$sched/metrics.jsonl)
  done
done
echo "stages == one worker: bitwise for S = 2, 3, 4, 1f1b and gpipe"

# Tied embeddings: identical copies on the first and last stage, for every method, R = 3.
tied_identical() {  # checkpoint dir, stages, replicas
  $py - "$@" <<'PY'
import json, struct, sys
import numpy as np
def load(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype=np.uint32)
            for k, v in h.items()}
ck, S, R = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
emb = 256 * 32
for r in range(R):
    a, b = load(f"{ck}/stage-0-replica-{r}.safetensors"), load(f"{ck}/stage-{S-1}-replica-{r}.safetensors")
    keys = [k for k in a if k == "params" or k.startswith("outer.")]
    assert keys, "no parameters in the state files"
    for k in keys:
        if not np.array_equal(a[k][:emb], b[k][:emb]):
            sys.exit(f"replica {r}: {k}: the tied embedding differs between stage 0 and stage {S-1}")
PY
}
tied=(--set model.tie_embeddings=true --set pipeline.microbatches=2)
for algo in ddp diloco streaming; do
  "$loco" train "${base[@]}" "${tied[@]}" --set algorithm=$algo --set outer.inner_steps=10 \
    --set streaming.fragment_blocks=1 --set distributed.replicas=3 --set pipeline.stages=3 --set train.out_dir=tied-$algo
  tied_identical tied-$algo/$ck 3 3
done
"$loco" train "${base[@]}" "${tied[@]}" --set train.out_dir=tied-one
"$loco" train "${base[@]}" "${tied[@]}" --set pipeline.stages=2 --set train.out_dir=tied-two
params_close tied-one/$ck/model.safetensors tied-two/$ck/model.safetensors 1e-5
echo "tied embeddings: copies identical (ddp, diloco, streaming; 3 replicas)"

# The grid: data-parallel methods among each stage's replicas.
grid() {  # name, extra settings...
  local name=$1; shift
  "$loco" train "${base[@]}" --set pipeline.microbatches=2 "$@" --set train.out_dir=$name-flat
  "$loco" train "${base[@]}" --set pipeline.microbatches=2 "$@" --set pipeline.stages=2 --set train.out_dir=$name-grid
}
grid ddp --set distributed.replicas=2
grid diloco --set distributed.replicas=2 --set algorithm=diloco --set outer.inner_steps=4
grid fp4 --set distributed.replicas=2 --set algorithm=streaming --set outer.inner_steps=10 \
  --set streaming.fragment_blocks=1 --set outer.codec=fp4-e3m0
grid partial --set distributed.replicas=2 --set algorithm=diloco --set outer.inner_steps=4 --set partial.slices=2
for name in ddp diloco fp4 partial; do cmp $name-flat/$ck/model.safetensors $name-grid/$ck/model.safetensors; done
grid four --set distributed.replicas=4 --set algorithm=diloco --set outer.inner_steps=4
params_close four-flat/$ck/model.safetensors four-grid/$ck/model.safetensors 1e-6
echo "grid: S=2 x R=2 == S=1 x R=2 bitwise (ddp, diloco, streaming fp4, partial); R=4 within 1e-6"

# MPI == in-process; pause and resume == uninterrupted.
"$loco" train "${base[@]}" "${tied[@]}" --set distributed.replicas=2 --set pipeline.stages=2 --set algorithm=diloco \
  --set outer.inner_steps=4 --set train.out_dir=inproc
timeout 120 mpirun -np 4 "$loco" train "${base[@]}" "${tied[@]}" --set pipeline.stages=2 --set algorithm=diloco \
  --set outer.inner_steps=4 --set train.out_dir=mpi > mpi.out 2>&1 || { cat mpi.out; exit 1; }
"$loco" train "${base[@]}" "${tied[@]}" --set distributed.replicas=2 --set pipeline.stages=2 --set algorithm=diloco \
  --set outer.inner_steps=4 --set train.out_dir=paused --until 7
"$loco" train --resume paused --quiet
files=(model.safetensors stage-0-replica-0.safetensors stage-0-replica-1.safetensors stage-1-replica-0.safetensors
       stage-1-replica-1.safetensors)
for f in "${files[@]}"; do cmp inproc/$ck/$f mpi/$ck/$f; cmp inproc/$ck/$f paused/$ck/$f; done
echo "MPI == in-process; resume == uninterrupted"

# Traffic and activation memory, from the summary.
"$loco" train "${base[@]}" --set pipeline.stages=3 --set pipeline.microbatches=4 --set distributed.replicas=2 \
  --set train.out_dir=bytes
$py - bytes/summary.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
steps, m, b, T, d, S = 12, 4, 1, 32, 32, 3
for w in s["workers"]:
    ops, st = w["by_operation"], w["stage"]
    sent = lambda op: ops.get(op, {}).get("bytes_sent", 0)
    assert sent("activations") == (steps * m * b * T * d * 4 if st < S - 1 else 0), (st, sent("activations"))
    assert sent("tokens") == (steps * m * b * (T + 1) * 4 if st < S - 1 else 0), (st, sent("tokens"))
    assert sent("activation_grads") == (steps * m * b * T * d * 4 if st > 0 else 0), (st, sent("activation_grads"))
    assert w["microbatches_in_flight"] == min(S - st, m), (st, w["microbatches_in_flight"])
    assert 0 <= w["bubble_share"] < 1 and w["bubble_s"] >= 0
print("boundary bytes b*T*d*4 per microbatch and direction; 1F1B holds S - s microbatches")
PY

# A stuck (SIGSTOP) or killed (SIGKILL) stage: the run ends within the timeout, naming it. Which
# wait times out first depends on where the stage stopped: a pipeline receive ("... from stage 1,
# replica 0 (worker 1): worker 1 did not answer") or the per-step exchange along the pipeline
# ("worker 1 did not answer worker 2"); both name the stuck worker.
for sig in STOP KILL; do
  signal_rank $sig 3 "worker 1 did not answer" "${base[@]}" --set pipeline.stages=3
done
echo "pipeline: OK"
