#!/usr/bin/env bash
# run.sh PYTHON_DIR torch|partial|outer|interrupt|mpi|example|elastic|gpu_bench [LOCO WORK]: the Python layer's tests against the
# package built in PYTHON_DIR (build/python). mpi runs test_mpi.py under mpirun -np 2 with a free
# port for torch.distributed; example checks examples/torch_train.py: at most 10 lines added for
# loco, the loop without them runs, and under mpirun -np 2 it writes a run directory `loco report`
# renders; elastic runs test_elastic.py in WORK against a Redis server of its own; gpu_bench runs
# bench/torch_gpu.py small on CPU tensors (the GPU path) and checks its rows, and bench/loop_ops.py, in WORK.
set -euo pipefail
pkg=$1 which=$2 loco=${3:-} work=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH="$pkg:$here:$here/../../examples"
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
example=$here/../../examples/torch_train.py
case $which in
  torch) exec timeout 600 "$py" "$here/test_torch.py" ;;
  partial) exec timeout 600 "$py" "$here/test_partial.py" ;;
  outer) exec timeout 600 "$py" "$here/test_outer.py" ;;
  interrupt) exec timeout 600 "$py" "$here/test_interrupt.py" ;;
  mpi)
    port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    exec timeout 300 mpirun -np 2 -x PYTHONPATH -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
      "$py" "$here/test_mpi.py" ;;
  example)
    rm -rf "$work" && mkdir -p "$work" && cd "$work"
    "$py" "$here/../tools/make_tokens.py" train.tok 256 60000 3
    "$py" "$here/../tools/make_tokens.py" val.tok 256 8000 4
    added=$(grep -c '# loco$' "$example")
    echo "lines added for loco: $added"
    [ "$added" -le 10 ] || { echo "FAIL: the example adds $added lines for loco (at most 10)"; exit 1; }
    grep -v '# loco$' "$example" > plain.py
    timeout 300 "$py" plain.py --data . --steps 3 --seq 32 | tee plain.out
    grep -q "validation loss" plain.out
    for method in diloco streaming ddp noloco; do
      timeout 300 mpirun -np 2 -x PYTHONPATH "$py" "$example" --data . --method $method --steps 40 --seq 32 \
        --inner-steps 10 --out run-$method | tee $method.out
      grep -q "validation loss" $method.out
      [ -s run-$method/summary.json ] && [ "$(grep -c . run-$method/metrics.jsonl)" -ge 4 ]
    done
    "$loco" report run-diloco run-streaming run-ddp run-noloco --out report.html
    grep -q "run-streaming" report.html
    "$loco" compare run-diloco run-streaming run-ddp run-noloco | tee compare.txt
    for method in diloco streaming ddp noloco; do grep -q "^run-$method  *$method  *2 " compare.txt; done
    "$py" - run-diloco/summary.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
w = s["workers"]
print(f"summary: {s['algorithm']}, {len(w)} workers, bytes sent {[x['bytes_sent'] for x in w]}, "
      f"CU {[round(x['compute_utilization'], 3) for x in w]}, final val {s['final_val_loss']:.4f}")
ok = s["algorithm"] == "diloco" and len(w) == 2 and all(x["bytes_sent"] > 0 for x in w) and s["final_val_loss"] > 0
sys.exit(0 if ok else 1)
PY
    echo "python.example: OK" ;;
  elastic) LOCO="$loco" exec timeout 500 "$py" "$here/test_elastic.py" "$work" ;;
  gpu_bench)  # bench/torch_gpu.py, which a session lent a GPU runs (scripts/gpu-session.sh), on CPU tensors
    rm -rf "$work" && mkdir -p "$work"
    export LOCO_TORCH_AS_DEVICE=1
    small=(--layers 2 --hidden 64 --mlp 172 --vocab 512 --steps 4 --warmup 2 --inner-steps 4)
    timeout 300 "$py" "$here/../../bench/torch_gpu.py" "${small[@]}" --members 1 \
      --methods plain,ddp,diloco,diloco-host,streaming,streaming-host,streaming-host-tau2-t1 --out "$work/one.json"
    timeout 300 "$py" "$here/../../bench/torch_gpu.py" "${small[@]}" --members 2 --turns \
      --methods plain,ddp,diloco,partial2 --out "$work/two.json"
    timeout 120 "$py" "$here/../../bench/loop_ops.py" | tee "$work/loop_ops.txt"
    grep -q "^steps with work: [1-9]" "$work/loop_ops.txt"
    exec "$py" - "$work/one.json" "$work/two.json" <<'PY'
import json, sys
one, two = (json.load(open(f))["rows"] for f in sys.argv[1:])
bad = [f"{r['method']} x{r['members']}" for r in one + two if r.get("failed")]
want_one = ["plain", "ddp", "diloco", "diloco-host", "streaming", "streaming-host", "streaming-host-tau2-t1"]
want_two = ["plain", "diloco", "partial2"]  # data-parallel skipped with --turns
got = ([r["method"] for r in one], [r["method"] for r in two])
methods = [r for r in one + two if r["method"] != "plain"]
phases = all("hooks" in r["loop_seconds_per_step"] and "background_seconds_per_step" in r for r in methods)
streaming = [r for r in one if r["method"].startswith("streaming")]
steps = all(len(r["step_s"]) == 4 for r in one + two)
# A row's name sets its tau and loco's threads (-tauN, -tN); the others keep tau 1 and the default threads.
named = [(r["method"], r.get("tau"), r["loco_threads"]) for r in streaming]
default = one[0]["loco_threads"]
print(f"rows {got}, failed {bad}, phases reported {phases}, streaming syncs in the background "
      f"{[r['syncs_in_background'] for r in streaming]}, 4 timed steps each {steps}, (row, tau, threads) {named}")
ok = (not bad and got == (want_one, want_two) and phases and steps
      and named == [("streaming", 1, default), ("streaming-host", 1, default), ("streaming-host-tau2-t1", 2, 1)]
      and all(r["syncs_in_background"] > 0 and r["background_seconds_per_step"].get("busy", 0) > 0 for r in streaming))
sys.exit(0 if ok else 1)
PY
    ;;
  *) echo "unknown test $which"; exit 2 ;;
esac
