#!/usr/bin/python3
"""Partial parameter updates in elastic runs (`loco train --join`, partial.slices = 2), with the
Redis server of elastic_env.py:
  - a fixed membership of 4 workers == the in-process DiLoCo run with 4 replicas, bitwise (member
    k of the start trains slice k mod 2, as replica k), each round's record naming the slices;
    the same for Streaming DiLoCo (fp32) with 2 workers;
  - 3 workers start (slices 0, 1, 0) and two join mid-run: the fourth trains slice 1 and installs
    the optimizer state of the member that trains slice 1 (the second contributor, relayed by the
    first: the checksums recorded on both sides agree, and differ from slice 0's), the fifth
    slice 0's (the first contributor's own); both take part in every later round;
  - one worker alone (slice 0) and a second that joins it (slice 1, which nobody trained): it
    keeps its own (fresh) optimizer state, and both finish with a finite model;
  - a worker killed and resumed from its checkpoint (--resume) trains the slice it trained, not
    the one of its new member id.
Usage: elastic_partial.py LOCO WORK_DIR"""
import math, os, signal, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_env import (BASE, ENV, cleanup, elastic, fail, loco, model_bytes, port, procs,  # noqa: E402
                         redis_cli, rounds_by_number, start, val_loss, wait_all, wait_step,
                         writer_model)

PARTIAL = ["--set", "partial.slices=2"]

