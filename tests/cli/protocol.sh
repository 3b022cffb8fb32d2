#!/usr/bin/env bash
# Protocol models through `loco train` (tiny model with 4 blocks):
#  - compressed == uncompressed (protocol.compress = false) for S = 2 and 3, DDP with 2
#    replicas and DiLoCo: every logged loss to 1e-6, the saved models after 20 steps to 1e-3
#    (max-abs relative per tensor: the compressed path rebuilds h around the large E_fixed, a
#    rounding difference of about 1e-7 of a step's gradients, which AdamW's division by sqrt(v)
#    enlarges where gradients are near zero; measured up to 1.4e-4);
#  - bytes: per microbatch and boundary b*T*k*4 of activations and of gradients, counted by the
#    transport (the uncompressed run sends b*T*d*4);
#  - the exported checkpoint is an ordinary Llama: `loco eval` on it gives the run's validation
#    loss, and the constrained matrices in it lie in span(U) (U from the state files);
#  - with both constraints and Grassmann updates: a paused and resumed run == uninterrupted
#    (bitwise), U stays orthonormal, the weights stay in the (moved) subspace;
#  - NoLoCo with random routing through compressed boundaries, MPI (mpirun -np 4) == in-process;
#  - combinations that are not supported are refused with a one-line error.
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --quiet
      --set model.num_layers=4 --set train.steps=20 --set train.eval_interval=10 --set pipeline.microbatches=2
      --set protocol.rank=4)
ck=checkpoints/step_00000020
curve() { $py -c "import json,sys
for l in open(sys.argv[1]): r = json.loads(l); print(r['step'], r['train_loss'], r.get('val_loss'))" "$1"; }
close_curves() {  # A B: every logged loss equal to 1e-6 (relative)
  $py - "$1" "$2" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) and len(a) > 0
for x, y in zip(a, b):
    for k in ("train_loss", "val_loss"):
        if k in x:
            assert abs(x[k] - y[k]) <= 1e-6 * abs(x[k]), (k, x["step"], x[k], y[k])
PY
}
params_close() { $py "$here/../tools/params_close.py" "$@"; }  # A B TOL

# Compressed == uncompressed.
for S in 2 3; do
  for setting in "algorithm=ddp distributed.replicas=2" "algorithm=diloco outer.inner_steps=5 distributed.replicas=2"; do
    sets=()
    for kv in $setting; do sets+=(--set "$kv"); done
    rm -rf c u
    "$loco" train "${base[@]}" "${sets[@]}" --set pipeline.stages=$S --set train.out_dir=c > /dev/null
    "$loco" train "${base[@]}" "${sets[@]}" --set pipeline.stages=$S --set protocol.compress=false --set train.out_dir=u > /dev/null
    close_curves c/metrics.jsonl u/metrics.jsonl
    params_close c/$ck/model.safetensors u/$ck/model.safetensors 1e-3
    $py - c/summary.json u/summary.json 4 32 <<'PY'
import json, sys
c, u = (json.load(open(p)) for p in sys.argv[1:3])
k, d = int(sys.argv[3]), int(sys.argv[4])
b, T, m, steps = 2, 32, 2, 20  # windows per microbatch, seq_len, microbatches, steps
for summary, width in ((c, k), (u, d)):
    for w in summary["workers"]:
        ops = w["by_operation"]
        if w["stage"] < summary["stages"] - 1:
            assert ops["activations"]["bytes_sent"] == steps * m * b * T * width * 4, (w["rank"], ops["activations"])
        if w["stage"] > 0:
            assert ops["activation_grads"]["bytes_sent"] == steps * m * b * T * width * 4, (w["rank"], ops["activation_grads"])
        assert w["protocol"]["boundary_floats_per_token"] == width
PY
  done
done
echo "compressed == uncompressed (S = 2 and 3, DDP and DiLoCo with 2 replicas); boundary bytes b*T*k*4"

# The exported model: an ordinary Llama, evaluated by `loco eval` as in the run, constrained
# matrices in span(U).
"$loco" train "${base[@]}" --set pipeline.stages=2 --set train.out_dir=x > /dev/null
want=$($py -c "import json; print([json.loads(l) for l in open('x/metrics.jsonl')][-1]['val_loss'])")
got=$("$loco" eval --checkpoint x/$ck --data val.tok --seq-len 32 --windows 8 | awk '{print $2}')
$py -c "import sys; w, g = float(sys.argv[1]), float(sys.argv[2]); assert abs(w - g) < 1e-5 * w, (w, g)" "$want" "$got"
$py - x/$ck 4 <<'PY'
import json, struct, sys
import numpy as np
def load(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype=np.float32)
            .reshape(v["shape"]) for k, v in h.items()}
