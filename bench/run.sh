#!/usr/bin/env bash
# Training-step benchmark: loco vs PyTorch (Debian python3-torch) on the same model, threads,
# batch and sequence, plus loco's achieved GFLOP/s (6 x params x tokens) against the SGEMM
# peak measured in the same run. Usage: bench/run.sh [THREADS] [ITERS]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
loco_install build test
scripts/build.sh > /dev/null
threads=${1:-2} iters=${2:-5}
printf '%-34s %10s %10s %8s %10s %8s %8s\n' config loco_s torch_s speedup GFLOP/s peak %peak
for cfg in "256 6 8 688 4096 256 8" "512 8 8 1376 4096 256 8"; do
  read -r d L h f V S B <<< "$cfg"
  loco_out=$(build/bench/loco_step_bench $d $L $h $f $V $S $B "$threads" "$iters")
  torch_out=$(/usr/bin/python3 bench/torch_step.py $d $L $h $f $V $S $B "$threads" "$iters")
  get() { awk -v k="$1" '$1 == k { print $2 }'; }
  ls=$(get loco_step_seconds <<< "$loco_out")
  ts=$(get torch_step_seconds <<< "$torch_out")
  gf=$(get gflops_6nt <<< "$loco_out")
  pk=$(get sgemm_peak_gflops <<< "$loco_out")
  awk -v c="d=$d L=$L h=$h f=$f V=$V S=$S B=$B" -v ls="$ls" -v ts="$ts" -v gf="$gf" -v pk="$pk" \
    'BEGIN { printf "%-34s %10.3f %10.3f %7.2fx %10.1f %8.1f %7.0f%%\n", c, ls, ts, ts / ls, gf, pk, 100 * gf / pk }'
done
echo "(best of $iters steps each, forward + backward + clipping + AdamW, $threads threads)"
