#!/usr/bin/env bash
# The reproduction study's machinery (scripts/reproduce.py) end to end on a tiny budget: two of its
# runs, stopped half way (--until) and continued from their checkpoints (the resumed run equals an
# uninterrupted one bitwise), their compute-utilization runs over the emulated link, the page
# written from the records, --report-only regenerating it (and its plot) byte for byte, bad input;
# and the committed study page regenerating byte for byte from the committed records; the same for
# the quality-parity study (scripts/parity.py), whose later runs depend on the earlier ones' results,
# and the robustness study (scripts/robustness.py).
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

# The quality-parity study's machinery (scripts/parity.py) on the same tiny data: its tuning
# protocol decided from the records, a stop and continue, the page and its regeneration.
parity=($py "$root/scripts/parity.py" --loco "$loco" --config "$root/configs/tiny.toml"
        --set data.train=data/train.tok --set data.val=data/val.tok --steps 40 --global-batch 8
        --out parity-runs --records parity-rec --page page/parity.md)
"${parity[@]}" --max-runs 3 > p1.log
[ "$(ls parity-rec | wc -l)" -eq 3 ]
grep -q "Runs recorded: 3 of the 4 decided so far (the tuning protocol decides" page/parity.md
"${parity[@]}" --until 20 > p2.log
grep -q "dp-lr8e-3: stopped at step 20 of 40" p2.log
"${parity[@]}" > p3.log
grep -q "dp-lr8e-3: resuming from its latest checkpoint" p3.log
grep -q "every run finished" p3.log
$py - parity-rec page/parity.md <<'PY'
import json, os, sys, tomllib
rec, page = sys.argv[1], open(sys.argv[2]).read()
def val(n): return json.load(open(f"{rec}/{n}/summary.json"))["final_val_loss"]
def cfg(n): return tomllib.load(open(f"{rec}/{n}/config.toml", "rb"))
names = sorted(os.listdir(rec))
dps = [n for n in names if n.startswith("dp-") and "seed" not in n]
lrs = sorted(cfg(n)["optimizer"]["lr"] for n in dps)
assert len(lrs) >= 4 and all(abs(b / a - 2) < 1e-9 for a, b in zip(lrs, lrs[1:])), lrs  # factors of 2
dp = min(dps, key=val)
dp_lr = cfg(dp)["optimizer"]["lr"]
# Data-parallel's best is inside the grid, or the grid reached its 8 values.
assert len(lrs) == 8 or lrs[0] < dp_lr < lrs[-1], (lrs, dp_lr)
assert len(names) == len(dps) + 4 * (10 + len(dps) - 1) + 4 + 4, len(names)
# The diagnoses of M = 4's gap, at data-parallel's best inner lr: a lone worker on a quarter of the
# batch, and 4 replicas that only average their parameters every 30 steps and every step, or
# double the averaged move every 30 steps.
diag = {n: cfg(n) for n in names if n.startswith("diag-")}
assert all(c["optimizer"]["lr"] == dp_lr for c in diag.values()), diag
lone = [c for c in diag.values() if c["algorithm"] == "ddp"]
assert len(lone) == 1 and lone[0]["distributed"]["replicas"] == 1 and lone[0]["data"]["batch_size"] == 2, lone
avg = sorted((c["outer"]["inner_steps"], c["outer"]["lr"]) for c in diag.values() if c["algorithm"] == "diloco"
             and c["outer"]["momentum"] == 0 and c["distributed"]["replicas"] == 4)
assert avg == [(1, 1), (30, 1), (30, 2)], avg
assert "## Diagnoses of M = 4's gap" in page
for m in (1, 2, 4, 8):
    runs = [n for n in names if n.startswith(f"m{m}-") and "seed" not in n and "warm" not in n]
    assert len(runs) == 10 + len(dps) - 1, (m, runs)
    stage_a = [n for n in runs if cfg(n)["optimizer"]["lr"] == dp_lr]
    assert len(stage_a) == 10, (m, stage_a)  # every outer cell at data-parallel's best inner lr
    best_a = min(stage_a, key=val)
    for n in set(runs) - set(stage_a):  # the other inner lrs at that M's best outer cell
        assert cfg(n)["outer"]["lr"] == cfg(best_a)["outer"]["lr"], n
        assert cfg(n)["outer"]["momentum"] == cfg(best_a)["outer"]["momentum"], n
    for n in runs:
        c = cfg(n)
        assert c["distributed"]["replicas"] == m and c["data"]["batch_size"] * m == 8, n
    best = min(runs, key=val)
    gap = 100 * (val(best) / val(dp) - 1)
    row = next(l for l in page.splitlines() if l.startswith(f"| DiLoCo M={m} |"))
    assert f"`{best}`" in row and f"{gap:+.2f}%" in row, row
