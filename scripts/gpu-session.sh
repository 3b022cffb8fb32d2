#!/usr/bin/env bash
# Everything a session lent a GPU measures, in one device run (docs/python.md, "On a GPU").
# Here, first: scripts/build.sh && bash ../shared/gpu/make-kit.sh (the extension's kit in .gpukit/),
# and a dry run on CPU tensors: LOCO_GPU_DRY=1 bash scripts/gpu-session.sh.
# On the device (the `device` tool's run, carry [".gpukit"], kind nvidia-h200: 2 members of the
# 0.85B model with their outer state on the GPU need about 2 x 40 GB), at most about 10 minutes
# (build 40 s, tests 2 x 50 s, GradScaler 30 s, from_pretrained 40 s, a sync's parts 60 s, the
# model 250 + 180 s, a profile 75 s; give the run what the device has left: what a step leaves when cut off still
# comes back; a row that runs out of memory is reported as FAILED and the rest go on):
#   bash scripts/gpu-session.sh
# Writes, packed in $OUT/gpu-session.tgz: session.log (this script's output); build.log; amp_scaler_cuda.log (fp16 with GradScaler's skipped steps);
# test_partial_cuda.log (partial updates on CUDA against the plain-torch reference on CUDA,
# deterministic kernels); test_outer_cuda.log (the outer state on
# the GPU against it on the host, bit for bit: codecs, outer step, runs); hf_partial_cuda.log (a
# partial run's model through save_pretrained/from_pretrained); sync_parts.log (a Streaming
# DiLoCo sync's device work, part by part: bench/torch_sync_parts.py); steps.log (what one member's
# Streaming DiLoCo steps spend their time on, a round included); hf1.json/.log and hf2.json/.log
# (the 0.85B Hugging Face Llama, bf16 autocast, H = 30: one member, data-parallel and with the outer
# state on the GPU and on the host, two members with partial updates taking turns for their compute: the targets of
# docs/python.md; each row says where loco's hooks spent their time per step). Each step
# has its own time limit, so that one failing leaves the others' results.
# Everything is written to a work directory and packed into $OUT/gpu-session.tgz after each step
# (the device tool brings back only a few files: run 5's logs were left out).
set -uo pipefail
dest=${OUT:-/tmp/loco-gpu}
out=$(mktemp -d /tmp/loco-gpu-session.XXXX)
mkdir -p "$dest"
pack() { tar czf "$dest/gpu-session.tgz.tmp" -C "$out" . && mv "$dest/gpu-session.tgz.tmp" "$dest/gpu-session.tgz"; }
exec > >(tee "$out/session.log") 2>&1
if [ "${LOCO_GPU_DRY:-0}" = 1 ]; then  # the same steps on CPU tensors, small, to check the script
  export PYTHONPATH=build/python:tests/python:examples LOCO_TORCH_AS_DEVICE=1
  py=/usr/bin/python3
  model=(--layers 2 --hidden 64 --mlp 172 --vocab 512)
  hf1=("${model[@]}" --steps 4 --warmup 1 --inner-steps 4)
  hf2=("${hf1[@]}")
  parts=(--n 100000 --repeat 1)
  dev=cpu
else
  bash .gpukit/build-on-device.sh > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; pack; exit 1; }
  export PYTHONPATH=/tmp/pkg:tests/python:examples CUBLAS_WORKSPACE_CONFIG=:4096:8
  py=python3
  model=(--hf --hidden 2048 --layers 16 --heads 16 --kv-heads 4 --mlp 5632 --vocab 32000 --batch 8 --seq 1024)
  hf1=("${model[@]}" --steps 30 --warmup 60 --inner-steps 30)
  hf2=("${hf1[@]}")
  parts=()
  dev=cuda
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/gpu.txt" 2>&1 || true
for t in partial outer; do
  LOCO_TEST_DEVICE=$dev timeout 50 $py tests/python/test_$t.py > "$out/test_${t}_$dev.log" 2>&1
  echo "test_$t on $dev: exit $? ($(grep -c '^ok' "$out/test_${t}_$dev.log") ok, $(grep -c '^FAIL' "$out/test_${t}_$dev.log") FAIL)"
done
pack
# With a second GPU: the outer state's tests on the model of cuda:1 while cuda:0 stays current (a
# loop that moves its model without torch.cuda.set_device; every stream and event loco uses must
# be the model's device's). The machine lent so far has one GPU: then it says so.
if [ "$dev" = cuda ] && [ "$($py -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  LOCO_TEST_DEVICE=cuda:1 timeout 50 $py tests/python/test_outer.py > "$out/test_outer_cuda1.log" 2>&1
  echo "test_outer on cuda:1 (cuda:0 current): exit $? ($(grep -c '^ok' "$out/test_outer_cuda1.log") ok)"
else
  echo "test_outer on a second GPU: not run ($dev, one device)"
fi
# fp16 with torch's GradScaler (its skipped steps): DiLoCo against plain torch, data-parallel members equal.
LOCO_TEST_DEVICE=$dev timeout 30 $py tests/python/amp_scaler.py > "$out/amp_scaler_$dev.log" 2>&1
echo "amp_scaler on $dev: exit $?"; tail -n 4 "$out/amp_scaler_$dev.log"
# A partial run's model through save_pretrained and from_pretrained (needs transformers).
LOCO_TEST_DEVICE=$dev timeout 40 $py tests/python/hf_partial.py > "$out/hf_partial_$dev.log" 2>&1
echo "hf_partial on $dev: exit $?"; tail -n 6 "$out/hf_partial_$dev.log"
# A Streaming DiLoCo sync's device work part by part (one block's fragment of the 0.85B model).
timeout 60 $py bench/torch_sync_parts.py --device $dev "${parts[@]}" > "$out/sync_parts.log" 2>&1
echo "sync parts: exit $?"; cat "$out/sync_parts.log"
pack
# The 0.85B model, one member then two (rows measured before: docs/results/torch-gpu.md); each
# JSON is rewritten after each row, so a row cut off by the time limit leaves the others.
# streaming-host-tau2: the host's work for the largest fragment (embeddings and head, 131M of the
# 853M parameters) given two steps instead of one. loco's compute threads: half the cores (what
# loco.init() gives a model on a GPU); streaming-host-t$(nproc) with every core, as runs 3 to 5 had.
timeout 250 $py bench/torch_gpu.py "${hf1[@]}" --members 1 \
  --methods plain,ddp,diloco,streaming,diloco-host,streaming-host,streaming-host-t$(nproc),streaming-host-tau2 \
  --out "$out/hf1.json" > "$out/hf1.log" 2>&1
echo "0.85B model, 1 member: exit $?"; tail -n 20 "$out/hf1.log"
pack
# Two members taking turns for their steps' compute (--turns): each one's peak memory and step
# time its own, the round's with both.
timeout 180 $py bench/torch_gpu.py "${hf2[@]}" --members 2 --methods plain,diloco,partial2 --turns \
  --out "$out/hf2.json" > "$out/hf2.log" 2>&1
echo "0.85B model, 2 members: exit $?"; tail -n 16 "$out/hf2.log"
pack
# Where one member's steps spend their time (torch.profiler): Streaming DiLoCo's 17 fragment
# syncs (steps 30 to 46) with their merges, the outer state on the GPU.
timeout 75 $py bench/torch_gpu.py "${model[@]}" --inner-steps 30 --profile-steps streaming --warmup 29 --steps 19 \
  2>&1 | head -70 > "$out/steps.log"
grep "steps profiled" "$out/steps.log"
pack
