# Sourced by the distributed CLI tests (after `set -euo pipefail`), with $1 = loco, $2 = work
# directory: sets loco, work, here, root and py, allows mpirun as root and oversubscribed, and
# enters a fresh work directory holding generated train.tok and val.tok.
loco=$1 work=$2
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
root=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$work" && mkdir -p "$work" && cd "$work"
$py "$here/../tools/make_tokens.py" train.tok 256 20000 5
$py "$here/../tools/make_tokens.py" val.tok 256 3000 6

# signal_rank SIG NP STOP_MESSAGE ARGS...: runs `mpirun -np NP loco train ARGS...` into run
# directory dead/ with a 5 s network timeout, sends SIG (STOP or KILL) to MPI rank 1 once the run
# logs, and fails unless the run exits non-zero within 40 s with, for STOP, STOP_MESSAGE in its
# output (for KILL, any mention of the dead rank).
signal_rank() {
  local sig=$1 np=$2 stop_message=$3
  shift 3
  rm -rf dead
  local start rc took victim="" launcher p
  start=$(date +%s)
  set +e
  timeout 60 mpirun -np "$np" "$loco" train "$@" --set train.steps=100000 --set network.timeout=5s \
    --set train.out_dir=dead --set train.checkpoint_interval=0 > dead.out 2>&1 &
  launcher=$!
  for _ in $(seq 1 100); do
    for p in $(pgrep -f "train.out_dir=dead" || true); do
      if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$p; fi
    done
    [ -n "$victim" ] && [ -s dead/metrics.jsonl ] && break
    sleep 0.1
  done
  [ -n "$victim" ] || { echo "FAIL: rank 1 not found"; kill $launcher; exit 1; }
  kill -"$sig" "$victim"
  wait $launcher
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  [ "$sig" = STOP ] && kill -KILL "$victim" 2> /dev/null || true
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $took -gt 40 ]; then
    echo "FAIL: SIG$sig of rank 1: exit $rc after $took s"; cat dead.out; exit 1
  fi
  if [ "$sig" = STOP ]; then
    grep -qF "$stop_message" dead.out || { cat dead.out; exit 1; }
  else
    grep -qiE "rank 1|worker 1|signal 9|killed" dead.out || { cat dead.out; exit 1; }
  fi
  echo "SIG$sig of rank 1: exit $rc after $took s: $(grep -m1 -iE 'loco: error|signal|rank 1' dead.out)"
}
