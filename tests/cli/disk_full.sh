#!/usr/bin/env bash
# A full disk (a tmpfs of a few hundred KiB; mounting one needs root, else skipped) stops a run
# with a clear error and a non-zero exit and loses nothing written before: the latest complete
# checkpoint stays, and once there is room --resume ends at the checkpoint and metrics of an
# uninterrupted run (bitwise). A disk that fills while metrics.jsonl is appended leaves a run
# that `loco report` still reads.
set -euo pipefail
loco=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
if [ "$(id -u)" -ne 0 ]; then echo "SKIPPED: not root (mounting a tmpfs needs it)"; exit 77; fi
umount "$work/disk" 2> /dev/null || true  # left by a run that was killed
rm -rf "$work" && mkdir -p "$work/text" "$work/disk" && cd "$work"
if ! mount -t tmpfs -o size=700k tmpfs disk 2> mount.txt; then
  echo "SKIPPED: cannot mount a tmpfs here: $(cat mount.txt)"; exit 77
fi
trap 'umount "$work/disk" 2> /dev/null || true' EXIT

$py "$here/../tools/make_text.py" text 2 1500 3
"$loco" data prepare --input text --tokenizer bytes --val-fraction 0.1 --out data > /dev/null
args=(--config "$root/configs/tiny.toml" --set data.train=data/train.tok --set data.val=data/val.tok --quiet)
"$loco" train "${args[@]}" --set train.out_dir=full > /dev/null

# 700 KiB hold the run's files and the checkpoint of step 20 (about 630 KiB), not that of step 40.
if "$loco" train "${args[@]}" --set train.out_dir=disk/run > /dev/null 2> err.txt; then
  echo "FAIL: a run on a full disk succeeded"; exit 1
fi
grep -q "^loco: error: .*step_00000040.*No space left on device" err.txt || { cat err.txt; exit 1; }
[ "$(cat disk/run/checkpoints/latest)" = step_00000020 ]
for f in model.safetensors replica-0.safetensors; do
  cmp full/checkpoints/step_00000020/$f disk/run/checkpoints/step_00000020/$f
done
mount -o remount,size=4m disk
"$loco" train --resume disk/run --quiet > /dev/null
[ "$(cat disk/run/checkpoints/latest)" = step_00000040 ]
cmp full/checkpoints/step_00000040/model.safetensors disk/run/checkpoints/step_00000040/model.safetensors
strip_time() { $py -c "import json,sys; [print(json.dumps({k: v for k, v in json.loads(l).items() if k not in ('time', 'comm_wait')})) for l in open(sys.argv[1])]" "$1"; }
diff <(strip_time full/metrics.jsonl) <(strip_time disk/run/metrics.jsonl)

# 40 KiB: metrics.jsonl fills the disk (a record every step, no checkpoint).
umount disk && mount -t tmpfs -o size=40k tmpfs disk
if "$loco" train "${args[@]}" --set train.out_dir=disk/run --set train.steps=3000 --set train.log_interval=1 \
    --set train.checkpoint_interval=100000 --set train.eval_interval=100000 > /dev/null 2> err.txt; then
  echo "FAIL: metrics written on a full disk"; exit 1
fi
grep -q "^loco: error: disk/run/metrics.jsonl: write failed: No space left on device" err.txt || { cat err.txt; exit 1; }
"$loco" report disk/run --out report.html > /dev/null
$py - disk/run/metrics.jsonl <<'PY'
import json, sys
lines = open(sys.argv[1]).read().split("\n")
whole = [json.loads(l) for l in lines[:-1]]  # every line but one cut short at the end is a record
assert len(whole) > 20 and [r["step"] for r in whole] == list(range(1, len(whole) + 1)), len(whole)
print(f"disk_full: metrics stopped after step {len(whole)}, {len(lines[-1])} bytes of a record cut short")
PY
echo "disk_full: OK"
