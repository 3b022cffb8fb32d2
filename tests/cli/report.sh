#!/usr/bin/env bash
# What users look at: TensorBoard event files (decoded independently, CRCs and values, also
# across a resume), `loco report` (self-contained HTML with one loss curve per run, rendered by
# headless Chromium without console errors, a non-empty screenshot), its errors, and the Slurm
# script of docs/distributed.md (bash -n).
set -euo pipefail
loco=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work" && cd "$work"

$py "$here/../tools/make_text.py" text 1 3000 5
"$loco" data prepare --input text --tokenizer bytes --val-fraction 0.1 --out data > /dev/null
# The same text as one gzip-compressed JSON Lines record gives the same tokens.
$py - text/doc0.txt docs.jsonl.gz <<'PY'
import gzip, json, sys
with gzip.open(sys.argv[2], "wt", encoding="utf-8") as f:
    f.write(json.dumps({"id": 0, "text": open(sys.argv[1], encoding="utf-8").read()}) + "\n")
PY
"$loco" data prepare --input docs.jsonl.gz --tokenizer bytes --val-fraction 0.1 --out data_jsonl > /dev/null
# The same tokens in all (the split and the order differ: a text file is cut into pieces for the
# split, a JSON Lines input is split by document).
$py - data data_jsonl <<'PY'
import sys, numpy
def tokens(d):
    return numpy.sort(numpy.concatenate([numpy.fromfile(f"{d}/{n}.tok", dtype="<u2", offset=64) for n in ("train", "val")]))
a, b = tokens(sys.argv[1]), tokens(sys.argv[2])
assert len(a) == len(b) and (a == b).all(), "the JSON Lines input gives other tokens than the text"
PY
base=(--config "$root/configs/tiny.toml" --set data.train=data/train.tok --set data.val=data/val.tok --quiet)

# TensorBoard: an uninterrupted run, and one paused at step 20 and resumed (two event files, a
# SessionLog START at 20); the checker's own CRC and schema, values equal to metrics.jsonl.
"$loco" train "${base[@]}" --set train.tensorboard=true --set train.out_dir=full > /dev/null
"$loco" train "${base[@]}" --set train.tensorboard=true --set train.out_dir=split --until 20 > /dev/null
"$loco" train --resume split --quiet > /dev/null
$py "$here/../tools/tb_events.py" full
$py "$here/../tools/tb_events.py" split full
[ "$(ls split/events.out.tfevents.* | wc -l)" -eq 2 ]
# The checker fails on a flipped byte (it can fail).
mkdir -p flipped && cp full/metrics.jsonl full/summary.json flipped/
cp full/events.out.tfevents.* flipped/
f=$(ls flipped/events.out.tfevents.*)
$py - "$f" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x01
open(p, "wb").write(b)
PY
if $py "$here/../tools/tb_events.py" flipped 2> flipped.err; then echo "FAIL: corrupted event file accepted"; exit 1; fi
grep -q "CRC" flipped.err
# The resumed run's summary kept the per-worker series of the first segment.
$py - split/summary.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
steps = [p["step"] for p in s["workers"][0]["series"]]
assert steps == list(range(5, 45, 5)), steps
PY

# Two more methods for the report: DiLoCo with 2 replicas, a 2-stage pipeline with 2 replicas.
"$loco" train "${base[@]}" --set algorithm=diloco --set outer.inner_steps=10 --set distributed.replicas=2 \
  --set train.out_dir=diloco > /dev/null 2> diloco.err
# Its settings are where the parity study found DiLoCo trailing: the run says so at start (and a
# lone data-parallel worker gets no such warning).
grep -q "^loco: warning: diloco with 128 tokens per replica per step (fewer than 16,384): .*docs/results/parity-32k.md" diloco.err
grep -q "^loco: warning: a budget of .* tokens per parameter (fewer than 20" diloco.err
"$loco" train "${base[@]}" --set train.out_dir=lone > /dev/null 2> lone.err
! grep -q warning lone.err
"$loco" train "${base[@]}" --set pipeline.stages=2 --set distributed.replicas=2 --set train.out_dir=pipe > /dev/null
"$loco" report full diloco pipe --out report.html > /dev/null
$py - report.html full diloco pipe <<'PY'
import json, re, sys
from html.parser import HTMLParser
html = open(sys.argv[1], encoding="utf-8").read()
runs = sys.argv[2:]
# Self-contained: no external resources (the SVG namespace is an identifier, not a fetch).
body = html.replace('xmlns="http://www.w3.org/2000/svg"', "")
assert not re.search(r"(src|href)\s*=|url\(|@import|https?://", body), "external reference in the report"

