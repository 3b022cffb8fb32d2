#!/usr/bin/env bash
# The reproduction study's machinery (scripts/reproduce.py) end to end on a tiny budget: two of its
# runs, stopped half way (--until) and continued from their checkpoints (the resumed run equals an
# uninterrupted one bitwise), their compute-utilization runs over the emulated link, the page
# written from the records, --report-only regenerating it (and its plot) byte for byte, bad input;
# and the committed study page regenerating byte for byte from the committed records.
set -euo pipefail
loco=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work" && cd "$work"

$py "$here/../tools/make_text.py" text 1 3000 5
"$loco" data prepare --input text --tokenizer bytes --val-fraction 0.1 --out data > /dev/null
study=($py "$root/scripts/reproduce.py" --loco "$loco" --config "$root/configs/tiny.toml"
       --set data.train=data/train.tok --set data.val=data/val.tok --steps 40 --out runs --records rec
       --page page/reproduction.md)
mkdir -p page
runs=ddp,diloco-h20-lr0.7

# Half way: the long runs stop at step 20 with a checkpoint; nothing of theirs is recorded yet.
"${study[@]}" --only "$runs" --until 20 > first.log
grep -q "ddp: stopped at step 20 of 40" first.log
grep -q "diloco-h20-lr0.7: stopped at step 20 of 40" first.log
[ ! -e rec/ddp ]
[ ! -e rec/diloco-h20-lr0.7 ]
[ -f rec/cu-ddp/study.json ]  # the short link runs are not stopped by --until
[ -f rec/cu-diloco-h20-lr0.7/study.json ]
grep -q "Not run yet: ddp, " page/reproduction.md

# Continued: resumed from the checkpoints, recorded; a third invocation has nothing left to do.
"${study[@]}" --only "$runs" > second.log
[ "$(grep -c 'resuming from its latest checkpoint' second.log)" -eq 2 ]
grep -q "every run finished" second.log
"${study[@]}" --only "$runs" > third.log
if grep -q "starting\|resuming" third.log; then exit 1; fi

# The resumed run equals the same command run without a stop.
$py - rec/ddp/study.json > cmd.txt <<'PY'
import json, sys
print("\n".join(json.load(open(sys.argv[1]))["command"][1:]))
PY
mapfile -t cmd < cmd.txt
"$loco" "${cmd[@]}" --set train.out_dir=straight > /dev/null
$py - rec/ddp/summary.json straight/summary.json <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["final_val_loss"] == b["final_val_loss"], (a["final_val_loss"], b["final_val_loss"])
assert a["steps"] == b["steps"] == 40
PY

# The page: both rows with the records' numbers, CU from the link runs, the lesson line, a plot.
$py - page/reproduction.md rec <<'PY'
import json, sys
page = open(sys.argv[1]).read()
rec = sys.argv[2]
ddp = json.load(open(f"{rec}/ddp/summary.json"))
dl = json.load(open(f"{rec}/diloco-h20-lr0.7/summary.json"))
cu = json.load(open(f"{rec}/cu-diloco-h20-lr0.7/summary.json"))
gap = 100 * (dl["final_val_loss"] / ddp["final_val_loss"] - 1)
mean_cu = 100 * sum(w["compute_utilization"] for w in cu["workers"]) / len(cu["workers"])
row = next(l for l in page.splitlines() if l.startswith("| diloco-h20-lr0.7 |"))
assert f"{dl['final_val_loss']:.4f}" in row and f"{gap:+.2f}%" in row and f"{mean_cu:.1f}%" in row, row
assert next(l for l in page.splitlines() if l.startswith("| ddp |")).count(f"{ddp['final_val_loss']:.4f}") == 1
assert "Lesson: after 40 steps" in page and "DiLoCo H=20 " in page
assert "Runs recorded: 2 of" in page
assert cu["workers"][0]["comm_wait_s"] > 0, "the CU run waited on no link"
PY
[ -s page/reproduction-loss.png ]
[ -s page/reproduction-loss-steps.png ]

# --report-only regenerates the page and the plot byte for byte, from the records alone.
cp page/reproduction.md page.before && cp page/reproduction-loss.png plot.before
cp page/reproduction-loss-steps.png plot-steps.before
rm -rf runs
"${study[@]}" --report-only > /dev/null
cmp page/reproduction.md page.before
cmp page/reproduction-loss.png plot.before
cmp page/reproduction-loss-steps.png plot-steps.before

# Bad input: an unknown run, and a budget that differs from the one a stopped run started with.
if "${study[@]}" --only nosuch 2> err.txt; then exit 1; fi
grep -q "no run named 'nosuch'" err.txt
"${study[@]}" --only single --until 20 > /dev/null
if "${study[@]}" --only single --steps 60 2> err.txt; then exit 1; fi
grep -q "was started with 40 steps, not 60" err.txt
# The committed study page regenerates byte for byte from the committed records (the plots are
# compared above, on one machine: their bytes depend on the fonts gnuplot finds).
if [ -f "$root/docs/results/reproduction/ddp/study.json" ]; then
  mkdir -p committed
  $py "$root/scripts/reproduce.py" --report-only --loco "$loco" --records "$root/docs/results/reproduction" \
    --page committed/reproduction.md > /dev/null
  cmp committed/reproduction.md "$root/docs/results/reproduction.md"
  echo "reproduce: docs/results/reproduction.md regenerates from its records"
fi
echo "reproduce: OK"
