#!/usr/bin/env bash
# Screening and robust aggregation through `loco train` (outer.screen, outer.aggregate; bad
# replicas made with outer.fault): 5 in-process DiLoCo replicas, one of them bad, against the honest
# run; the same for Streaming DiLoCo (fp32 and fp4 over the all-gather); MPI == in-process with a
# robust rule; config errors.
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --quiet
      --set train.steps=40 --set outer.inner_steps=5 --set algorithm=diloco --set distributed.replicas=5
      --set outer.lr=0.7 --set outer.momentum=0.5)
run() {  # run NAME ARGS...: trains into NAME, stderr in NAME.err
  local name=$1; shift
  "$loco" train "${base[@]}" --set train.out_dir="$name" "$@" 2> "$name.err"
}
run honest
run honest-screened --set outer.screen=on
run honest-median --set outer.aggregate=median
# Nobody rejected: screening over the mean changes nothing (the same all-reduce, bit for bit).
cmp honest/checkpoints/step_00000040/model.safetensors honest-screened/checkpoints/step_00000040/model.safetensors
for fault in nan scale:-10 scale:1000; do
  tag=${fault/:/}
  run "mean-$tag" --set outer.fault="$fault" --set outer.screen=on
  [ "$(grep -c "left out: replica 4: " "mean-$tag.err")" -eq 8 ] || { cat "mean-$tag.err"; exit 1; }
  for rule in median trimmed-mean centered-clip; do run "$rule-$tag" --set outer.fault="$fault" --set outer.aggregate=$rule; done
done
# Without screening: a x1000 member wrecks the mean, and a NaN member stops the run with an error
# (no checkpoint: the first would be at step 20).
run plain-scale1000 --set outer.fault=scale:1000
if run plain-nan --set outer.fault=nan; then echo "FAIL: a NaN member did not stop an unscreened run"; exit 1; fi
grep -q "non-finite" plain-nan.err || { cat plain-nan.err; exit 1; }
[ ! -e plain-nan/checkpoints/latest ] || { echo "FAIL: a checkpoint after a NaN round"; exit 1; }
$py - <<'PY'
import json, math
def final(name): return json.load(open(f"{name}/summary.json"))["final_val_loss"]
def rejected(name): return [json.loads(l)["outer_rejected"] for l in open(f"{name}/metrics.jsonl") if "outer_rejected" in l]
honest, median = final("honest"), final("honest-median")
print(f"honest: mean {honest:.4f}, median {median:.4f}; unscreened x1000 member: {final('plain-scale1000'):.4f}")
assert abs(median / honest - 1) < 0.03, (median, honest)
assert final("plain-scale1000") > honest * 1.2, "a x1000 member should wreck the plain mean"
for fault in ("nan", "scale-10", "scale1000"):
    row = []
    for rule in ("mean", "median", "trimmed-mean", "centered-clip"):
        v = final(f"{rule}-{fault}")
        row.append(f"{rule} {v:.4f}")
        assert v is not None and math.isfinite(v) and abs(v / honest - 1) < 0.03, (rule, fault, v, honest)
    # Screening, on with every robust rule, rejects the bad replica in each of the 8 rounds.
    for rule in ("mean", "median", "trimmed-mean", "centered-clip"):
        assert rejected(f"{rule}-{fault}") == [1] * len(rejected(f"{rule}-{fault}")) != [], (rule, fault)
    print(f"one bad replica of 5 ({fault}): " + ", ".join(row))
