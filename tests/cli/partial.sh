#!/usr/bin/env bash
# Partial parameter updates through `loco train`: in-process == MPI (bitwise), resume
# mid-round == uninterrupted, streaming + partial, accounting in the summary, config errors.
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --quiet
      --set train.steps=12 --set outer.inner_steps=4 --set partial.slices=2 --set partial.strategy=mlp+heads)
ck=checkpoints/step_00000012
files="model.safetensors replica-0.safetensors replica-1.safetensors"

"$loco" train "${base[@]}" --set algorithm=diloco --set distributed.replicas=2 --set train.out_dir=inproc
timeout 120 mpirun -np 2 "$loco" train "${base[@]}" --set algorithm=diloco --set train.out_dir=mpi > mpi.out 2>&1 ||
  { cat mpi.out; exit 1; }
for f in $files; do cmp inproc/$ck/$f mpi/$ck/$f; done
"$loco" train "${base[@]}" --set algorithm=diloco --set distributed.replicas=2 --set train.out_dir=paused --until 6
"$loco" train --resume paused --quiet > /dev/null
for f in $files; do cmp inproc/$ck/$f paused/$ck/$f; done
# ... and it differs from full DiLoCo.
"$loco" train "${base[@]}" --set algorithm=diloco --set distributed.replicas=2 --set partial.slices=1 \
  --set train.out_dir=full > /dev/null
if cmp -s full/$ck/model.safetensors inproc/$ck/model.safetensors; then echo "FAIL: slicing had no effect"; exit 1; fi

# Accounting: gradients and AdamW moments only for the trained entries.
$py - inproc/summary.json full/summary.json <<'PY'
import json, sys
part, full = (json.load(open(p))["workers"][0] for p in sys.argv[1:3])
d, f, L, P = 32, 64, 2, full["trainable_params"]
expect = P - L * (3 * f * d + 3 * d * d) // 2
print(f"trainable {part['trainable_params']} of {P} (expected {expect}); grads {part['grad_bytes']} B, "
      f"optimizer {part['optimizer_bytes']} B; backward FLOPs {part['backward_flops_per_step']:.4g} vs "
      f"{full['backward_flops_per_step']:.4g}")
ok = part["trainable_params"] == expect and part["grad_bytes"] == 4 * expect and part["optimizer_bytes"] == 8 * expect
ok = ok and part["param_bytes"] == full["param_bytes"] == 4 * P
ok = ok and part["backward_flops_per_step"] < full["backward_flops_per_step"]
sys.exit(0 if ok else 1)
PY

# Streaming with partial updates (fp32), with overlap.
"$loco" train "${base[@]}" --set algorithm=streaming --set distributed.replicas=2 --set outer.inner_steps=6 \
  --set streaming.fragment_blocks=1 --set streaming.tau=1 --set train.out_dir=streaming > /dev/null
[ -f streaming/$ck/model.safetensors ]

# Grouped-query attention (4 query heads sharing 2 key/value heads): each of the 2 slices holds
# one whole group; MPI == in-process, and only that group's q, k, v rows are trained.
gqa=(--set model.num_heads=4 --set model.num_kv_heads=2 --set algorithm=streaming --set streaming.fragment_blocks=1)
"$loco" train "${base[@]}" "${gqa[@]}" --set distributed.replicas=2 --set train.out_dir=gqa-inproc
timeout 120 mpirun -np 2 "$loco" train "${base[@]}" "${gqa[@]}" --set train.out_dir=gqa-mpi > mpi.out 2>&1 ||
  { cat mpi.out; exit 1; }
for f in $files; do cmp gqa-inproc/$ck/$f gqa-mpi/$ck/$f; done
$py - gqa-inproc/summary.json <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["workers"][0]
d, f, L, kv = 32, 64, 2, 16
P = 2 * 256 * d + d + L * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d)
expect = P - L * (3 * f * d + d * d + 2 * kv * d) // 2
print(f"gqa: trainable {w['trainable_params']} of {w['param_bytes'] // 4} (expected {expect} of {P})")
sys.exit(0 if w["trainable_params"] == expect and w["param_bytes"] == 4 * P else 1)
PY

# Errors name the key.
expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1; shift
  if "$loco" train "${base[@]}" "$@" > out.txt 2> err.txt; then echo "FAIL: accepted: $*"; exit 1; fi
  grep -q "$pattern" err.txt || { echo "FAIL: $*: expected '$pattern', got: $(cat err.txt)"; exit 1; }
  [ ! -s out.txt ] || { echo "FAIL: $*: refused after printing: $(head -3 out.txt)"; exit 1; }
}
expect_error "partial.slices > 1 needs algorithm" --set algorithm=ddp
expect_error "partial.slices must divide model.num_heads" --set algorithm=diloco --set partial.slices=4 \
  --set distributed.replicas=4
expect_error "must divide the number of replicas" --set algorithm=diloco --set distributed.replicas=3
expect_error "outer.codec" --set algorithm=streaming --set outer.codec=fp4-e3m0
expect_error "partial.strategy" --set algorithm=diloco --set partial.strategy=heads
echo "partial: OK"
