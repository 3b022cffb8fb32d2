#!/usr/bin/env bash
# train.precision = bf16: a run is bitwise repeatable and resumes bit for bit, differs from fp32
# and says which precision it ran in; bf16 on a CPU without bf16 instructions runs fp32 and says
# so. Skipped (77) on CPUs without bf16 instructions, after checking that last point.
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --set train.steps=20
      --set distributed.replicas=2 --set algorithm=diloco --set outer.inner_steps=4)
"$loco" train "${base[@]}" --set train.precision=bf16 --set train.out_dir=a > a.out
precision=$($py -c "import json; print(json.load(open('a/summary.json'))['precision'])")
if [ "$precision" = fp32 ]; then
  grep -q "bf16 was asked for, but .* has no bf16 instructions" a.out
  echo "skipped: this CPU has no bf16 instructions ($(grep 'precision fp32' a.out))"
  exit 77
fi
grep -q "^precision bf16 (products with bf16 operands and fp32 accumulation through oneDNN" a.out
ck=checkpoints/step_00000020
"$loco" train "${base[@]}" --set train.precision=bf16 --set train.out_dir=b --quiet > /dev/null
"$loco" train "${base[@]}" --set train.precision=bf16 --set train.out_dir=c --quiet --until 10 > /dev/null
"$loco" train --resume c --quiet > /dev/null
"$loco" train "${base[@]}" --set train.out_dir=fp32 --quiet > /dev/null
for f in model.safetensors replica-0.safetensors replica-1.safetensors; do
  cmp a/$ck/$f b/$ck/$f  # repeatable
  cmp a/$ck/$f c/$ck/$f  # resumed
done
if cmp -s a/$ck/model.safetensors fp32/$ck/model.safetensors; then echo "FAIL: bf16 equals fp32"; exit 1; fi
# auto picks bf16 here.
"$loco" train "${base[@]}" --set train.precision=auto --set train.out_dir=auto --set train.steps=2 > auto.out
grep -q "^precision bf16 (auto, " auto.out
echo "bf16: OK"