class Walk(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.curves, self.tables = [], {}, set()
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg":
            self.stack.append(a.get("id"))
        if tag == "table" and a.get("id"):
            self.tables.add(a["id"])
        if tag == "path" and self.stack:
            key = (self.stack[-1], a.get("class"))
            self.curves.setdefault(key, []).append(a.get("data-run"))
    def handle_endtag(self, tag):
        if tag == "svg":
            self.stack.pop()
w = Walk()
w.feed(html)
for chart in ("loss-vs-tokens", "loss-vs-time"):
    assert sorted(w.curves[(chart, "loss-curve train")]) == sorted(runs), w.curves.get((chart, "loss-curve train"))
    assert sorted(w.curves[(chart, "loss-curve val")]) == sorted(runs)
for r in runs:
    assert ("cu-" + r, "worker-cu") in w.curves and ("bytes-" + r, "worker-bytes") in w.curves, r
assert len(w.curves[("cu-diloco", "worker-cu")]) == 2 and len(w.curves[("cu-pipe", "worker-cu")]) == 4
assert ("bubble-pipe", "worker-bubble") in w.curves and ("bubble-diloco", "worker-bubble") not in w.curves
assert {"runs", "config-diff"} <= w.tables, w.tables
for key in ("algorithm", "pipeline.stages", "distributed.replicas", "train.out_dir"):
    assert f"<td>{key}</td>" in html, key
assert "<td>outer_gradients</td>" in html and "<td>activations</td>" in html
assert 'id="membership"' not in html, "a membership chart for runs that are not elastic"
# Provenance: every invocation of every run, with its command as typed (HTML-escaped).
assert "provenance" in w.tables, w.tables
for r in runs:
    for line in open(f"{r}/invocations.jsonl"):
        inv = json.loads(line)
        esc = inv["command"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        esc = esc.replace('"', "&quot;").replace("'", "&#39;")
        assert esc in html, inv["command"]
print(f"report: {len(runs)} runs, one train and one val curve per run in both loss charts")
PY
# The summary first: the best run at equal tokens, computed here from the metrics (validation loss
# interpolated linearly at the budget where the shortest run ends), and the short-budget warning.
$py - report.html full diloco pipe <<'PY'
import json, re, sys
html = open(sys.argv[1], encoding="utf-8").read()
runs = sys.argv[2:]
assert html.index('id="verdict"') < html.index('id="runs"'), "the summary is not the first section"
curves = {r: [(m["tokens"], m["val_loss"]) for m in map(json.loads, open(f"{r}/metrics.jsonl")) if "val_loss" in m]
          for r in runs}
budget = min(c[-1][0] for c in curves.values())
def at(c):
    for (x0, y0), (x1, y1) in zip([(0, None)] + c, c):
        if x1 >= budget:
            return y1 if x1 == budget else y0 + (y1 - y0) * (budget - x0) / (x1 - x0)
loss = {r: at(c) for r, c in curves.items()}
best = min(loss, key=loss.get)
item = re.search(r'<li data-axis="tokens">(.*?)</li>', html).group(1)
assert f'data-run="{best}"' in item and f"{loss[best]:.4f}" in item, (best, loss, item)
for r in runs:
    if r != best:
        assert f"<b>{r}</b> {100 * (loss[r] / loss[best] - 1):+.2f}%" in item, (r, item)
assert 'data-axis="time"' in html
assert 'id="budget-warning"' in html and "too short to rank methods" in html
# The network of each run in the runs table; a key a run's method does not read is "(unused)",
# values as written in config.toml (no 0.69999999999999996).
assert "<th>network</th>" in html
diff = html[html.index('id="config-diff"'):]
diff = diff[:diff.index("</table>")]
row = re.search(r"<tr><td>outer.lr</td>(.*?)</tr>", diff)
assert row is None or "(unused)" in row.group(1), row
assert not re.search(r"\d\.\d{12,}", diff), "a value not as written"
# Shares start at zero: the CU charts have a tick at 0.
for r in runs:
    chart = html[html.index(f'id="cu-{r}"'):]
    assert re.search(r'text-anchor="end">0</text>', chart[:chart.index("</svg>")]), r
print("report: the summary names the best run at equal tokens and warns of the short budget; network, config, CU axes")
PY
# An evaluation with a note (Streaming DiLoCo's partly synchronized outer parameters) is a hollow
# point whose title carries the note; plot uses the report's colours and writes 350k, not 350000.
mkdir -p noted && cp full/summary.json full/config.toml noted/
$py - full/metrics.jsonl noted/metrics.jsonl <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
for r in recs:
    r["tokens"] *= 100  # token counts past 10^4, written 100k by report and plot
    if "val_loss" in r and r["step"] == 20:
        r["val_note"] = "fragments synced at steps 10 and 20"
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in recs))
PY
"$loco" report noted full --out noted.html > /dev/null
grep -q 'class="noted"[^>]*><title>noted val: .* (fragments synced at steps 10 and 20)</title>' noted.html ||
  { echo "FAIL: an evaluation with a note is not marked"; exit 1; }
