#!/usr/bin/env bash
# In-process runs that exercise every thread loco starts (workers, communication threads of
# every channel, the compute pool), for ThreadSanitizer (scripts/sanitize.sh) and as a plain
# test: a pipelined grid with DDP; Streaming DiLoCo with syncs in flight (tau 1) and fp4; a
# pipelined DiLoCo grid over a link; NoLoCo with random routes; runs in which one worker fails
# while syncs (or NoLoCo's slow weights) are in flight,
# which must end with that one error and no crash.
set -euo pipefail
source "$(dirname "$0")/distributed_env.sh" "$@"
base=(--config "$root/configs/tiny.toml" --set data.train=train.tok --set data.val=val.tok --quiet
      --set model.num_layers=4 --set train.steps=8 --set train.eval_interval=4)
"$loco" train "${base[@]}" --set distributed.replicas=2 --set pipeline.stages=2 --set pipeline.microbatches=2 \
  --set model.tie_embeddings=true --set train.out_dir=grid --trace grid/trace.json
"$loco" train "${base[@]}" --set distributed.replicas=3 --set algorithm=streaming --set outer.inner_steps=10 \
  --set streaming.fragment_blocks=1 --set streaming.tau=1 --set outer.codec=fp4-e3m0 --set network.latency=2ms \
  --set train.out_dir=streaming
"$loco" train "${base[@]}" --set distributed.replicas=2 --set pipeline.stages=2 --set algorithm=diloco \
  --set outer.inner_steps=3 --set network.bandwidth=50Mbit --set train.out_dir=diloco
# NoLoCo on a 2 x 4 grid with random routes, slow weights in flight between outer steps.
"$loco" train "${base[@]}" --set distributed.replicas=4 --set pipeline.stages=2 --set pipeline.microbatches=2 \
  --set algorithm=noloco --set noloco.inner_steps=3 --set network.latency=2ms --set train.out_dir=noloco
# A worker fails with communication in flight: every worker stops, the error is the injected
# one, nothing crashes. Streaming: worker 1 at the start of step 6, when fragment syncs started at
# step 5 are in flight (tau 1), and worker 0 at step 3. NoLoCo: worker 3 at step 7, while the slow
# weights sent after the outer step at 4 are in flight.
streaming=(--set distributed.replicas=3 --set algorithm=streaming --set outer.inner_steps=10
           --set streaming.fragment_blocks=1 --set streaming.tau=1)
noloco=(--set distributed.replicas=4 --set algorithm=noloco --set noloco.inner_steps=4)
fails() {  # fails TARGET ARGS...
  local target=$1 rc
  shift
  set +e
  LOCO_INJECT_FAILURE=$target "$loco" train "${base[@]}" "$@" --set network.latency=20ms \
    --set train.out_dir=fail-${target/:/-} > fail.out 2> fail.err
  rc=$?
  set -e
  # One error line (beside the start-of-run warnings of tests/algo/test_regime.cpp's rules).
  [ $rc -eq 1 ] && [ "$(grep -vc '^loco: warning: ' fail.err)" -eq 1 ] &&
    grep -q "injected failure (LOCO_INJECT_FAILURE=$target)" fail.err ||
    { echo "FAIL: $target: exit $rc"; cat fail.err; exit 1; }
}
fails 1:6 "${streaming[@]}"
fails 0:3 "${streaming[@]}"
fails 3:7 "${noloco[@]}"
echo "threads: OK ($(cat fail.err))"