ck, k = sys.argv[1], int(sys.argv[2])
model = load(ck + "/model.safetensors")
cfg = json.load(open(ck + "/config.json"))
assert model["model.embed_tokens.weight"].shape == (256, 32) and not cfg.get("tie_word_embeddings", False)
U = load(ck + "/stage-0-replica-0.safetensors")["protocol.U"].reshape(32, k).astype(np.float64)
assert np.abs(U.T @ U - np.eye(k)).max() < 1e-6
# Blocks 0-1 (stage 0) are constrained, blocks 2-3 (the last stage) are not.
for l in range(4):
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        W = model[f"model.layers.{l}.{name}.weight"].astype(np.float64)  # (d, in)
        r = np.linalg.norm(W - U @ (U.T @ W)) / np.linalg.norm(W)
        assert (r < 1e-5) if l < 2 else (r > 0.5), (l, name, r)
PY
echo "exported checkpoint: loco eval == the run's validation loss; constrained matrices in span(U)"

# Constraints and Grassmann updates: resume == uninterrupted, U orthonormal, weights in S.
for c in project subspace-adamw; do
  g=(--set pipeline.stages=2 --set protocol.constraint=$c --set protocol.grassmann_interval=6
     --set distributed.replicas=2)
  "$loco" train "${base[@]}" "${g[@]}" --set train.out_dir=g-$c > /dev/null
  "$loco" train "${base[@]}" "${g[@]}" --set train.out_dir=r-$c --until 10 > /dev/null
  "$loco" train --resume r-$c --quiet > /dev/null
  cmp g-$c/$ck/model.safetensors r-$c/$ck/model.safetensors
  diff <(curve g-$c/metrics.jsonl) <(curve r-$c/metrics.jsonl)
  $py - g-$c <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
for w in s["workers"]:
    p = w["protocol"]
    assert p["grassmann_updates"] == 3, p
    assert p["max_residual"] < 1e-5, p
    if "subspace_loss_before" in p:
        assert p["subspace_loss_after"] < p["subspace_loss_before"], p
PY
done
echo "project and subspace-adamw with Grassmann updates: resume bitwise, weights in the subspace"

# NoLoCo with random routing through compressed boundaries; MPI == in-process.
nl=(--set algorithm=noloco --set noloco.inner_steps=5 --set distributed.replicas=2 --set pipeline.stages=2)
"$loco" train "${base[@]}" "${nl[@]}" --set train.out_dir=nl > /dev/null
timeout 120 mpirun -np 4 "$loco" train "${base[@]}" "${nl[@]}" --set train.threads=1 --set train.out_dir=nl-mpi > /dev/null
cmp nl/$ck/model.safetensors nl-mpi/$ck/model.safetensors
echo "NoLoCo random routing with compression: MPI == in-process"

# Refusals: one line, non-zero exit.
refuse() {  # expected-text args...
  local want=$1
  shift
  set +e
  out=$("$loco" train "${base[@]}" --set train.out_dir=bad "$@" 2>&1)
  rc=$?
  set -e
  [ $rc -ne 0 ] || { echo "accepted: $*"; exit 1; }
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || { echo "not one line: $out"; exit 1; }
  grep -q -- "$want" <<< "$out" || { echo "unexpected message for $*: $out"; exit 1; }
}
refuse "pipeline.stages >= 2"
refuse "untied head" --set pipeline.stages=2 --set model.tie_embeddings=true
refuse "partial.slices" --set pipeline.stages=2 --set algorithm=diloco --set partial.slices=2 --set distributed.replicas=2
refuse "quantized outer.codec" --set pipeline.stages=2 --set algorithm=streaming --set outer.codec=fp4-e3m0 \
  --set distributed.replicas=2
refuse "grassmann_interval" --set pipeline.stages=2 --set algorithm=diloco --set protocol.grassmann_interval=5
refuse "below model.hidden_size" --set pipeline.stages=2 --set protocol.rank=32
refuse "protocol.constraint" --set pipeline.stages=2 --set protocol.constraint=clip
# Resuming with another subspace is refused.
"$loco" train "${base[@]}" --set pipeline.stages=2 --set train.out_dir=seed --until 10 > /dev/null
set +e
out=$("$loco" train --resume seed --quiet --set protocol.seed=3 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "protocol.seed" <<< "$out" || { echo "resume with another seed: $out"; exit 1; }
echo "unsupported combinations refused"
