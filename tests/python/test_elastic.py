"""loco.torch in elastic runs (loco.init("redis://...")), against a Redis server of its own:
  - two workers started from different initializations equal the plain-torch DiLoCo reference
    (both take the first member's parameters at the start; each reads its data share);
  - of three workers one is killed (SIGKILL): the others finish; a fourth that joins later
    receives the run's state and its inner optimizer's state (AdamW's step count equals the
    others'), and ends with the same parameters;
  - Streaming DiLoCo and NoLoCo run elastically (two workers end equal);
  - partial updates: two workers equal the masked reference; a joiner trains its slice with the
    optimizer state of that slice's trainer;
  - bad calls fail with clear errors.
Run by ctest as python.elastic: test_elastic.py WORK_DIR (PYTHONPATH with the package)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import torch

import loco
import loco.torch
from llama_torch import make_model, make_opt, max_diff, params_of, reference_diloco, reference_partial

work = os.path.abspath(sys.argv[1])
here = os.path.dirname(os.path.abspath(__file__))
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.chdir(work)
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


sys.path.insert(0, os.path.join(here, "..", "tools"))
from redis_server import start_redis  # noqa: E402

redis, port, password = start_redis()
procs = []
cli = ["redis-cli", "-p", str(port), "--no-auth-warning", "-a", password]
env = dict(os.environ, LOCO_REDIS_PASSWORD=password, LOCO_RUN_SECRET="secret-" + os.urandom(12).hex())


def cleanup():
    for p in procs:
        if p.poll() is None:
            p.kill()
    redis.kill()


def start(run, name, seed, steps, *extra, method="diloco", device=False):
    """device: the worker's model takes the path of a model on a GPU (LOCO_TORCH_AS_DEVICE=1)."""
    os.makedirs(run, exist_ok=True)
    args = [sys.executable, f"{here}/elastic_worker.py", f"redis://127.0.0.1:{port}/{run}", name, str(seed), run,
            method, str(steps), *extra]
    p = subprocess.Popen(args, env=dict(env, LOCO_TORCH_AS_DEVICE="1" if device else "0"),
                         stdout=open(f"{run}/{name}.log", "w"), stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def wait(p, run, name, expect=0, limit=240):
    try:
        rc = p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        rc = "still running"
    if rc != expect:
        cleanup()
        sys.exit(f"FAIL: {run}/{name} exited {rc} (expected {expect}):\n" + open(f"{run}/{name}.log").read())


def release_joiner(run, d, gate, others):
    """Once worker d of `run` waits to be taken in (the run's set of joiners holds it) or already
    was, opens the gate the others (a, b) wait at, then waits for a, b and d to finish."""
    deadline = time.time() + 120
    while True:
        out = subprocess.run(cli + ["SCARD", f"loco:{run}:joiners"], capture_output=True, text=True).stdout.strip()
        if out.isdigit() and int(out) >= 1 or "started at step" in open(f"{run}/d.log").read():
            break
        if time.time() > deadline or d.poll() is not None:
            cleanup()
            sys.exit("FAIL: d did not wait to join within 120 s:\n" + open(f"{run}/d.log").read())
        time.sleep(0.1)
    open(gate, "w").close()
    for p, n in zip(tuple(others) + (d,), ("a", "b", "d")):
        wait(p, run, n)


def result(run, name):
    return torch.load(f"{run}/{name}.pt")


try:
    # 1. A fixed membership of two equals the plain-torch reference from the first member's model
    # (b's model on the path of a GPU model: its parameters cross to the host only for rounds).
    a = start("fixed", "a", 11, 12)
    b = start("fixed", "b", 22, 12, device=True)
    wait(a, "fixed", "a")
    wait(b, "fixed", "b")
    ra, rb = result("fixed", "a"), result("fixed", "b")
    first = ra if ra["share"][0] == 0 else rb
    check(sorted([ra["share"], rb["share"]]) == [(0, 2), (1, 2)], f"fixed: data shares {ra['share']}, {rb['share']}")
    seed = 11 if first is ra else 22
    ref, ref_outer = reference_diloco(2, 12, 4, 0.7, 0.9, seed=seed)
    slot_a = ra["share"][0]
    worst = max(max_diff(ra["params"], ref[slot_a]), max_diff(rb["params"], ref[1 - slot_a]))
    check(worst <= 1e-6, f"fixed: both workers within 1e-6 of plain-torch DiLoCo from the first member's "
                         f"initialization (max diff {worst:.2e})")
    worst = max(max_diff(ra["eval"], ref_outer), max_diff(rb["eval"], ref_outer))
    check(worst <= 1e-6, f"fixed: eval parameters are the reference's outer parameters (max diff {worst:.2e})")
    copied = [t for t, n in rb["crossed"] if n]
    check(copied == [4, 8, 12], f"fixed: b's model (device path) crossed to the host only at the rounds' steps "
                                f"({copied})")
    summ = json.load(open("fixed/a/summary.json"))
    rounds = summ["workers"][0]["elastic"]["rounds"]
    check(len(rounds) == 3 and all(len(r["contributors"]) == 2 for r in rounds) and summ["replicas"] == 2,
          f"fixed: summary.json records 3 rounds of 2 contributors ({len(rounds)} rounds) and 2 replicas "
          f"({summ['replicas']})")

    # 2. Three start, c dies after 6 steps; d joins at a round by step 16 (a and b wait before
    # step 15 until d waits to be taken in); a, b and d finish with equal parameters, d with the run's AdamW state.
    # d's model takes the path of a GPU model: the run's state it receives reaches its tensors.
    gate = os.path.abspath("churn/d-registered")
    a = start("churn", "a", 1, 32, "--min-workers", "3", "--gate", f"{gate}:14")
    b = start("churn", "b", 2, 32, "--min-workers", "3", "--gate", f"{gate}:14")
    c = start("churn", "c", 3, 32, "--min-workers", "3", "--die-after", "6")
    wait(c, "churn", "c", expect=-9)
    d = start("churn", "d", 4, 32, "--min-workers", "3", device=True)
    release_joiner("churn", d, gate, (a, b))
    ra, rb, rd = result("churn", "a"), result("churn", "b"), result("churn", "d")
    check("device path True" in open("churn/d.log").read() and "device path False" in open("churn/a.log").read(),
          "churn: d's model took the path of a GPU model, a's the CPU one")
    copied = [t for t, n in rd["crossed"] if n]
    check(copied and all(t % 4 == 0 for t in copied), f"churn: d's model crossed to the host only at rounds ({copied})")
    check(rd["started"] in (8, 12, 16) and rd["steps"] == 32,
          f"churn: d joined at a round's step ({rd['started']}) and ended at {rd['steps']}")
    worst = max(max_diff(ra["eval"], rb["eval"]), max_diff(ra["eval"], rd["eval"]))
    check(worst == 0, f"churn: a, b and d end with the same outer parameters (max diff {worst:.2e})")
    worst = max(max_diff(ra["params"], rd["params"]), max_diff(rb["params"], rd["params"]))
    check(worst == 0, f"churn: and the same parameters after the last round (max diff {worst:.2e})")
    steps_of = lambda r: sorted({int(s["step"]) for s in r["opt"]["state"].values()})
    check(steps_of(ra) == [32] and steps_of(rd) == [32],
          f"churn: d's AdamW counted the run's 32 steps (received at its join: {steps_of(rd)}, a {steps_of(ra)})")
    summ = json.load(open("churn/a/summary.json"))
    ev = summ["workers"][0]["elastic"]["events"]
    kinds = sorted({e["event"] for e in ev})
    check("left" in kinds or "dropped" in kinds, f"churn: a's summary logs the killed member leaving ({kinds})")
    check(any(e["event"] == "joined" and e.get("round", 0) > 0 for e in ev), "churn: and d joining")
    rc = subprocess.run([os.environ.get("LOCO", "loco"), "report", "churn/a", "--out", "churn/report.html"],
                        capture_output=True, text=True) if os.environ.get("LOCO") else None
    if rc is not None:
        check(rc.returncode == 0, f"churn: loco report renders a's run directory ({rc.stderr.strip()[:200]})")

    # 3. Streaming DiLoCo and NoLoCo run elastically too: two workers, equal outer parameters at
    # the end (NoLoCo: one group of two averages its slow weights at every outer step).
    for method in ("streaming", "noloco"):
        a = start(method, "a", 5, 12, method=method)
        b = start(method, "b", 6, 12, method=method)
        wait(a, method, "a")
        wait(b, method, "b")
        ra, rb = result(method, "a"), result(method, "b")
        worst = max_diff(ra["eval"], rb["eval"])
        moved = max_diff(ra["eval"], params_of(make_model(5)))
        rounds = json.load(open(f"{method}/a/summary.json"))["workers"][0]["elastic"]["rounds"]
        check(worst <= 1e-6 and moved > 0 and len(rounds) >= 3,
              f"{method}: both workers end with the same outer parameters (max diff {worst:.2e}), "
              f"{len(rounds)} rounds")

    # 3a. Partial updates (2 slices): two workers from one initialization equal the masked
    # plain-torch reference (the member in data slot k trains slice k, as replica k); then three
    # start (slices 0, 1, 0), the third dies, and a fourth joins: it trains slice 1 with the
    # optimizer state of b, which trains slice 1, relayed by a (the checksums of both sides agree),
    # and a, b and d end with the same outer parameters.
    a = start("partial", "a", 0, 12, "--partial", "2")
    b = start("partial", "b", 0, 12, "--partial", "2", device=True)
    wait(a, "partial", "a")
    wait(b, "partial", "b")
    ra, rb = result("partial", "a"), result("partial", "b")
    ref, ref_outer = reference_partial(2, 12, 4, 0.7, 0.9, 2)
    worst = max(max_diff(ra["params"], ref[ra["share"][0]]), max_diff(rb["params"], ref[rb["share"][0]]),
                max_diff(ra["eval"], ref_outer), max_diff(rb["eval"], ref_outer))
    check(worst <= 1e-6, f"partial: two elastic workers within 1e-6 of the masked plain-torch reference, parameters "
                         f"and outer parameters (max diff {worst:.2e})")
    gate = os.path.abspath("partial-churn/d-registered")

    def registered(member):  # started one after the other: a is member 1 (slice 0), b 2 (slice 1), c 3 (slice 0)
        deadline = time.time() + 60
        while subprocess.run(cli + ["EXISTS", f"loco:partial-churn:member:{member}"], capture_output=True,
                             text=True).stdout.strip() != "1":
            if time.time() > deadline:
                cleanup()
                sys.exit(f"FAIL: member {member} of partial-churn did not register within 60 s")
            time.sleep(0.05)
    a = start("partial-churn", "a", 1, 32, "--min-workers", "3", "--gate", f"{gate}:14", "--partial", "2")
    registered(1)
    b = start("partial-churn", "b", 1, 32, "--min-workers", "3", "--gate", f"{gate}:14", "--partial", "2")
    registered(2)
    c = start("partial-churn", "c", 1, 32, "--min-workers", "3", "--die-after", "6", "--partial", "2")
    wait(c, "partial-churn", "c", expect=-9)
    d = start("partial-churn", "d", 4, 32, "--min-workers", "3", "--partial", "2", device=True)
    release_joiner("partial-churn", d, gate, (a, b))
    ra, rd = result("partial-churn", "a"), result("partial-churn", "d")
    worst = max(max_diff(ra["eval"], result("partial-churn", "b")["eval"]), max_diff(ra["eval"], rd["eval"]))
    check(worst == 0, f"partial churn: a, b and d end with the same outer parameters (max diff {worst:.2e})")
    el = {n: json.load(open(f"partial-churn/{n}/summary.json"))["workers"][0]["elastic"] for n in "abd"}
    joined = el["d"]["rounds"][0]
    handed = {r["slice"]: r["slice_state_crc32c"] for n in "ab" for r in el[n]["rounds"]
              if r.get("round") == joined.get("round") and "slice_state_crc32c" in r}
    check(joined.get("slice") == 1 and joined.get("optimizer") == "received" and
          handed.get(1) == joined.get("optimizer_crc32c") and handed.get(0) != joined.get("optimizer_crc32c"),
          f"partial churn: d (member {el['d']['member_ids'][0]}) trains slice 1 with slice 1's optimizer state "
          f"(received {joined.get('optimizer_crc32c')}, handed over by slice {handed})")
    steps_of = lambda r: sorted({int(s["step"]) for s in r["opt"]["state"].values()})
    check(steps_of(rd) == [32], f"partial churn: d's AdamW counted the run's 32 steps ({steps_of(rd)})")

    # 3b. A worker whose model has other heads (every shape the same) or whose inner optimizer is
    # another is refused when it registers, the difference named (the run's configuration entry
    # outlives its members).
    for flag, what in (("--sgd", "inner optimizer"), ("--heads=2", "model architecture")):
        name = flag.strip("-").split("=")[0]
        p = start("fixed", name, 7, 12, flag)
        wait(p, "fixed", name, expect=1, limit=60)
        log = open(f"fixed/{name}.log").read()
        check(f"{what}: this worker" in log and "differs from the run's" in log,
              f"a joiner with {flag} is refused: {log.strip().splitlines()[-1][:200]}")

    # 4. The inner optimizer's state as a joiner receives it: round trip, and hostile bytes refused.
    m = make_model(0)
    o = make_opt(m)
    m.loss(*__import__("llama_torch").batch(0, 0)).backward()
    o.step()
    packed = loco.torch.pack_state(o.state_dict())
    back = loco.torch.unpack_state(packed)
    o2 = make_opt(make_model(1))
    o2.load_state_dict(back)
    same = all(torch.equal(o.state_dict()["state"][k][n], o2.state_dict()["state"][k][n])
               for k in o.state_dict()["state"] for n in o.state_dict()["state"][k])
    check(same and back["param_groups"] == o.state_dict()["param_groups"],
          "pack_state/unpack_state: AdamW's state round-trips exactly")
    import pickle, struct
    head_n = struct.unpack("<Q", packed[:8])[0]
    tree = json.loads(packed[8:8 + head_n])

    def with_tree(t, raw=packed[8 + head_n:]):
        h = json.dumps(t).encode()
        return struct.pack("<Q", len(h)) + h + raw

    first = tree["d"][0][1]["d"][0][1]["d"]  # state[0]'s entries
    grown = json.loads(json.dumps(tree))
    grown["d"][0][1]["d"][0][1]["d"][1][1]["T"][1] += 4  # exp_avg one float longer than its shape
    beyond = json.loads(json.dumps(tree))
    beyond["d"][0][1]["d"][0][1]["d"][1][1]["T"][0] = len(packed)  # outside the bytes
    bad_dtype = json.loads(json.dumps(tree))
    bad_dtype["d"][0][1]["d"][0][1]["d"][1][1]["T"][2] = "torch.complex64"
    cases = {"truncated": packed[:5], "header size": struct.pack("<Q", 1 << 40) + packed[8:],
             "a tensor's size": with_tree(grown), "a tensor outside the bytes": with_tree(beyond),
             "an unknown dtype": with_tree(bad_dtype), "an object": with_tree({"o": "os.system"}),
             "a pickle": pickle.dumps(o.state_dict()), "not JSON": struct.pack("<Q", 3) + b"{x}",
             "JSON nested 100,000 deep": struct.pack("<Q", 100000) + b"[" * 100000,
             "a list as a dict's key": with_tree({"d": [[{"l": []}, {"v": 1}]]}),
             "an empty tensor of 10^30 rows": with_tree({"T": [0, 0, "torch.float32", [10 ** 30, 0]]}),
             "a boolean offset": with_tree({"T": [True, 4, "torch.float32", [1]]}),
             "a float as an entry's length": with_tree({"T": [0, 4.0, "torch.float32", [1]]})}
    for what, data in cases.items():
        try:
            loco.torch.unpack_state(data)
            msg = "accepted"
        except loco.Error as e:
            msg = str(e)
        except Exception as e:  # anything but loco.Error is a defect: the bytes come from a peer
            msg = f"{type(e).__name__}: {e}"
        check("corrupt" in msg, f"unpack_state refuses {what}: {msg}")
    check(len(first) >= 3, "(the state's entries were found where the cases above change them)")
    # A member whose AdamW state went non-finite must not hand it to a joiner (which would train
    # on NaN from its first step); a state for another optimizer is refused clearly.
    for poison in (float("nan"), float("inf")):
        sd = o.state_dict()
        sd["state"][0]["exp_avg_sq"] = sd["state"][0]["exp_avg_sq"].clone()
        sd["state"][0]["exp_avg_sq"].view(-1)[3] = poison
        try:
            loco.torch._InnerState(make_opt(make_model(1))).load_inner(loco.torch.pack_state(sd))
            msg = "accepted"
        except loco.Error as e:
            msg = str(e)
        check("non-finite" in msg and "exp_avg_sq" in msg, f"a joiner refuses an optimizer state holding {poison}: {msg}")
    sgd = torch.optim.SGD(make_model(1).parameters(), lr=0.1, momentum=0.9)
    try:
        loco.torch._InnerState(sgd).load_inner(packed)
        msg = "accepted"
    except loco.Error as e:
        msg = str(e)
    check("does not fit" in msg, f"an SGD member refuses AdamW's state clearly: {msg}")

    # 4a. Ctrl-C while a worker waits in wrap() for the run to start (min_workers 2, alone): the
    # start's polling ends with the KeyboardInterrupt at once, not at elastic.start_timeout (300 s).
    a = start("interrupt", "a", 1, 8)
    deadline = time.time() + 60
    while subprocess.run(cli + ["EXISTS", "loco:interrupt:member:1"], capture_output=True,
                         text=True).stdout.strip() != "1" and time.time() < deadline and a.poll() is None:
        time.sleep(0.05)
    time.sleep(0.5)  # in the start's wait
    sent = time.monotonic()
    a.send_signal(signal.SIGINT)
    try:
        rc = a.wait(timeout=150)
    except subprocess.TimeoutExpired:
        rc = "still running"
    took = time.monotonic() - sent
    log = open("interrupt/a.log").read()
    check(rc != 0 and rc != "still running" and "KeyboardInterrupt" in log,
          f"SIGINT to a worker waiting for the run to start: it ends with KeyboardInterrupt (exit {rc}) "
          f"{took:.1f} s later (elastic.start_timeout 300 s)")

    # 5. Bad calls.
    def error_of(f):
        try:
            f()
        except Exception as e:  # loco.Error or a config error
            return str(e)
        return "no error"

    msg = error_of(lambda: loco.init(f"redis://127.0.0.1:{port}/x"))
    check("worker=NAME" in msg, f"init(redis://) without a worker name: {msg}")
    ep = loco._loco.elastic_world(f"redis://127.0.0.1:{port}/bad", "w")
    m = make_model(0)
    msg = error_of(lambda: loco.torch.wrap(m, make_opt(m), "diloco", endpoint=ep))
    check("train_steps" in msg, f"an elastic wrap without train_steps: {msg}")
    msg = error_of(lambda: loco.torch.wrap(m, make_opt(m), "ddp", endpoint=ep, train_steps=4))
    check("elastic" in msg and "ddp" in msg, f"data-parallel in an elastic run: {msg}")
    msg = error_of(lambda: loco._loco.elastic_world("http://127.0.0.1/x", "w"))
    check("redis://" in msg, f"a malformed run address: {msg}")
    msg = error_of(lambda: loco._loco.elastic_world(f"redis://127.0.0.1:{port}/x", "../w"))
    check("--worker" in msg or "letters" in msg, f"a worker name that is not a plain name: {msg}")
finally:
    cleanup()

print("python.elastic: " + ("FAILED: " + "; ".join(failures) if failures else "OK"))
sys.exit(1 if failures else 0)