PY
# Noise of the outer gradient's norm passes the norm rule: the screened mean takes it in, the median
# does not need to reject it.
run mean-noise --set outer.fault=noise --set outer.screen=on
run median-noise --set outer.fault=noise --set outer.aggregate=median
! grep -q "left out" mean-noise.err median-noise.err || { echo "FAIL: noise of the same norm rejected"; exit 1; }
$py -c "import json,sys; a,b,h=(json.load(open(f+'/summary.json'))['final_val_loss'] for f in ('mean-noise','median-noise','honest')); print(f'noise member: mean {a:.4f}, median {b:.4f}'); sys.exit(abs(b/h-1) >= 0.03)"
# The robust rules without the norm rule (reject_norm 0): a x-10 member is not rejected, and the
# median and trimmed mean still keep the run near the honest one.
run median-noscreen --set outer.fault=scale:-10 --set outer.aggregate=median --set outer.screen=off
grep -q "left out" median-noscreen.err && { echo "FAIL: screening off still rejected"; cat median-noscreen.err; exit 1; }
$py -c "import json,sys; a,b=(json.load(open(f+'/summary.json'))['final_val_loss'] for f in ('median-noscreen','honest')); print(f'median, x-10 member, no screening: {a:.4f}'); sys.exit(abs(a/b-1) >= 0.03)"
# NoLoCo screens its partners: with honest ones, screening on changes no bit; it reports how far the
# kept partners' slow weights were (a small share of their norm).
run noloco --set algorithm=noloco --set noloco.inner_steps=5
run noloco-screened --set algorithm=noloco --set noloco.inner_steps=5 --set outer.screen=on
cmp noloco/checkpoints/step_00000040/model.safetensors noloco-screened/checkpoints/step_00000040/model.safetensors
$py - <<'PY'
import json
recs = [json.loads(l) for l in open("noloco-screened/metrics.jsonl") if "partner_distance_ratio" in l]
ratios = [r["partner_distance_ratio"] for r in recs]
assert len(recs) >= 7 and all(r["outer_rejected"] == 0 for r in recs), recs
assert 0 < max(ratios) < 1.0, ratios  # below noloco.reject_distance
print(f"noloco, screened: partners' slow weights at most {max(ratios):.4f} of their norm apart")
PY
# Streaming DiLoCo (3 fragments, tau 1): screening with honest members changes no bit; one x-10
# member wrecks the plain mean in fp32 and in fp4 (reduce-scatter), and is left out of every sync
# by the screened mean (fp32) and by the median over the fp4 all-gather; a NaN member likewise.
stream=(--set algorithm=streaming --set streaming.fragment_blocks=1 --set streaming.tau=1 --set streaming.alpha=0.5)
run s-honest "${stream[@]}"
run s-honest-screened "${stream[@]}" --set outer.screen=on
cmp s-honest/checkpoints/step_00000040/model.safetensors s-honest-screened/checkpoints/step_00000040/model.safetensors
run s-honest-fp4 "${stream[@]}" --set outer.codec=fp4-e3m0
run s-plain-scale-10 "${stream[@]}" --set outer.fault=scale:-10
run s-plain-fp4-scale-10 "${stream[@]}" --set outer.codec=fp4-e3m0 --set outer.fault=scale:-10
run s-mean-scale-10 "${stream[@]}" --set outer.fault=scale:-10 --set outer.screen=on
run s-mean-nan "${stream[@]}" --set outer.fault=nan --set outer.screen=on
run s-median-fp4-scale-10 "${stream[@]}" --set outer.codec=fp4-e3m0 --set outer.fault=scale:-10 --set outer.aggregate=median
run s-clip-fp4-scale-10 "${stream[@]}" --set outer.codec=fp4-e3m0 --set outer.fault=scale:-10 \
  --set outer.aggregate=centered-clip --set outer.screen=off
$py - <<'PY'
import json, math
def final(name): return json.load(open(f"{name}/summary.json"))["final_val_loss"]
def rejected(name): return [json.loads(l)["outer_rejected"] for l in open(f"{name}/metrics.jsonl") if "outer_rejected" in l]
honest, fp4 = final("s-honest"), final("s-honest-fp4")
for name in ("s-plain-scale-10", "s-plain-fp4-scale-10"):
    assert final(name) > honest * 1.2, (name, final(name), honest)
for name, ref in (("s-mean-scale-10", honest), ("s-mean-nan", honest), ("s-median-fp4-scale-10", fp4),
                  ("s-clip-fp4-scale-10", fp4)):
    v = final(name)
    assert math.isfinite(v) and abs(v / ref - 1) < 0.03, (name, v, ref)
