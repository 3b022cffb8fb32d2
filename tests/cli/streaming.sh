#!/usr/bin/env bash
# Streaming DiLoCo through `loco train`:
#  - one fragment with tau = 0 == DiLoCo (bitwise);
#  - resume with a synchronization in flight (tau = 1, fp4 outer gradients) == uninterrupted;
#  - in-process == MPI (mpirun -np 2) with overlap and fp4 (bitwise);
#  - measured traffic: fp4 bytes / fp32 bytes = (1/2 + 1/block) / 4 with 2 replicas, where the
#    fp32 ring all-reduce sends each replica's delta once; the largest single synchronization
#    shrinks from the whole model to the largest fragment;
#  - evaluation on replica 0 / the replica average differs from the outer parameters mid-round
#    (whose evaluation carries a note that its fragments were synced at different steps)
#    and equals them after the final synchronization;
#  - per-worker tau runs and changes the result;
#  - 4 replicas with fp4 by reduce-scatter: in-process == MPI, bytes per worker half the
#    all-gather's.
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --quiet
      --set train.steps=12 --set distributed.replicas=2 --set outer.inner_steps=6 --set outer.lr=0.7)
ck=checkpoints/step_00000012
files="model.safetensors replica-0.safetensors replica-1.safetensors"
json() { $py -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

# One fragment, tau = 0, alpha = 0 (the synced value replaces the local one), fp32 == DiLoCo,
# bitwise (both at outer lr 0.7).
"$loco" train "${base[@]}" --set algorithm=diloco --set train.out_dir=diloco
"$loco" train "${base[@]}" --set algorithm=streaming --set streaming.fragment_blocks=0 --set streaming.tau=0 \
  --set streaming.alpha=0 --set train.out_dir=onefrag
cmp diloco/$ck/model.safetensors onefrag/$ck/model.safetensors
for f in replica-0 replica-1; do  # same tensors (streaming adds a "pending" entry to the metadata)
  $py "$here/../tools/params_close.py" diloco/$ck/$f.safetensors onefrag/$ck/$f.safetensors 0
done

# Three fragments (2 blocks of 1 + the rest), offsets 0, 2, 4: fragment 1 syncs after step 8 and
# is applied after step 9. Stopping at 8 leaves it in flight; resuming must match (the paused run
# also keeps its outer state offloaded to a scratch file).
st=(--set algorithm=streaming --set streaming.fragment_blocks=1 --set streaming.tau=1 --set streaming.alpha=0.5
    --set outer.codec=fp4-e3m0)
"$loco" train "${base[@]}" "${st[@]}" --set train.out_dir=fp4
"$loco" train "${base[@]}" "${st[@]}" --set streaming.offload_outer=true --set train.out_dir=paused --until 8
grep -q '"pending.1.apply_at":"9"' paused/checkpoints/step_00000008/replica-0.safetensors || { echo "FAIL: no sync in flight at 8"; exit 1; }
"$loco" train --resume paused --quiet
for f in $files; do cmp fp4/$ck/$f paused/$ck/$f; done
# ... and it is not DiLoCo.
if cmp -s fp4/$ck/model.safetensors diloco/$ck/model.safetensors; then echo "FAIL: streaming == diloco"; exit 1; fi

# Outer state offloaded to a scratch file: the same numbers, less resident outer state, and
# the scratch file is gone afterwards.
"$loco" train "${base[@]}" "${st[@]}" --set streaming.offload_outer=true --set train.out_dir=offload
for f in $files; do cmp fp4/$ck/$f offload/$ck/$f; done
ls offload/*.scratch 2> /dev/null && { echo "FAIL: scratch file left behind"; exit 1; }
$py - fp4/summary.json offload/summary.json <<'PY'
import json, sys
mem, off = (json.load(open(p))["workers"][0] for p in sys.argv[1:3])
print(f"resident outer state: in memory {mem['outer_state_bytes']} B, offloaded {off['outer_state_bytes']} B")
sys.exit(0 if off["outer_state_offloaded"] and off["outer_state_bytes"] < mem["outer_state_bytes"] else 1)
PY

# In-process == MPI.
timeout 120 mpirun -np 2 "$loco" train "${base[@]}" "${st[@]}" --set train.out_dir=mpi > mpi.out 2>&1 ||
  { cat mpi.out; exit 1; }
for f in $files; do cmp fp4/$ck/$f mpi/$ck/$f; done

# Traffic: the same run in fp32 (ring all-reduce) vs fp4 (all-gather of block-scaled nibbles).
"$loco" train "${base[@]}" "${st[@]}" --set outer.codec=fp32 --set train.out_dir=fp32
b32=$(json fp32/summary.json 'd["workers"][0]["by_operation"]["outer_gradients"]["bytes_sent"]')
b4=$(json fp4/summary.json 'd["workers"][0]["by_operation"]["outer_gradients"]["bytes_sent"]')
$py - "$b32" "$b4" <<'PY'
import sys
b32, b4 = int(sys.argv[1]), int(sys.argv[2])
ratio, expect = b4 / b32, (0.5 + 1 / 128) / 4
print(f"outer-gradient bytes sent: fp32 {b32}, fp4 {b4}, ratio {ratio:.4f} (1/8 + scales = {expect:.4f})")
sys.exit(0 if abs(ratio - expect) < 0.002 else 1)
PY

# Largest single synchronization: DiLoCo sends the whole model, streaming (6 layers, fragments of
# 2 blocks) the largest fragment; the ratio is the model size over the largest fragment.
six=(--set model.num_layers=6 --set outer.codec=fp32)
"$loco" train "${base[@]}" "${six[@]}" --set algorithm=diloco --set train.out_dir=d6
"$loco" train "${base[@]}" "${six[@]}" --set algorithm=streaming --set streaming.fragment_blocks=2 --set streaming.tau=0 --set train.out_dir=s6
$py - d6/summary.json s6/summary.json <<'PY'
import json, sys
d, s = (json.load(open(p))["workers"][0] for p in sys.argv[1:3])
ld = d["by_operation"]["outer_gradients"]["largest_instance_bytes_sent"]
ls = s["by_operation"]["outer_gradients"]["largest_instance_bytes_sent"]
frag = s["largest_fragment_params"]
total = d["outer_state_bytes"] // 8
print(f"largest sync: diloco {ld} B, streaming {ls} B, ratio {ld / ls:.2f} (model {total} / largest fragment {frag}"
      f" = {total / frag:.2f}; L / |p| = 3)")
ok = ld == 4 * total and ls == 4 * frag and ld / ls > 3
ok = ok and s["outer_state_bytes_needed_at_once"] < d["outer_state_bytes"]
sys.exit(0 if ok else 1)
PY

# Evaluation choices: eval at step 3 (mid-round) and at the end (after the final sync).
ev=(--set streaming.fragment_blocks=1 --set train.eval_interval=3 --set train.steps=12)
for e in outer replica0 average; do
  "$loco" train "${base[@]}" --set algorithm=streaming "${ev[@]}" --set streaming.eval=$e --set train.out_dir=eval_$e
done
$py - <<'PY'
import json, sys
def vals(run):
    return {r["step"]: r["val_loss"] for r in map(json.loads, open(f"eval_{run}/metrics.jsonl")) if "val_loss" in r}
o, r0, av = vals("outer"), vals("replica0"), vals("average")
print(f"val loss at step 3: outer {o[3]:.6f} replica0 {r0[3]:.6f} average {av[3]:.6f}; at 12: {o[12]:.6f} {r0[12]:.6f} {av[12]:.6f}")
ok = o[3] != r0[3] and o[3] != av[3] and r0[3] != av[3] and abs(o[12] - r0[12]) < 1e-9 and abs(o[12] - av[12]) < 1e-6
# An evaluation of outer parameters mixing fragments synced at different steps says so (step 9:
# fragments synced at 6 and 8, one not yet); at step 3 (none synced: the initial model), at the
# end (every fragment synced) and for the other choices there is nothing to say.
notes = {r["step"]: r.get("val_note", "") for r in map(json.loads, open("eval_outer/metrics.jsonl")) if "val_loss" in r}
print(f"note at step 9: {notes[9]!r}")
ok = ok and notes[3] == "" and "a mix rather than one model state" in notes[9] and notes[12] == ""
ok = ok and all("val_note" not in json.loads(l) for l in open("eval_replica0/metrics.jsonl"))
sys.exit(0 if ok else 1)
PY

# Heterogeneous tau: runs, and differs from the uniform tau = 1 run (checked against an
# independent reference in tests/algo/test_streaming.cpp).
"$loco" train "${base[@]}" "${st[@]}" --set streaming.worker_tau=0,1 --set train.out_dir=hetero
if cmp -s hetero/$ck/model.safetensors fp4/$ck/model.safetensors; then echo "FAIL: worker_tau had no effect"; exit 1; fi
# Four replicas, fp4 outer gradients by reduce-scatter: in-process == MPI (mpirun -np 4) bitwise,
# and every worker sends the same bytes both ways (the in-process bytes equal the formula of
# comm/codec.h in tests/algo/test_streaming.cpp): 2 (M-1)/M payloads per worker, not M - 1.
four=(--set distributed.replicas=4 --set outer.reduce=reduce-scatter)
"$loco" train "${base[@]}" "${st[@]}" "${four[@]}" --set train.out_dir=rs4
timeout 180 mpirun -np 4 --oversubscribe "$loco" train "${base[@]}" "${st[@]}" "${four[@]}" --set train.out_dir=rs4mpi \
  > rs4mpi.out 2>&1 || { cat rs4mpi.out; exit 1; }
for f in model.safetensors replica-{0,1,2,3}.safetensors; do cmp rs4/$ck/$f rs4mpi/$ck/$f; done
"$loco" train "${base[@]}" "${st[@]}" --set distributed.replicas=4 --set outer.reduce=all-gather --set train.out_dir=ag4
$py - rs4/summary.json rs4mpi/summary.json ag4/summary.json <<'PY'
import json, sys
def sent(p): return [w["by_operation"]["outer_gradients"]["bytes_sent"] for w in json.load(open(p))["workers"]]
rs, mpi, ag = (sent(p) for p in sys.argv[1:4])
print(f"fp4 outer-gradient bytes per worker, 4 replicas: reduce-scatter {rs} (MPI {mpi}), all-gather {ag}")
# all-gather: (M-1) payloads; reduce-scatter: 2 (M-1)/M; their ratio M/2 = 2 (up to block rounding)
ok = rs == mpi and all(1.95 < a / r < 2.05 for a, r in zip(ag, rs))
sys.exit(0 if ok else 1)
PY
echo "streaming: OK"