[ "$(grep -o 'class="noted"' noted.html | wc -l)" -eq 2 ]  # one point, in both loss charts
"$loco" plot noted full --out plot.svg > /dev/null
# gnuplot's SVG writes colours as rgb(r, g, b): the report's first two, #1f77b4 and #d62728.
grep -q 'stroke="rgb( *31, *119, *180)' plot.svg && grep -q 'stroke="rgb( *214, *39, *40)' plot.svg ||
  { echo "FAIL: plot does not use the report's colours"; exit 1; }
grep -q '>[0-9.]*k</tspan>' plot.svg && ! grep -q '>[0-9]\{5,\}</tspan>' plot.svg ||
  { echo "FAIL: plot's token ticks are not written as 100k"; exit 1; }
echo "report and plot: a noted evaluation marked; plot in the report's colours with 350k-style ticks"

# compare: human units, "-" where nothing was measured, a run without a summary from its metrics,
# and an error before anything is printed.
mkdir -p running noval && head -n 3 diloco/metrics.jsonl > running/metrics.jsonl && cp diloco/config.toml running/
$py - full/summary.json noval/summary.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["final_val_loss"] = -1
json.dump(s, open(sys.argv[2], "w"))
PY
"$loco" compare full running noval > compare.txt
$py - compare.txt full/summary.json running/metrics.jsonl <<'PY'
import json, re, sys
rows = {l.split()[0]: l for l in open(sys.argv[1]) if l.split() and l.split()[0] in ("full", "running", "noval")}
full = json.load(open(sys.argv[2]))
cols = rows["full"].split()
assert cols[4] == f"{full['final_val_loss']:.4f}", rows["full"]
assert re.fullmatch(r"\d{1,4}|\d+(\.\d+)?[kMGT]", cols[3]), cols[3]  # tokens: 3 significant digits, k/M/G
assert all(c.endswith("B") for c in cols[5:8]) and cols[8].endswith("B/s"), rows["full"]
last = json.loads(open(sys.argv[3]).read().splitlines()[-1])
assert f"(at {last['step']})" in rows["running"] and " diloco " in rows["running"], rows["running"]
assert rows["noval"].split()[4] == "-", rows["noval"]
print("compare: units, a running run, no evaluation")
PY
# A non-finite evaluation or loss is written as null (JSON has no NaN; loco.torch writes a NaN
# loss so): report, compare and plot read it and show "nan" where they show the loss.
mkdir -p nanval && cp diloco/config.toml nanval/
$py - diloco/metrics.jsonl nanval/metrics.jsonl <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
recs[-1]["val_loss"] = None
recs[-2]["train_loss"] = None
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in recs))
PY
"$loco" report nanval full --out nanval.html > /dev/null
grep -q '<td class="n">nan</td>' nanval.html || { echo "FAIL: report of a null val_loss does not show nan"; exit 1; }
"$loco" compare nanval full > nanval.txt
grep -q "^nanval (at [0-9]*) .* nan " nanval.txt || { echo "FAIL: compare of a null val_loss:"; cat nanval.txt; exit 1; }
"$loco" plot nanval full --out nanval.png > /dev/null
echo "a null (non-finite) val_loss and train_loss: report shows nan, compare and plot read them"
if "$loco" compare full norun > out.txt 2> err.txt; then echo "FAIL: compare of a non-run accepted"; exit 1; fi
[ ! -s out.txt ] && grep -q "norun: not a run directory" err.txt