for name in ("s-mean-scale-10", "s-mean-nan", "s-median-fp4-scale-10"):
    assert rejected(name) and set(rejected(name)) == {1}, (name, rejected(name))
assert set(rejected("s-clip-fp4-scale-10")) == {0}
print(f"streaming, one x-10 member of 5: plain mean {final('s-plain-scale-10'):.4f} (fp4 "
      f"{final('s-plain-fp4-scale-10'):.4f}), screened mean {final('s-mean-scale-10'):.4f}, fp4 median "
      f"{final('s-median-fp4-scale-10'):.4f}, fp4 centered clip {final('s-clip-fp4-scale-10'):.4f}; "
      f"honest {honest:.4f} (fp4 {fp4:.4f})")
PY
grep -q "fragment 0's sync, left out: replica 4: outer gradient norm" s-median-fp4-scale-10.err || { cat s-median-fp4-scale-10.err; exit 1; }
timeout 120 mpirun -np 5 "$loco" train "${base[@]}" "${stream[@]}" --set distributed.replicas=1 --set outer.codec=fp4-e3m0 \
  --set outer.aggregate=median --set outer.fault=scale:-10 --set outer.faulty_replicas=1 --set train.out_dir=s-mpi \
  > s-mpi.out 2>&1 || { cat s-mpi.out; exit 1; }
cmp s-median-fp4-scale-10/checkpoints/step_00000040/model.safetensors s-mpi/checkpoints/step_00000040/model.safetensors

# Two members: the median rule cannot tell them apart, the run's own history can (algo/robust.h).
# A member that goes bad at step 20 (x-10) is left out of each of the 5 rounds from then on, by
# the screened mean and the median, in DiLoCo and Streaming DiLoCo; resumed from its checkpoint at
# step 25, the run keeps its history and ends with the same bits. A x1e4 member from the first
# round (no history yet) is left out by the wreck rule. Unscreened, both wreck the mean.
two=(--set distributed.replicas=2 --set outer.faulty_replicas=1)
run two-honest "${two[@]}"
run two-plain-bad20 "${two[@]}" --set outer.fault=scale:-10@20
run two-mean-bad20 "${two[@]}" --set outer.fault=scale:-10@20 --set outer.screen=on --set train.checkpoint_interval=5
run two-median-bad20 "${two[@]}" --set outer.fault=scale:-10@20 --set outer.aggregate=median
run two-plain-1e4 "${two[@]}" --set outer.fault=scale:10000
run two-mean-1e4 "${two[@]}" --set outer.fault=scale:10000 --set outer.screen=on
run two-split "${two[@]}" --set outer.fault=scale:-10@20 --set outer.screen=on --set train.checkpoint_interval=5 \
  --until 25 > /dev/null
"$loco" train --resume two-split --quiet > /dev/null 2> two-split.err
cmp two-mean-bad20/checkpoints/step_00000040/model.safetensors two-split/checkpoints/step_00000040/model.safetensors
run two-s-honest "${two[@]}" "${stream[@]}"
run two-s-mean-bad20 "${two[@]}" "${stream[@]}" --set outer.fault=scale:-10@20 --set outer.screen=on
run two-s-honest-fp4 "${two[@]}" "${stream[@]}" --set outer.codec=fp4-e3m0
run two-s-median-fp4-bad20 "${two[@]}" "${stream[@]}" --set outer.fault=scale:-10@20 --set outer.codec=fp4-e3m0 \
  --set outer.aggregate=median
grep -q "left out: replica 1: outer gradient norm .* > 3 x the largest accepted in the last 3 rounds" two-mean-bad20.err \
  || { cat two-mean-bad20.err; exit 1; }
grep -q "left out: replica 1: outer gradient norm .* x the outer parameters' norm .* (a wreck)" two-mean-1e4.err \
  || { cat two-mean-1e4.err; exit 1; }
