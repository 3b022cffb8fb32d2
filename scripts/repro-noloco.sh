#!/usr/bin/env bash
# Small-scale NoLoCo study on the Brown corpus (docs/results/noloco.md). configs/small.toml, 16
# sequences of 128 tokens per step in all, 320 steps (655,360 tokens), in-process workers:
#  1. loss, spread and traffic, at equal tokens, for DP 8 x PP 1 and DP 4 x PP 2 (8 workers):
#     DDP; DiLoCo (Nesterov 0.9, lr 0.7, H 50); DiLoCo as the NoLoCo paper ran it (heavy-ball
#     momentum 0.3, lr 0.7, H 100); NoLoCo (H 50, beta 0.7, alpha 0.5, gamma = beta), with random
#     and (DP 4 x PP 2) fixed routing;
#  2. waiting with stragglers: DP 8, 100 Mbit/s / 30 ms link, 60 steps with H = 10, DiLoCo
#     (heavy ball 0.3) and NoLoCo with network.compute_jitter 0 and 0.5, and the barrier cost
#     `loco simulate latency --compute-jitter` predicts for the same setting.
# Usage: scripts/repro-noloco.sh [OUT_DIR]   (default runs/repro-noloco; about 40 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/repro-noloco}
scripts/brown-data.sh
rm -rf "$out"
mkdir -p "$out"
common=(--config configs/small.toml --set train.checkpoint_interval=0 --quiet)
run() {
  local name=$1; shift
  build/loco train "${common[@]}" "$@" --set train.out_dir="$out/$name" > "$out/$name.log"
  echo "$name: $(grep -m1 'final val loss' "$out/$name.log" || echo 'no final val loss')"
}
ddp=(--set algorithm=ddp)
diloco=(--set algorithm=diloco --set outer.inner_steps=50 --set outer.lr=0.7 --set outer.momentum=0.9)
diloco_paper=(--set algorithm=diloco --set outer.inner_steps=100 --set outer.lr=0.7 --set outer.momentum=0.3
              --set outer.nesterov=false)
noloco=(--set algorithm=noloco --set noloco.inner_steps=50)

long=(--set train.steps=320 --set train.eval_interval=40)
dp8=(--set distributed.replicas=8 --set data.batch_size=2)
pp2=(--set distributed.replicas=4 --set pipeline.stages=2 --set data.batch_size=4 --set pipeline.microbatches=2)
run dp8-ddp "${long[@]}" "${dp8[@]}" "${ddp[@]}"
run dp8-diloco "${long[@]}" "${dp8[@]}" "${diloco[@]}"
run dp8-diloco-paper "${long[@]}" "${dp8[@]}" "${diloco_paper[@]}"
run dp8-noloco "${long[@]}" "${dp8[@]}" "${noloco[@]}"
run pp2-ddp "${long[@]}" "${pp2[@]}" "${ddp[@]}"
run pp2-diloco "${long[@]}" "${pp2[@]}" "${diloco[@]}"
run pp2-diloco-paper "${long[@]}" "${pp2[@]}" "${diloco_paper[@]}"
run pp2-noloco-random "${long[@]}" "${pp2[@]}" "${noloco[@]}" --set noloco.routing=random
run pp2-noloco-fixed "${long[@]}" "${pp2[@]}" "${noloco[@]}" --set noloco.routing=fixed

slow=(--set train.steps=60 --set train.eval_interval=0 --set network.bandwidth=100Mbit --set network.latency=30ms
      "${dp8[@]}")
for jitter in 0 0.5; do
  run wait-diloco-j$jitter "${slow[@]}" "${diloco_paper[@]}" --set outer.inner_steps=10 \
    --set network.compute_jitter=$jitter
  run wait-noloco-j$jitter "${slow[@]}" "${noloco[@]}" --set noloco.inner_steps=10 --set network.compute_jitter=$jitter
done

echo
echo "DP 8 x PP 1, 320 steps:"
build/loco compare "$out"/dp8-{ddp,diloco,diloco-paper,noloco}
echo
echo "DP 4 x PP 2, 320 steps:"
build/loco compare "$out"/pp2-{ddp,diloco,diloco-paper,noloco-random,noloco-fixed}
echo
echo "Replica spread (NoLoCo) at each evaluation:"
for r in dp8-noloco pp2-noloco-random pp2-noloco-fixed; do
  printf '%-20s' "$r"
  /usr/bin/python3 -c "import json,sys; print(' '.join(f\"{d['step']}:{d['replica_spread']:.4g}\" for d in map(json.loads, open(sys.argv[1])) if 'replica_spread' in d))" "$out/$r/metrics.jsonl"
done
echo
echo "Waiting, DP 8 over 100 Mbit/s / 30 ms, 60 steps, H = 10 (mean over workers):"
for r in wait-diloco-j0 wait-noloco-j0 wait-diloco-j0.5 wait-noloco-j0.5; do
  /usr/bin/python3 - "$out/$r/summary.json" "$r" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
w = d["workers"]
n = len(w)
mean = lambda k: sum(x[k] for x in w) / n
print(f"{sys.argv[2]:18s} wall {d['seconds']:7.2f} s  compute {mean('compute_s'):6.2f} s  jitter {mean('jitter_s'):6.2f} s"
      f"  waiting on peers {mean('comm_wait_s'):6.2f} s  CU {100 * mean('compute_utilization'):5.1f}%")
PY
done
build/loco simulate latency --workers 2,8 --sigma 1 --inner-steps 10 --compute-jitter 0.5 --trials 20000 |
  sed -n '/global barrier/,$p'
build/loco plot "$out"/dp8-{ddp,diloco,diloco-paper,noloco} --out "$out/dp8-loss.png"
build/loco plot "$out"/pp2-{ddp,diloco,diloco-paper,noloco-random,noloco-fixed} --out "$out/pp2-loss.png"