# An elastic worker's metrics (members per record, membership events): the report draws the
# members against step and lists the events.
mkdir -p elastic && cp full/summary.json full/config.toml elastic/
$py - full/metrics.jsonl elastic/metrics.jsonl <<'PY'
import json, sys
out = open(sys.argv[2], "w")
for line in open(sys.argv[1]):
    r = json.loads(line)
    r["members"] = 3 if 15 <= r["step"] < 30 else 4
    if r["step"] == 15:
        r["membership"] = [{"event": "left", "member": 2, "name": "w2", "round": 3, "tokens_lost": 640,
                            "why": "heartbeat expired"}]
    if r["step"] == 30:
        r["membership"] = [{"event": "joined", "member": 5, "name": "w5", "round": 6, "why": "joined"}]
    out.write(json.dumps(r) + "\n")
PY
"$loco" report elastic full --out elastic.html > /dev/null
$py - elastic.html <<'PY'
import re, sys
html = open(sys.argv[1], encoding="utf-8").read()
chart = html[html.index('id="membership"'):]
chart = chart[:chart.index("</svg>")]
assert 'data-run="elastic"' in chart and 'data-run="full"' not in chart, "members curve"
events = html[html.index('id="membership-events"'):]
rows = re.findall(r'<tr data-run="elastic">(.*?)</tr>', events[:events.index("</table>")])
cells = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in rows]
assert cells == [["elastic", "15", "left", "w2", "3", "640", "heartbeat expired"],
                 ["elastic", "30", "joined", "w5", "6", "", "joined"]], cells
print("report: the elastic run's members chart and its two membership events")
PY

# Bad inputs: one line, exit 1.
mkdir -p notrun
if "$loco" report notrun --out x.html 2> err.txt; then echo "FAIL: report of a non-run accepted"; exit 1; fi
[ "$(wc -l < err.txt)" -eq 1 ] && grep -q "notrun: not a loco run directory (no metrics.jsonl)" err.txt
mkdir -p badrec && echo '{"step": 1}' > badrec/metrics.jsonl
if "$loco" report badrec --out x.html 2> err.txt; then echo "FAIL: malformed metrics accepted"; exit 1; fi
grep -q "badrec/metrics.jsonl:1: not a loco metrics record" err.txt
[ ! -e x.html ]
# refused WHAT PATTERN CMD...: CMD fails with one line of stderr matching PATTERN (grep -E).
refused() {
  local what=$1 pattern=$2; shift 2
  if $loco "$@" > out.txt 2> err.txt; then echo "FAIL: $* accepted $what"; exit 1; fi
  [ "$(wc -l < err.txt)" -eq 1 ] && grep -Eq "$pattern" err.txt || { echo "FAIL: $* with $what:"; cat err.txt; exit 1; }
  [ ! -s out.txt ] || { echo "FAIL: $* with $what: refused after printing: $(head -3 out.txt)"; exit 1; }
}
# plot and compare (a run without a summary) read records as report does: a step that is not a
# whole number, a line that is not an object, an empty file: one line naming it, exit 1.
for rec in '{"step": 1e300, "tokens": 1, "train_loss": 1}' '{"step": "x", "tokens": 1, "train_loss": 1}' '5' ''; do
  printf '%s\n' "$rec" > badrec/metrics.jsonl
  pattern="badrec/metrics.jsonl(:1: not a (loco metrics record|JSON object)|: no records yet)"
  refused "'$rec'" "$pattern" plot badrec --out x.png
  refused "'$rec'" "$pattern" compare badrec