$py - <<'PY'
import json, math
def final(name): return json.load(open(f"{name}/summary.json"))["final_val_loss"]
def rejected(name):
    return [(r["step"], r["outer_rejected"]) for r in map(json.loads, open(f"{name}/metrics.jsonl")) if "outer_rejected" in r]
honest, s_honest, s_fp4 = final("two-honest"), final("two-s-honest"), final("two-s-honest-fp4")
for name in ("two-plain-bad20", "two-plain-1e4"):
    assert final(name) > honest * 1.1, (name, final(name), honest)
for name in ("two-mean-bad20", "two-median-bad20"):
    assert rejected(name) == [(s, int(s >= 20)) for s in range(5, 41, 5)], (name, rejected(name))
assert [k for _, k in rejected("two-mean-1e4")] == [1] * 8, rejected("two-mean-1e4")
# The bad member left out from step 20 on: the honest one trains alone for the last 20 steps.
for name, ref, tol in (("two-mean-bad20", honest, 0.03), ("two-median-bad20", honest, 0.03),
                       ("two-s-mean-bad20", s_honest, 0.03), ("two-s-median-fp4-bad20", s_fp4, 0.03),
                       ("two-mean-1e4", honest, 0.05)):
    v = final(name)
    assert math.isfinite(v) and abs(v / ref - 1) < tol, (name, v, ref)
for name in ("two-s-mean-bad20", "two-s-median-fp4-bad20"):
    steps = rejected(name)
    assert steps and all(k == int(s > 20) for s, k in steps), (name, steps)
print(f"two members, one x-10 from step 20: plain mean {final('two-plain-bad20'):.4f}, screened mean "
      f"{final('two-mean-bad20'):.4f}, median {final('two-median-bad20'):.4f} (honest {honest:.4f}); streaming "
      f"screened mean {final('two-s-mean-bad20'):.4f} (honest {s_honest:.4f}), fp4 median "
      f"{final('two-s-median-fp4-bad20'):.4f} (honest {s_fp4:.4f}); x1e4 from the start: plain "
      f"{final('two-plain-1e4'):.4f}, screened {final('two-mean-1e4'):.4f}")
PY

# MPI == in-process with a robust rule and a bad member (every member aggregates the same bits).
timeout 120 mpirun -np 5 "$loco" train "${base[@]}" --set distributed.replicas=1 --set outer.aggregate=centered-clip \
  --set outer.fault=scale:-10 --set outer.faulty_replicas=1 --set train.out_dir=mpi > mpi.out 2>&1 || { cat mpi.out; exit 1; }
cmp centered-clip-scale-10/checkpoints/step_00000040/model.safetensors mpi/checkpoints/step_00000040/model.safetensors

# Errors name the key.
expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1; shift
  if "$loco" train "${base[@]}" "$@" > out.txt 2> err.txt; then echo "FAIL: accepted: $*"; exit 1; fi
  grep -q "$pattern" err.txt || { echo "FAIL: $*: expected '$pattern', got: $(cat err.txt)"; exit 1; }
  [ ! -s out.txt ] || { echo "FAIL: $*: refused after printing: $(head -3 out.txt)"; exit 1; }
}
expect_error 'with outer.reduce = "reduce-scatter" is not possible' --set algorithm=streaming --set outer.aggregate=median \
  --set outer.codec=fp4-e3m0 --set outer.reduce=reduce-scatter
expect_error 'outer.fault needs algorithm' --set algorithm=noloco --set outer.fault=nan
expect_error 'outer.aggregate = "median" needs algorithm' --set algorithm=noloco --set outer.aggregate=median
expect_error "outer.faulty_replicas (6) exceeds distributed.replicas (5)" --set outer.fault=nan --set outer.faulty_replicas=6
expect_error 'outer.fault = "bogus": use' --set outer.fault=bogus
expect_error 'outer.fault = "nan@x": @S needs a step' --set outer.fault=nan@x
expect_error "outer.aggregate" --set outer.aggregate=mode
expect_error "outer.trim" --set outer.trim=0.5
expect_error "with partial.slices > 1 is not supported" --set outer.aggregate=median --set partial.slices=5
echo "robust: OK"