try:
    # 1. Fixed membership == in-process, bitwise: DiLoCo with 4, Streaming DiLoCo (fp32) with 2.
    for label, method, M in (("diloco", [], 4), ("streaming", ["--set", "algorithm=streaming"], 2)):
        common = PARTIAL + method + ["--set", "train.steps=12", "--set", "outer.inner_steps=4"]
        subprocess.run(BASE + common + ["--set", f"distributed.replicas={M}", "--set", f"train.out_dir=inproc-{label}",
                                        "--set", "distributed.backend=inprocess"], check=True, stdout=subprocess.DEVNULL)
        names = [f"w{k}" for k in range(M)]
        out = f"fixed-{label}"
        ps = [start(out, n, out, common + ["--set", f"elastic.min_workers={M}"]) for n in names]
        wait_all(ps, names, out)
        if writer_model(out, names)[0] != model_bytes(f"inproc-{label}/checkpoints/step_00000012/model.safetensors"):
            fail(f"{out}: the elastic model differs from the in-process one")
        rounds = rounds_by_number(out, names)
        if not rounds or any(len(c) != M for c, _ in rounds.values()):
            fail(f"{out}: expected every round with {M} contributors, got {rounds}")
        for n in names:
            e = elastic(out, n)[1]
            slices = {r.get("slice") for r in e["rounds"]}
            if slices != {(e["member_ids"][0] - 1) % 2}:
                fail(f"{out}/{n}: member {e['member_ids'][0]} should train slice (id - 1) mod 2, its rounds say {slices}")
        print(f"partial {label}: fixed membership of {M} == in-process {M} replicas (bitwise model, {len(rounds)} "
              f"rounds of {M})")

    # 2. A joiner gets the optimizer state of its slice, from the member that trains it.
    long = PARTIAL + ["--set", "train.steps=1000", "--set", "outer.inner_steps=5", "--set", "train.log_interval=5",
                      "--set", "train.eval_interval=0", "--set", "elastic.timeout=2s"]
    names = ["w0", "w1", "w2"]
    ps = [start("join", n, "join", long + ["--set", "elastic.min_workers=3"]) for n in names]
    wait_step("join/w0/metrics.jsonl", 30)
    ps.append(start("join", "late", "join", long))  # member 4: slice 1
    deadline = time.time() + 60
    while redis_cli("EXISTS", "loco:join:member:4").strip() != "1":
        if time.time() > deadline:
            fail("join: the first joiner did not register within 60 s")
        time.sleep(0.01)
    ps.append(start("join", "late2", "join", long))  # member 5: slice 0
    wait_all(ps, names + ["late", "late2"], "join")
    rounds = rounds_by_number("join", names + ["late", "late2"])
    for joiner, slice_ in (("late", 1), ("late2", 0)):
        summary, e = elastic("join", joiner)
        first = e["rounds"][0]
        if first.get("joined") is None or first.get("slice") != slice_ or first.get("optimizer") != "received":
            fail(f"join: {joiner} (member {e['member_ids'][0]}) should train slice {slice_} and receive its "
                 f"optimizer state: {first}")
        handed = {}  # slice -> the checksum its first trainer recorded for the joiner's round
        for n in names:
            for r in elastic("join", n)[1]["rounds"]:
                if r.get("round") == first["round"] and "slice_state_crc32c" in r:
                    handed[r["slice"]] = r["slice_state_crc32c"]
        if handed.get(slice_) != first["optimizer_crc32c"] or handed.get(1 - slice_) == first["optimizer_crc32c"]:
            fail(f"join: {joiner} installed optimizer state {first['optimizer_crc32c']}; the slices' trainers "
                 f"handed over {handed}")
        later = [r for r in rounds if r > first["round"]]
        if not later or any(e["member_ids"][0] not in rounds[r][0] for r in later):
            fail(f"join: {joiner} must take part in every round after {first['round']}: {rounds}")
        if not math.isfinite(summary["final_val_loss"]):
            fail(f"join: {joiner}'s final loss is {summary['final_val_loss']}")
        print(f"{joiner} joined at round {first['round']}: it trains slice {slice_} with the optimizer state of "
              f"that slice's trainer (crc {first['optimizer_crc32c']}; handed over in its round: {handed}), in all "
              f"{len(later)} later rounds")

    # 3. Nobody trains the joiner's slice: it keeps its own optimizer state.
    ps = [start("alone", "w0", "alone", long + ["--set", "elastic.min_workers=1"])]
    wait_step("alone/w0/metrics.jsonl", 30)
    ps.append(start("alone", "late", "alone", long))
    wait_all(ps, ["w0", "late"], "alone")
    first = elastic("alone", "late")[1]["rounds"][0]
    if first.get("slice") != 1 or first.get("optimizer") != "kept":
        fail(f"alone: the joiner should train slice 1, which nobody trained, and keep its own state: {first}")
    for n in ("w0", "late"):
        if not math.isfinite(val_loss(f"alone/{n}/summary.json")):
            fail(f"alone/{n}: the final loss is not finite")
    print(f"a joiner whose slice nobody trained (round {first['round']}) kept its own optimizer state; both finished")

    # 4. A worker resumed from its checkpoint trains the slice it trained: the run's only worker
    # (member 1, slice 0) is killed after its checkpoint and resumed with --resume; it registers
    # as member 2, whose own slice would be 1, and restarts the run from the checkpoint on slice 0
    # (its AdamW moments are slice 0's).
    solo = long + ["--set", "elastic.min_workers=1", "--set", "train.checkpoint_interval=20"]
    p = start("resume", "w0", "resume", solo)
    deadline = time.time() + 60
    while not os.path.exists("resume/w0/checkpoints/latest"):
        if time.time() > deadline or p.poll() is not None:
            fail("resume: no checkpoint within 60 s:\n" + open("resume-w0.log").read())
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    p = subprocess.Popen([loco, "train", "--resume", "resume/w0", "--quiet", "--join", f"redis://127.0.0.1:{port}/resume",
                          "--worker", "w0"], env=ENV, stdout=open("resume-w0.log", "a"), stderr=subprocess.STDOUT)
    procs.append(p)
    wait_all([p], ["w0"], "resume")
    e = elastic("resume", "w0")[1]
    slices = {r["slice"] for r in e["rounds"] if "slice" in r}
    restarted = [r for r in e["rounds"] if "restarted" in r]
    if e["member_ids"] != [2] or len(restarted) != 1 or slices != {0}:
        fail(f"resume: member {e['member_ids']} should restart the run once on slice 0: restarts {restarted}, "
             f"slices {slices}")
    if not math.isfinite(val_loss("resume/w0/summary.json")):
        fail("resume: the final loss is not finite")
    print(f"a worker resumed from its checkpoint (member 2) restarted the run at step {restarted[0]['step']} "
          f"on its slice 0, {len(e['rounds'])} rounds")
finally:
    cleanup()
print("elastic partial updates: all passed")