warm = [n for n in names if "warm" in n]
assert len(warm) == 2 and all(cfg(n)["outer"]["start_step"] == 8 for n in warm), warm
PY
cp page/parity.md parity.before
rm -rf parity-runs
"${parity[@]}" --report-only > /dev/null
cmp page/parity.md parity.before
# The 32k phase's claims (scripts/parity.py claim_runs) and lesson, decided from the tuning runs above (same
# names: the records are copied), each run's settings and the page's table.
cp -r parity-rec parity32-rec
"${parity[@]/parity-rec/parity32-rec}" --phase 32k --page page/parity32.md > p32.log
$py - parity32-rec page/parity32.md <<'PY'
import os, sys, tomllib
rec, page = sys.argv[1], open(sys.argv[2]).read()
def cfg(n): return tomllib.load(open(f"{rec}/{n}/config.toml", "rb"))
claims = {n: cfg(n) for n in sorted(os.listdir(rec)) if n.startswith("c-")}
assert len(claims) == 10, sorted(claims)
s = {n: c for n, c in claims.items() if c["algorithm"] == "streaming"}
assert sorted((c["outer"]["codec"], c["outer"]["reduce"]) for c in s.values()) == \
    [("fp32", "auto"), ("fp32", "auto"), ("fp4-e3m0", "all-gather"), ("fp4-e3m0", "reduce-scatter")], s
# Streaming DiLoCo at the paper's outer settings against the tuned ones.
paper, tuned = claims["c-streaming4-fp32-paper-outer"]["outer"], claims["c-streaming4-fp32"]["outer"]
assert (paper["lr"], paper["momentum"]) == (0.4, 0.9) and (tuned["lr"], tuned["momentum"]) != (0.4, 0.9), paper
assert all(c["distributed"]["replicas"] == 4 and c["streaming"]["fragment_blocks"] == 1 for c in s.values())
p = sorted(c["partial"]["slices"] for c in claims.values() if c["partial"]["slices"] > 1)
assert p == [2, 4] and all(c["distributed"]["replicas"] == 8 for c in claims.values() if c["partial"]["slices"] > 1)
hb = claims["c-diloco4-heavyball"]["outer"]
nl = claims["c-noloco4"]["noloco"]
assert hb["nesterov"] is False and (nl["outer_lr"], nl["momentum"]) == (hb["lr"], hb["momentum"]), (hb, nl)
pipe, proto = claims["c-pipeline2"], claims["c-protocol2-k12"]
assert pipe["pipeline"]["stages"] == 2 and pipe["protocol"]["rank"] == 0 and proto["protocol"]["rank"] == 12
assert not pipe["model"]["tie_embeddings"] and not proto["model"]["tie_embeddings"]
table = page.split("## Other claims at the tuned settings")[1]
assert all(f"| `{n}` |" in table for n in claims) and "not run yet" not in table, table
lesson = next(l for l in page.splitlines() if l.startswith("Lesson: at 20 tokens per parameter"))
assert all(f"M={m} " in lesson for m in (1, 2, 4, 8)), lesson  # the demo's closing line (scripts/demo.sh)
print("reproduce: the 32k phase's 10 claim runs have their settings and their table")
PY
for phase in 8k 32k; do  # the study's two phases (scripts/parity.py PHASES)
  name=parity; [ $phase = 8k ] || name=parity-$phase
  [ -f "$root/docs/results/$name.md" ] || continue
  mkdir -p committed
  $py "$root/scripts/parity.py" --phase $phase --report-only --records "$root/docs/results/$name" \
    --page committed/$name.md > /dev/null
  cmp committed/$name.md "$root/docs/results/$name.md"
  echo "reproduce: docs/results/$name.md regenerates from its records"
done
# The robustness study's machinery (scripts/robustness.py) on the tiny model: 8 replicas, the honest
# runs under each rule and the first bad ones (a x-10 replica), the page and its regeneration.
robust=($py "$root/scripts/robustness.py" --loco "$loco" --config "$root/configs/tiny.toml"
        --bench "$(dirname "$loco")/bench/loco_robust_bench" --set data.train=data/train.tok
        --set data.val=data/val.tok --set algorithm=diloco --set distributed.replicas=8 --set outer.inner_steps=10
        --steps 20 --out robust-runs --records robust-rec --page page/robustness.md)
"${robust[@]}" --max-runs 7 > r1.log
[ "$(ls robust-rec | wc -l)" -eq 7 ]
grep -q "Runs recorded: 7 of 41" page/robustness.md
$py - robust-rec page/robustness.md <<'PY'
import json, sys, tomllib
rec, page = sys.argv[1], open(sys.argv[2]).read()
def val(n): return json.load(open(f"{rec}/{n}/summary.json"))["final_val_loss"]
def cfg(n): return tomllib.load(open(f"{rec}/{n}/config.toml", "rb"))
assert cfg("honest-median")["outer"]["aggregate"] == "median" and cfg("honest-mean")["outer"]["screen"] == "off"
bad = cfg("bad1-flip10-screened")["outer"]
assert bad["fault"] == "scale:-10" and bad["faulty_replicas"] == 1 and bad["screen"] == "on", bad
row = next(l for l in page.splitlines() if l.startswith("| sign-flipped x10 |"))
gap = 100 * (val("bad1-flip10-screened") / val("honest-mean") - 1)
assert f"{val('bad1-flip10-screened'):.4f} ({gap:+.2f}%, left out 2 times in 2 rounds)" in row, row
PY
cp page/robustness.md robust.before
"${robust[@]}" --report-only > /dev/null
cmp page/robustness.md robust.before
if [ -f "$root/docs/results/robustness.md" ]; then
  mkdir -p committed
  $py "$root/scripts/robustness.py" --report-only --records "$root/docs/results/robustness" \
    --page committed/robustness.md > /dev/null
  cmp committed/robustness.md "$root/docs/results/robustness.md"
  echo "reproduce: docs/results/robustness.md regenerates from its records"
fi
echo "reproduce: OK"