done
[ ! -e x.png ]
# summary.json as report and compare read it: counts they print as integers (1e300 replicas
# converted to int was undefined), negative traffic, no workers: one line naming the value, exit 1.
for spoil in 's["replicas"] = 1e300' 's["replicas"] = 0' 's["workers"][-1]["bytes_sent"] = -1' 's["workers"] = []' 's["workers"][0] = 5' \
             's["workers"][0]["by_operation"]["gradients"] = "x"' 's["workers"][0]["compute_utilization"] = 1e300'; do
  rm -rf badsum && mkdir badsum && cp full/metrics.jsonl full/config.toml badsum/
  $py - full/summary.json badsum/summary.json "$spoil" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["workers"][0].setdefault("by_operation", {})["gradients"] = {}
exec(sys.argv[3])
json.dump(s, open(sys.argv[2], "w"))
PY
  refused "$spoil" "badsum/summary.json: " report badsum --out x.html
  refused "$spoil" "badsum/summary.json: " compare badsum
done
[ ! -e x.html ]
echo "bad metrics records and summaries: plot, compare and report refuse them naming the value"

# Slurm: the batch script in docs/distributed.md parses.
$py - "$root/docs/distributed.md" slurm.sbatch <<'PY'
import re, sys
doc = open(sys.argv[1]).read()
blocks = re.findall(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", doc, re.S)
assert len(blocks) == 1, f"{len(blocks)} Slurm scripts in docs/distributed.md"
open(sys.argv[2], "w").write(blocks[0])
PY
bash -n slurm.sbatch
grep -q -- "--resume" slurm.sbatch

# Headless Chromium (installed by scripts/test.sh): renders without console messages, the
# script ran, one train curve per run in the rendered DOM, a screenshot with content. The
# console check is shown to catch an error first.
browser=$(command -v chromium || true)
if [ -z "$browser" ]; then
  echo "chromium not installed: skipping the rendering check (scripts/test.sh installs it)"
  exit 0
fi
render() {  # render PAGE OUT_PREFIX: DOM to OUT.dom, console to OUT.log, screenshot OUT.png
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --enable-logging=stderr --v=0 \
    --user-data-dir="$work/chromium-profile" --dump-dom "file://$work/$1" > "$2.dom" 2> "$2.log"
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/chromium-profile" \
    --window-size=1280,3000 --screenshot="$work/$2.png" "file://$work/$1" > /dev/null 2>&1
}
echo '<html><body><script>undefinedFunction();</script></body></html>' > broken.html
render broken.html broken
grep -q "CONSOLE.*undefinedFunction" broken.log || { echo "FAIL: the console check misses an error"; exit 1; }
render report.html report
if grep -q "CONSOLE" report.log; then echo "FAIL: console messages:"; grep CONSOLE report.log; exit 1; fi
grep -q 'data-ready="1"' report.dom
$py - report.dom report.png full diloco pipe <<'PY'
import re, struct, sys, zlib
dom = open(sys.argv[1], encoding="utf-8").read()
runs = sys.argv[3:]
chart = dom[dom.index('id="loss-vs-tokens"'):]
chart = chart[:chart.index("</svg>")]
found = re.findall(r'<path class="loss-curve train" data-run="([^"]+)"', chart)
assert sorted(found) == sorted(runs), found
png = open(sys.argv[2], "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, width = 8, b"", 0
while pos < len(png):
    n, kind = struct.unpack(">I4s", png[pos:pos + 8])
    if kind == b"IHDR":
        width = struct.unpack(">I", png[pos + 8:pos + 12])[0]
    if kind == b"IDAT":
        idat += png[pos + 8:pos + 8 + n]
    pos += 12 + n
pixels = zlib.decompress(idat)
distinct = len(set(pixels[i:i + 3] for i in range(1, min(len(pixels), 4_000_000), 4)))
assert width >= 1000 and distinct > 20, (width, distinct)
print(f"chromium: rendered, {len(found)} train curves, screenshot {len(png)} bytes, {distinct} distinct colour samples")
PY
