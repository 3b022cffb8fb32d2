#!/usr/bin/env bash
# Small-scale reproduction of Streaming DiLoCo on the Brown corpus (docs/results/streaming.md).
# configs/small.toml, in-process replicas, 160 steps, 2,048 tokens per step in all (16 x 128:
# batch 16/M per replica), H = 20, strided fragments of 3 blocks, alpha 0.5:
#  1. compute utilization at 100 Mbit/s, 30 ms (short runs: DDP 20 steps, the others 40);
#  2. at 1 Gbit/s, 30 ms, M = 4: DDP, DiLoCo and Streaming (fp32 tau 1, fp4 E3M0 tau 0/1/2/5),
#     DiLoCo and Streaming both at the Streaming DiLoCo paper's outer lr 0.4; DiLoCo at the
#     original paper's 0.7 as well;
#  3. fp4 outer gradients as M grows (M = 2, 4, 8): fp32 ring, fp4 all-gather, fp4 reduce-scatter;
#  4. seed spread: DDP, DiLoCo and streaming fp4 (tau 1) with two more seeds;
#  5. DiLoCo's sensitivity to H and the outer optimizer (M = 4).
# Prints `loco compare` tables. Usage: scripts/repro-streaming.sh [OUT_DIR]
# (default runs/repro-streaming; about 65 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/repro-streaming}
scripts/brown-data.sh
rm -rf "$out"
mkdir -p "$out"
# outer.momentum: the papers' 0.9, which these runs reproduce (loco's default is the parity study's 0.4).
common=(--config configs/small.toml --set train.eval_interval=40 --set train.checkpoint_interval=0
        --set network.latency=30ms --set outer.momentum=0.9 --quiet)
stream=(--set algorithm=streaming --set outer.inner_steps=20 --set streaming.fragment_blocks=3
        --set streaming.pattern=strided --set streaming.alpha=0.5 --set outer.lr=0.4)
replicas() { echo --set distributed.replicas="$1" --set data.batch_size=$(( 16 / $1 )); }
run() {
  local name=$1; shift
  build/loco train "${common[@]}" "$@" --set train.out_dir="$out/$name" > "$out/$name.log"
  echo "$name: $(grep -m1 'final val loss' "$out/$name.log" || echo 'no final val loss')"
}

slow=(--set network.bandwidth=100Mbit --set train.eval_interval=0 $(replicas 4))
run ddp-100mbit "${slow[@]}" --set train.steps=20 --set algorithm=ddp
run diloco-100mbit "${slow[@]}" --set train.steps=40 --set algorithm=diloco --set outer.inner_steps=20 --set outer.lr=0.4
run streaming-fp4-100mbit "${slow[@]}" --set train.steps=40 "${stream[@]}" --set streaming.tau=1 --set outer.codec=fp4-e3m0

fast=(--set network.bandwidth=1Gbit --set train.steps=160)
m4=(${fast[@]} $(replicas 4))
run ddp "${m4[@]}" --set algorithm=ddp
run diloco "${m4[@]}" --set algorithm=diloco --set outer.inner_steps=20 --set outer.lr=0.4
run diloco-lr0.7 "${m4[@]}" --set algorithm=diloco --set outer.inner_steps=20 --set outer.lr=0.7
run streaming-fp32-tau1 "${m4[@]}" "${stream[@]}" --set streaming.tau=1 --set outer.codec=fp32
for tau in 0 1 2 5; do
  run streaming-fp4-tau$tau "${m4[@]}" "${stream[@]}" --set streaming.tau=$tau --set outer.codec=fp4-e3m0
done

# M scaling (tau 1). At M = 4, fp32 and fp4 reduce-scatter are the runs above (outer.reduce = auto
# picks reduce-scatter above 2 replicas).
for M in 2 8; do
  run m$M-fp32 ${fast[@]} $(replicas $M) "${stream[@]}" --set streaming.tau=1 --set outer.codec=fp32
  run m$M-fp4-rs ${fast[@]} $(replicas $M) "${stream[@]}" --set streaming.tau=1 --set outer.codec=fp4-e3m0 \
    --set outer.reduce=reduce-scatter
done
for M in 2 4 8; do
  run m$M-fp4-ag ${fast[@]} $(replicas $M) "${stream[@]}" --set streaming.tau=1 --set outer.codec=fp4-e3m0 \
    --set outer.reduce=all-gather
done

# Seed spread: two more seeds (initialization and data order) of DDP, DiLoCo and streaming fp4.
for seed in 1 2; do
  seeds=(--set train.seed=$seed --set data.seed=$((1234 + seed)))
  run ddp-seed$seed "${m4[@]}" "${seeds[@]}" --set algorithm=ddp
  run diloco-seed$seed "${m4[@]}" "${seeds[@]}" --set algorithm=diloco --set outer.inner_steps=20 --set outer.lr=0.4
  run streaming-fp4-tau1-seed$seed "${m4[@]}" "${seeds[@]}" "${stream[@]}" --set streaming.tau=1 \
    --set outer.codec=fp4-e3m0
done

dl=(--set algorithm=diloco)
run diloco-h5-lr0.7 "${m4[@]}" "${dl[@]}" --set outer.inner_steps=5 --set outer.lr=0.7
run diloco-h10-lr0.7 "${m4[@]}" "${dl[@]}" --set outer.inner_steps=10 --set outer.lr=0.7
run diloco-lr0.7-mom0.5 "${m4[@]}" "${dl[@]}" --set outer.inner_steps=20 --set outer.lr=0.7 --set outer.momentum=0.5
run diloco-averaging "${m4[@]}" "${dl[@]}" --set outer.inner_steps=20 --set outer.lr=1 --set outer.momentum=0

echo
echo "100 Mbit/s, 30 ms (short runs, compute utilization):"
build/loco compare "$out"/{ddp,diloco,streaming-fp4}-100mbit
echo
echo "1 Gbit/s, 30 ms, 160 steps, M = 4:"
build/loco compare "$out"/{ddp,diloco,diloco-lr0.7,streaming-fp32-tau1} "$out"/streaming-fp4-tau{0,1,2,5}
echo
echo "M scaling (tau 1, equal tokens):"
build/loco compare "$out"/m2-{fp32,fp4-ag,fp4-rs} "$out"/{streaming-fp32-tau1,m4-fp4-ag,streaming-fp4-tau1} \
  "$out"/m8-{fp32,fp4-ag,fp4-rs}
echo
echo "Seeds 0 (above), 1, 2:"
build/loco compare "$out"/{ddp,ddp-seed1,ddp-seed2,diloco,diloco-seed1,diloco-seed2} \
  "$out"/streaming-fp4-tau1{,-seed1,-seed2}
echo
echo "DiLoCo sensitivity (M = 4):"
build/loco compare "$out"/diloco-h{5,10}-lr0.7 "$out"/{diloco-lr0.7,diloco-lr0.7-mom0.5,diloco-averaging,diloco}
for r in ddp-100mbit diloco-100mbit streaming-fp4-100mbit ddp diloco streaming-fp4-tau1; do
  echo "calibrated prediction:"
  build/loco simulate cu --calibrate "$out/$r" | tail -n +2
done
build/loco plot "$out"/{ddp,diloco,streaming-fp32-tau1,streaming-fp4-tau1} --out "$out/loss.png"
