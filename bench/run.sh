#!/usr/bin/env bash
# Training-step benchmark: loco fp32 (OpenBLAS and oneDNN) and bf16 against PyTorch (Debian
# python3-torch) fp32 and bf16 autocast on the same model, threads, batch and sequence, and loco's achieved rate
# (6 x params x tokens per second) against the matmul peaks measured in the same run (OpenBLAS
# SGEMM, oneDNN fp32, oneDNN bf16). bf16 columns need AVX512-BF16 or AMX-BF16 ("-" otherwise).
# Usage: bench/run.sh [THREADS] [ITERS]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
loco_install build test
scripts/build.sh > /dev/null
threads=${1:-2} iters=${2:-5}
get() { awk -v k="$1" '$1 == k { print $2 }'; }
first=1
printf '%-28s %8s %8s %8s %8s %8s %9s %9s %9s %9s %7s %7s\n' config loco32 loco32d loco16 torch32 torch16 \
  "l32/t32" "l32d/l32" "l16/t16" "l16/l32" GF/s16 "%bf16pk"
# The last config is the quality-parity study's model (configs/parity.toml) at its 64-window batch.
for cfg in "256 6 4 688 4096 256 8" "512 8 8 1376 4096 256 8" "256 6 4 688 4096 1024 2" "96 4 3 256 1024 128 64"; do
  read -r d L h f V S B <<< "$cfg"
  l32=$(build/bench/loco_step_bench $d $L $h $f $V $S $B "$threads" "$iters" fp32)
  l32d=$(build/bench/loco_step_bench $d $L $h $f $V $S $B "$threads" "$iters" fp32-onednn)
  l16=$(build/bench/loco_step_bench $d $L $h $f $V $S $B "$threads" "$iters" bf16 2> /dev/null || true)
  t32=$(/usr/bin/python3 bench/torch_step.py $d $L $h $f $V $S $B "$threads" "$iters" fp32 | get torch_step_seconds)
  t16=-
  [ -n "$l16" ] && t16=$(/usr/bin/python3 bench/torch_step.py $d $L $h $f $V $S $B "$threads" "$iters" bf16 |
    get torch_step_seconds)
  ls32=$(get loco_step_seconds <<< "$l32")
  ls32d=$(get loco_step_seconds <<< "$l32d")
  ls16=$(get loco_step_seconds <<< "$l16")
  gf16=$(get gflops_6nt <<< "$l16")
  pk16=$(get onednn_bf16_peak_gflops <<< "$l16")
  awk -v c="d=$d L=$L S=$S B=$B" -v a="$ls32" -v ad="$ls32d" -v b="${ls16:--}" -v t="$t32" -v u="$t16" \
    -v g="${gf16:--}" -v p="${pk16:--}" 'function r(x, y) { return (x == "-" || y == "-") ? "-" : sprintf("%.2fx", x / y) }
    function s(x) { return x == "-" ? "-" : sprintf("%.3f", x) }
    BEGIN { printf "%-28s %8s %8s %8s %8s %8s %9s %9s %9s %9s %7s %7s\n", c, s(a), s(ad), s(b), s(t), s(u), r(t, a),
            r(a, ad), r(u, b), r(a, b), (g == "-" ? "-" : sprintf("%.0f", g)), (p == "-" ? "-" : sprintf("%.0f%%", 100 * g / p)) }'
  if [ $first = 1 ]; then peaks32=$l32 peaks16=$l16; first=0; fi
done
echo "(seconds per step, best of $iters, forward + backward + clipping + AdamW, $threads threads; loco32 = fp32"
echo " products through OpenBLAS, loco32d through oneDNN; l32/t32 = PyTorch fp32 time / loco fp32 time, l32d/l32 ="
echo " oneDNN's fp32 speedup over OpenBLAS, l16/t16 = PyTorch bf16 autocast / loco bf16, l16/l32 = loco's bf16 speedup;"
echo " GF/s16 = loco bf16's 6 x params x tokens per second, %bf16pk = that over the oneDNN bf16 peak below)"
echo "peaks, GFLOP/s on 2048^3 (measured with the first config): OpenBLAS SGEMM $(get sgemm_peak_gflops <<< "$peaks32")," \
  "oneDNN fp32 $(get onednn_fp32_peak_gflops <<< "$peaks32"), oneDNN bf16 $(get onednn_bf16_peak_gflops <<< "$peaks16")"
echo "cpu: $(grep '^cpu ' <<< "$l32" | cut -d' ' -f2-)"
