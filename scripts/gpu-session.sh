#!/usr/bin/env bash
# Everything a session lent a GPU measures, in one device run (docs/python.md, "On a GPU").
# Here, first: scripts/build.sh && bash ../shared/gpu/make-kit.sh (the extension's kit in .gpukit/),
# and a dry run on CPU tensors: LOCO_GPU_DRY=1 bash scripts/gpu-session.sh.
# On the device (the `device` tool's run, carry [".gpukit"], at most about 9.5 minutes: build 40 s, tests 2 x 60 s, wrap() 2 x 40 s, steps 2 x 60 s, the model 330 s; kind
# nvidia-h200 if it can be had: 2 members of the 0.85B model with their outer state on the GPU
# need about 2 x 40 GB; a row that runs out of memory is reported as FAILED and the rest go on):
#   bash scripts/gpu-session.sh
# Writes under $OUT: build.log; test_partial_cuda.log (partial updates on CUDA against the
# plain-torch reference on CUDA, deterministic kernels); test_outer_cuda.log (the outer state on
# the GPU against it on the host, bit for bit: codecs, outer step, runs); wrap.log (what wrap() of
# the 0.85B model spends its time on); steps.log (what its steps spend it on, a round included); hf.json/.log (the 0.85B Hugging Face Llama, bf16 autocast,
# 1 and 2 members: the targets of docs/python.md). Each step has its own time limit, so that one
# failing leaves the others' results.
set -uo pipefail
out=${OUT:-/tmp/loco-gpu}
mkdir -p "$out"
if [ "${LOCO_GPU_DRY:-0}" = 1 ]; then  # the same steps on CPU tensors, small, to check the script
  export PYTHONPATH=build/python:tests/python:examples LOCO_TORCH_AS_DEVICE=1
  py=/usr/bin/python3
  model=(--layers 2 --hidden 64 --mlp 172 --vocab 512)
  hf=("${model[@]}" --steps 4 --warmup 1 --inner-steps 2 --members 1,2 --methods plain,diloco,streaming,ddp,partial2,diloco-host)
  dev=cpu
else
  bash .gpukit/build-on-device.sh > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  export PYTHONPATH=/tmp/pkg:tests/python:examples CUBLAS_WORKSPACE_CONFIG=:4096:8
  py=python3
  model=(--hf --hidden 2048 --layers 16 --heads 16 --kv-heads 4 --mlp 5632 --vocab 32000 --batch 8 --seq 1024)
  hf=("${model[@]}" --members 1,2 --steps 30 --warmup 3
      --methods plain,diloco,streaming,ddp,partial2,partial2h,diloco-host,streaming-host)
  dev=cuda
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/gpu.txt" 2>&1 || true
for t in partial outer; do
  LOCO_TEST_DEVICE=$dev timeout 60 $py tests/python/test_$t.py > "$out/test_${t}_$dev.log" 2>&1
  echo "test_$t on $dev: exit $? ($(grep -c '^ok' "$out/test_${t}_$dev.log") ok, $(grep -c '^FAIL' "$out/test_${t}_$dev.log") FAIL)"
done
# What wrap() of the 0.85B model spends its time on (one member).
for m in diloco ddp; do
  timeout 40 $py bench/torch_gpu.py "${model[@]}" --profile-wrap $m 2>&1 | head -32
done > "$out/wrap.log"
grep "^wrap()" "$out/wrap.log"
# Where one member's steps spend their time, a round included (torch.profiler).
for m in diloco streaming; do
  timeout 60 $py bench/torch_gpu.py "${model[@]}" --profile-steps $m 2>&1 | head -70
done > "$out/steps.log"
grep "steps profiled" "$out/steps.log"
# The 0.85B model; its JSON is rewritten after each row, so a row cut off by the time limit
# leaves the others.
timeout 330 $py bench/torch_gpu.py "${hf[@]}" --out "$out/hf.json" > "$out/hf.log" 2>&1
echo "0.85B model: exit $?"; tail -n 25 "$out/hf.log"
