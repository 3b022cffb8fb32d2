#!/usr/bin/python3
"""The elastic backend through `loco train --join`, with a Redis server this test starts on a
free loopback port (password-protected, given through LOCO_REDIS_PASSWORD):
  - a fixed membership of 3 workers == the in-process DiLoCo run with 3 replicas, bitwise, and the
    same for Streaming DiLoCo (fp4 outer gradients reduce-scattered with tau 1; fp32 with tau 0);
  - kill -9 one of 4 workers at a seeded random step (two seeds): the other 3 finish, every round after the kill averages
    exactly the survivors (all three agree on each round's contributors and parameters), the
    kill is detected within the timeout, the final loss is close to a 3-replica run's;
  - NoLoCo: 4 workers == the in-process run (replica 0's model bitwise); kill -9 one of 4 then a
    new worker joins: the rounds in between have exactly the survivors, the joiner starts from its
    round's first contributor's slow weights (checksum) and is in every later round;
  - a worker that joins mid-run starts from the outer parameters of its round (checksum) and
    takes part in every later round;
  - every worker killed: the checkpoint writer and a copy of its directory resumed with --resume
    at once: one restarts the run from the checkpoint, the other and new workers join it;
  - Streaming DiLoCo: kill -9 one of 4 workers, then a new worker joins: every fragment's round
    from the kill on has exactly the survivors until the joiner, which starts from the outer
    parameters (checksum) and is in every later round; the final loss is close to a 3-replica run's;
  - SIGSTOP a worker past the timeout, then SIGCONT: it is dropped and rejoins as a new member,
    and no round is corrupted;
  - Redis stopped past the timeout (twice: 4 s and 2.5 s), then continued: the workers ride it
    out; Redis restarted without its data, or flushed while up: they stop with a clear message;
  - entries forged in Redis without the run secret (a roster, outcomes, drops, an exclusion,
    malformed ids, events, keys of another type) are ignored or removed with a warning, and the
    run is the in-process one bitwise;
  - a worker with another num_heads (same parameter count), other training data, another
    outer.lr, a link model where the members have none, or another run secret is refused at start with the difference named, and the run
    goes on without it; so is one with another outer.lr after the run's config entry was deleted
    from Redis (by the members, from the fingerprint in its member record);
  - a member that sends NaN (elastic.fault) or a sign-flipped outer gradient 10x too large: the
    others' screening leaves its contribution out of every round and all finish with a finite
    model; with outer.screen = off a NaN member makes every member stop with an error, and no
    checkpoint holds a non-finite value;
  - a member nobody can reach is excluded after elastic.exclude_after failed attempts and stops
    with an error; the others finish;
  - bad input: a malformed --join address, an unsupported method, a missing --worker, an
    unreachable or password-refusing Redis, a missing or short run secret: one clear error each,
    non-zero exit.
Usage: elastic_test.py LOCO WORK_DIR"""
import json, math, os, random, shutil, signal, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_env import (BASE, ENV, cleanup, elastic, expect_close, fail, inprocess_loss,  # noqa: E402
                         kill_then_join, loco, model_bytes, port, procs, redis, redis_cli,
                         redis_json, root, rounds_by_number, start, val_loss, wait_all,
                         wait_dropped, wait_step, writer_model)
from redis_server import free_port  # noqa: E402 (tests/tools, on the path elastic_env set)

try:
    # 1. Fixed membership == in-process, bitwise.
    common = ["--set", "train.steps=12", "--set", "outer.inner_steps=4"]
    subprocess.run(BASE + common + ["--set", "distributed.replicas=3", "--set", "train.out_dir=inproc3",
                                    "--set", "distributed.backend=inprocess"], check=True, stdout=subprocess.DEVNULL)
    names = ["w0", "w1", "w2"]
    ps = [start("fixed", n, "fixed", common + ["--set", "elastic.min_workers=3"]) for n in names]
    wait_all(ps, names, "fixed")
    ref = model_bytes("inproc3/checkpoints/step_00000012/model.safetensors")
    if writer_model("fixed", names)[0] != ref:
        fail("fixed: the elastic model differs from the in-process one")
    for n in names:
        if abs(val_loss(f"fixed/{n}/summary.json") - val_loss("inproc3/summary.json")) > 1e-5:
            fail(f"fixed/{n}: validation loss differs")
    for n in names:  # time in rounds is waiting, not compute
        summary = json.load(open(f"fixed/{n}/summary.json"))
        w = summary["workers"][0]
        if not (w["comm_wait_s"] > 0 and w["compute_s"] + w["comm_wait_s"] <= summary["seconds"] + 0.01):
            fail(f"fixed/{n}: compute {w['compute_s']} + wait {w['comm_wait_s']} vs wall {summary['seconds']}")
    rounds = rounds_by_number("fixed", names)
    if sorted(rounds) != [1, 2, 3] or any(len(c) != 3 for c, _ in rounds.values()):
        fail(f"fixed: expected rounds 1-3 with 3 contributors each, got {rounds}")
    # The keys of the rounds' attempts expire (6 h); the start's stay for workers starting late.
    def ttl(k):
        return int(redis_cli("TTL", k))
    ttls = {k: ttl(f"loco:fixed:round:{k}") for k in ("2:0:roster", "2:0:arrived", "2:0:done", "2:0:outcome",
                                                       "0:0:roster")}
    if not all(0 < ttls[k] <= 21600 for k in ttls if not k.startswith("0:")) or ttls["0:0:roster"] != -1:
        fail(f"fixed: attempt keys should expire within 6 h, the start's not: {ttls}")
    print("fixed membership of 3 == in-process 3 replicas (bitwise model, 3 rounds of 3); attempt keys expire")

    # 1c. Entries forged in Redis by someone without the run secret, written before the run's
    # members get there: a roster naming one contributor, an outcome aborting a round and another
    # committing one, members dropped and excluded, malformed and foreign ids in the run's sets,
    # events that are not the run's and a malformed roster pointer. Every member ignores them
    # with a warning: the same 3 rounds of 3, never rejoined, and the in-process model bit for bit.
    forged = [["SET", "loco:forged:round:2:0:roster", '{"contributors":[1],"joiners":[]}'],
              ["SET", "loco:forged:round:1:0:outcome", "abort"],
              ["SET", "loco:forged:round:3:0:outcome", "commit\n" + "0" * 64],
              ["SET", "loco:forged:dropped:2", "1"], ["SET", "loco:forged:excluded:3", "forged exclusion"],
              ["SADD", "loco:forged:members", "x", "99", "-1"], ["SADD", "loco:forged:round:1:0:arrived", "42"],
              ["SADD", "loco:forged:round:2:0:done", "1", "2", "3"],
              ["RPUSH", "loco:forged:events", "not json", '{"event":"left","member":1,"why":"forged"}'],
              ["RPUSH", "loco:forged:rosters", "garbage", "1:x"], ["SET", "loco:forged:finished", "1"],
              # keys of another type than loco writes there (a set, a set): removed with a warning
              ["HSET", "loco:forged:joiners", "x", "1"], ["HSET", "loco:forged:round:2:0:arrived", "x", "1"]]
    for c in forged:
        redis_cli(*c)
    ps = [start("forged", n, "forged", common + ["--set", "elastic.min_workers=3"]) for n in names]
    wait_all(ps, names, "forged")
    if writer_model("forged", names)[0] != ref:
        fail("forged: the model differs from the in-process one")
    rounds = rounds_by_number("forged", names)
    if sorted(rounds) != [1, 2, 3] or any(len(c) != 3 for c, _ in rounds.values()):
        fail(f"forged: expected rounds 1-3 with 3 contributors each, got {rounds}")
    logs = "".join(open(f"forged-{n}.log").read() for n in names)
    for n in names:
        _, e = elastic("forged", n)
        if len(e["member_ids"]) != 1 or any(ev.get("why") == "forged" for ev in e["events"]):
            fail(f"forged/{n}: member ids {e['member_ids']}, events {e['events']}")
    if "without this run's MAC" not in logs:
        fail("forged: no member warned about the forged entries:\n" + logs[-3000:])
    if "held a value of another type" not in logs:
        fail("forged: no member warned about the keys of another type:\n" + logs[-3000:])
    print("entries forged in Redis (a roster, outcomes, drops, an exclusion, ids, events): ignored with a warning; "
          "3 rounds of 3 and the in-process model bit for bit")

    # 1a. The link model over the elastic data plane: the same bits, and each round's ring
    # all-reduce (4 sequential transfers among 3) waits at least 4 x 30 ms of latency.
    ps = [start("link", n, "link", common + ["--set", "elastic.min_workers=3", "--set", "network.latency=30ms",
                                           "--set", "network.bandwidth=100Mbit"]) for n in names]
    wait_all(ps, names, "link")
    if writer_model("link", names)[0] != ref:
        fail("link: the model differs under the link model")
    for n in names:
        wait = json.load(open(f"link/{n}/summary.json"))["workers"][0]["comm_wait_s"]
        if wait < 3 * 4 * 0.030:
            fail(f"link/{n}: waited {wait:.3f} s in 3 rounds over a 30 ms link; the link model is not applied")
    print(f"link model over the data plane: same model, {wait:.2f} s waiting in 3 rounds (>= 0.36 s of latency)")

    # 1b. The same for Streaming DiLoCo: 3 fragments (2 blocks, 1 per fragment, and the rest),
    # fp4 outer gradients with tau 1, and fp32 with tau 0. Elastic members screen by default
    # (outer.screen = auto): fp4 is then all-gathered, so the in-process run screens too.
    stream = ["--set", "algorithm=streaming", "--set", "streaming.fragment_blocks=1", "--set", "outer.inner_steps=6"]
    for label, extra in (("fp4-tau1", ["--set", "outer.codec=fp4-e3m0", "--set", "streaming.tau=1"]),
                         ("fp32-tau0", ["--set", "streaming.tau=0"])):
        args = common + stream + extra
        subprocess.run(BASE + args + ["--set", "distributed.replicas=3", "--set", f"train.out_dir=inproc-{label}",
                                      "--set", "distributed.backend=inprocess", "--set", "outer.screen=on"],
                       check=True, stdout=subprocess.DEVNULL)
        ps = [start(label, n, label, args + ["--set", "elastic.min_workers=3"]) for n in names]
        wait_all(ps, names, label)
        ref = model_bytes(f"inproc-{label}/checkpoints/step_00000012/model.safetensors")
        if writer_model(label, names)[0] != ref:
            fail(f"{label}: the elastic streaming model differs from the in-process one")
        rounds = rounds_by_number(label, names)
        # Fragment j (offset 2j) syncs at steps 2j + 6k; the last step (12) ends every round.
        expect = sorted({s * 3 + j for j in range(3) for s in range(2 * j + 6, 13, 6)} | {12 * 3 + j for j in range(3)})
        if sorted(rounds) != expect or any(len(c) != 3 for c, _ in rounds.values()):
            fail(f"{label}: expected the rounds {expect} with 3 contributors each, got {sorted(rounds)}")
        print(f"streaming {label}: fixed membership of 3 == in-process 3 replicas (bitwise model, {len(rounds)} "
              "fragment rounds of 3)")

    # 2. Kill -9 one of 4 workers at a seeded random step, for two seeds.
    long = ["--set", "train.steps=300", "--set", "outer.inner_steps=5", "--set", "train.log_interval=5",
            "--set", "train.eval_interval=0", "--set", "elastic.timeout=2s"]
    subprocess.run(BASE + long + ["--set", "distributed.replicas=3", "--set", "train.out_dir=inproc3long",
                                  "--set", "distributed.backend=inprocess", "--set", "train.eval_interval=300"],
                   check=True, stdout=subprocess.DEVNULL)
    ref_loss = val_loss("inproc3long/summary.json")
    for seed in (1, 2):
        out = f"kill{seed}"
        names = ["w0", "w1", "w2", "w3"]
        victim = random.Random(seed).randrange(4)
        kill_step = random.Random(seed).randrange(20, 200)
        ps = [start(out, n, out, long + ["--set", "elastic.min_workers=4"]) for n in names]
        wait_step(f"{out}/{names[victim]}/metrics.jsonl", kill_step)
        ps[victim].send_signal(signal.SIGKILL)
        killed_at = time.time()
        ps[victim].wait()
        # The genuine sealed "left" event, replayed 200 times by a Redis writer (no secret needed):
        # the survivors must count it once.
        replayed = None
        while replayed is None and time.time() < killed_at + 30:
            replayed = next((e for e in redis_json("LRANGE", f"loco:{out}:events", "0", "-1")
                             if '"event":"left"' in e), None)
            time.sleep(0.1)
        if replayed is None:
            fail(f"{out}: no left event in Redis 30 s after the kill")
        redis_cli("RPUSH", f"loco:{out}:events", *([replayed] * 200))
        survivors = [n for k, n in enumerate(names) if k != victim]
        wait_all([p for k, p in enumerate(ps) if k != victim], survivors, out)
        events = elastic(out, survivors[0])[1]["events"]
        left = [e for e in events if e["event"] == "left"]
        if len(left) != 1 or left[0]["name"] != names[victim]:
            fail(f"{out}: expected one member to leave ({names[victim]}), events: {left}")
        detected = left[0]["time"] - killed_at
        if detected > 2 * 2 + 1:
            fail(f"{out}: the survivors noticed the kill after {detected:.1f} s (timeout 2 s)")
        rounds = rounds_by_number(out, survivors)
        ids = {n: elastic(out, n)[1]["member_ids"] for n in survivors}
        alive = tuple(sorted(i for n in survivors for i in ids[n]))
        after = [r for r in rounds if r >= left[0]["round"]]
        if not after or any(rounds[r][0] != alive for r in after):
            fail(f"{out}: rounds after the kill must average exactly the survivors {alive}: {rounds}")
        before = [r for r in rounds if r < left[0]["round"]]
        if any(len(rounds[r][0]) != 4 for r in before):
            fail(f"{out}: rounds before the kill must have 4 contributors: {rounds}")
        lost = elastic(out, survivors[0])[1]["tokens_lost_run"]
        if lost != left[0]["tokens_lost"]:
            fail(f"{out}: tokens_lost_run {lost}, the one left event's {left[0]['tokens_lost']} (replays counted?)")
        loss = val_loss(f"{out}/{survivors[0]}/summary.json")
        expect_close(out, loss, ref_loss)
        print(f"kill -9 of {names[victim]} (1 of 4) past step {kill_step}, round {left[0]['round']}: detected after "
              f"{detected:.2f} s, {len(after)} later rounds of exactly the 3 survivors, {lost} tokens lost (its event "
              f"replayed 200 times in Redis, counted once), val loss "
              f"{loss:.4f} (3 replicas throughout: {ref_loss:.4f})")

    # 2b. Streaming: kill -9 one of 4 workers, then a fifth worker joins.
    out = "skill"
    sargs = long + stream + ["--set", "outer.codec=fp4-e3m0", "--set", "streaming.tau=1"]
    subprocess.run(BASE + sargs + ["--set", "distributed.replicas=3", "--set", "train.out_dir=inproc3stream",
                                   "--set", "distributed.backend=inprocess", "--set", "train.eval_interval=300"],
                   check=True, stdout=subprocess.DEVNULL)
    ref_stream = val_loss("inproc3stream/summary.json")
    kill_step = random.Random(3).randrange(20, 100)
    survivors = kill_then_join(out, sargs, "w2", kill_step)
    rounds = rounds_by_number(out, survivors + ["late"])
    left = [e for e in elastic(out, "w0")[1]["events"] if e["event"] == "left"]
    late = elastic(out, "late")[1]
    first = late["rounds"][0]
    if len(left) != 1 or "joined" not in first or rounds.get(first["round"], (0, -1))[1] != first["params_crc32c"]:
        fail(f"{out}: one member should leave ({left}) and the joiner start from the outer parameters ({first})")
    alive = tuple(sorted(elastic(out, n)[1]["member_ids"][0] for n in survivors))
    between = [r for r in rounds if left[0]["round"] <= r <= first["round"]]
    later = [r for r in rounds if r > first["round"]]
    if not between or any(rounds[r][0] != alive for r in between):
        fail(f"{out}: the rounds from the kill to the join must have exactly the survivors {alive}: {rounds}")
    if not later or any(rounds[r][0] != tuple(sorted(alive + (late["member_ids"][0],))) for r in later):
        fail(f"{out}: the joiner must be in every later round: {rounds}")
    loss = val_loss(f"{out}/w0/summary.json")
    if not math.isfinite(loss) or abs(loss - ref_stream) > 0.1 * ref_stream:
        fail(f"{out}: final val loss {loss} not close to the 3-replica run's {ref_stream}")
    print(f"streaming fp4: kill -9 of w2 past step {kill_step}: {len(between)} fragment rounds of exactly the 3 "
          f"survivors, then a joiner from the outer parameters (crc {first['params_crc32c']}) in all {len(later)} "
          f"later rounds; val loss {loss:.4f} (3 replicas throughout: {ref_stream:.4f})")

    # 2c. NoLoCo: a fixed membership of 4 (two groups of 2) == in-process; kill -9 then a joiner.
    nl = ["--set", "algorithm=noloco", "--set", "noloco.inner_steps=4"]
    subprocess.run(BASE + common + nl + ["--set", "distributed.replicas=4", "--set", "train.out_dir=inproc-noloco",
                                         "--set", "distributed.backend=inprocess"], check=True, stdout=subprocess.DEVNULL)
    names = ["w0", "w1", "w2", "w3"]
    ps = [start("noloco", n, "noloco", common + nl + ["--set", "elastic.min_workers=4"]) for n in names]
    wait_all(ps, names, "noloco")
    # Replica r of the in-process run is the member in slot r (ids ascending; workers register in
    # any order); the in-process run saves replica 0's slow weights.
    model, first_slot = writer_model("noloco", names)
    if model != model_bytes("inproc-noloco/checkpoints/step_00000012/model.safetensors"):
        fail(f"noloco/{first_slot}: the elastic model differs from the in-process replica 0's")

    def noloco_rounds(out, names):
        """round -> contributors (all workers agree) and round -> {member: crc of its slow weights}."""
        contributors, crcs = {}, {}
        for n in names:
            e = elastic(out, n)[1]
            for r in e["rounds"]:
                if "contributors" not in r:
                    continue
                c = tuple(r["contributors"])
                if contributors.setdefault(r["round"], c) != c:
                    fail(f"{out}: workers disagree on round {r['round']}")
                crcs.setdefault(r["round"], {})[e["member_ids"][-1]] = r["params_crc32c"]
        return contributors, crcs
    rounds, _ = noloco_rounds("noloco", names)
    if sorted(rounds) != [1, 2, 3] or any(len(c) != 4 for c in rounds.values()):
        fail(f"noloco: expected rounds 1-3 with 4 contributors, got {rounds}")
    out = "nkill"
    nargs = long + nl + ["--set", "noloco.inner_steps=5"]
    survivors = kill_then_join(out, nargs, "w1", random.Random(4).randrange(20, 100))
    rounds, crcs = noloco_rounds(out, survivors + ["late"])
    left = [e for e in elastic(out, "w0")[1]["events"] if e["event"] == "left"]
    late = elastic(out, "late")[1]
    first = late["rounds"][0]
    alive = tuple(sorted(elastic(out, n)[1]["member_ids"][0] for n in survivors))
    giver = min(rounds.get(first["round"], (0,)))
    if len(left) != 1 or "joined" not in first or crcs.get(first["round"], {}).get(giver) != first["params_crc32c"]:
        fail(f"{out}: one member should leave ({left}) and the joiner start from the first contributor's weights")
    between = [r for r in rounds if left[0]["round"] <= r <= first["round"]]
    later = [r for r in rounds if r > first["round"]]
    if not between or any(rounds[r] != alive for r in between):
        fail(f"{out}: the rounds from the kill to the join must have exactly the survivors {alive}: {rounds}")
    if not later or any(rounds[r] != tuple(sorted(alive + (late["member_ids"][0],))) for r in later):
        fail(f"{out}: the joiner must be in every later round: {rounds}")
    losses = [val_loss(f"{out}/{n}/summary.json") for n in survivors + ["late"]]
    if not all(math.isfinite(x) for x in losses):
        fail(f"{out}: final val losses {losses}")
    print(f"noloco: 4 workers == in-process (replica 0's model bitwise); kill -9 of w1: {len(between)} rounds of "
          f"exactly the 3 survivors, then a joiner from its round's first contributor's weights, in all "
          f"{len(later)} later rounds; final val losses {', '.join(f'{x:.4f}' for x in losses)}")

    # 3. A worker joins mid-run.
    names = ["w0", "w1"]
    join_args = long + ["--set", "train.steps=1000"]
    ps = [start("join", n, "join", join_args + ["--set", "elastic.min_workers=2"]) for n in names]
    wait_step("join/w0/metrics.jsonl", 40)
    ps.append(start("join", "late", "join", join_args))
    # Then w1 is killed and resumed with --resume (no checkpoint of its own: it rejoins from a peer).
    wait_step("join/late/metrics.jsonl", 1)
    ps[1].send_signal(signal.SIGKILL)
    ps[1].wait()
    wait_dropped("join/w0/metrics.jsonl")
    ps[1] = subprocess.Popen([loco, "train", "--resume", "join/w1", "--quiet", "--join", f"redis://127.0.0.1:{port}/join",
                              "--worker", "w1"], env=ENV, stdout=open("join-w1.log", "a"), stderr=subprocess.STDOUT)
    procs.append(ps[1])
    wait_all(ps, names + ["late"], "join")
    resumed = elastic("join", "w1")[1]["rounds"][0]
    if resumed.get("joined") != "resumed":
        fail(f"join: w1 resumed with --resume should have rejoined: {resumed}")
    late = elastic("join", "late")[1]
    first = late["rounds"][0]
    rounds = rounds_by_number("join", names + ["late"])
    if "joined" not in first or first["round"] not in rounds or rounds[first["round"]][1] != first["params_crc32c"]:
        fail(f"join: the joiner's parameters at round {first.get('round')} differ from the outer parameters")
    later = [r for r in rounds if r > first["round"]]
    if not later or any(late["member_ids"][0] not in rounds[r][0] for r in later):
        fail(f"join: the joiner must take part in every round after {first['round']}: {rounds}")
    print(f"join at round {first['round']} (step {first['step']}): parameters equal the outer parameters "
          f"(crc {first['params_crc32c']}), in all {len(later)} later rounds; a killed worker resumed with "
          f"--resume rejoined at round {resumed['round']}")

    # 3b. Every worker dies (kill -9 of all 3 once the writer has a checkpoint): the writer's
    # directory resumed with --resume restarts the run from its checkpoint once the dead members'
    # heartbeats have expired, and two new workers started as usual are taken in at its next round.
    names = ["w0", "w1", "w2"]
    rargs = long + ["--set", "train.steps=60", "--set", "train.checkpoint_interval=20"]
    ps = [start("dead", n, "dead", rargs + ["--set", "elastic.min_workers=3"]) for n in names]
    deadline = time.time() + 60
    while not any(os.path.exists(f"dead/{n}/checkpoints/latest") for n in names):
        if time.time() > deadline:
            fail("dead: no checkpoint at step 20 within 60 s")
        time.sleep(0.01)
    for p in ps:
        p.send_signal(signal.SIGKILL)
    for p in ps:
        p.wait()
    writer = [n for n in names if os.path.exists(f"dead/{n}/checkpoints/latest")]
    if len(writer) != 1:
        fail(f"dead: expected one checkpoint writer, found {writer}")
    ck_step = int(open(f"dead/{writer[0]}/checkpoints/latest").read().strip().split("_")[1])
    # The new workers first: once both wait to be taken in, the writer is resumed (so that they
    # are in its first round however slowly they start).
    fresh = [start("dead", n, "dead", rargs) for n in ("w3", "w4")]
    deadline = time.time() + 60
    while int(redis_cli("SCARD", "loco:dead:joiners")) < 2:
        if time.time() > deadline:
            fail("dead: the 2 new workers did not wait to be taken in within 60 s")
        time.sleep(0.05)
    # Two holders of the checkpoint (the writer's directory and a copy of it) resume at once: one
    # restarts the run, the other is taken in as a joiner.
    twin = writer[0] + "b"
    shutil.copytree(f"dead/{writer[0]}", f"dead/{twin}")
    holders = [writer[0], twin]
    resumed = [subprocess.Popen([loco, "train", "--resume", f"dead/{n}", "--quiet", "--join",
                                 f"redis://127.0.0.1:{port}/dead", "--worker", n], env=ENV,
                                stdout=open(f"dead-{n}.log", "a"), stderr=subprocess.STDOUT) for n in holders]
    procs.extend(resumed)
    wait_all(resumed + fresh, holders + ["w3", "w4"], "dead")
    restarts = {n: [x for x in elastic("dead", n)[1]["rounds"] if "restarted" in x] for n in holders}
    leader = [n for n in holders if restarts[n]]
    r = elastic("dead", leader[0] if leader else writer[0])[1]
    if len(leader) != 1 or len(restarts[leader[0]]) != 1 or restarts[leader[0]][0]["step"] != ck_step:
        fail(f"dead: expected one of {holders} to restart the run at step {ck_step}: {restarts}")
    if sum(e["event"] == "restarted" for e in r["events"]) != 1:
        fail(f"dead/{leader[0]}: expected one 'restarted' event: {r['events']}")
    for n in ["w3", "w4"] + [h for h in holders if h != leader[0]]:
        first = elastic("dead", n)[1]["rounds"][0]
        if "joined" not in first or first["step"] <= ck_step:
            fail(f"dead/{n}: expected to join the restarted run after step {ck_step}: {first}")
    rounds = rounds_by_number("dead", holders + ["w3", "w4"])
    last = max(rounds)
    if len(rounds[last][0]) != 4:
        fail(f"dead: the last round should have the 4 members: {rounds[last]}")
    ref60 = inprocess_loss(rargs, "inproc-dead")
    loss = val_loss(f"dead/{leader[0]}/summary.json")
    expect_close("dead", loss, ref60)
    print(f"all 3 workers killed after the checkpoint at step {ck_step}: two holders of the checkpoint resumed at "
          f"once, {leader[0]} restarted the run from it, the other and 2 new workers joined at step {first['step']}, "
          f"{len(rounds)} rounds after, all agreeing; val loss {loss:.4f} (3 replicas throughout: {ref60:.4f})")

    # 4. SIGSTOP past the timeout, then SIGCONT: dropped, rejoins as a new member.
    names = ["w0", "w1", "w2"]
    stop_args = long + ["--set", "elastic.min_workers=3", "--set", "train.steps=1000"]
    ps = [start("stop", n, "stop", stop_args) for n in names]
    wait_step("stop/w1/metrics.jsonl", 40)
    ps[1].send_signal(signal.SIGSTOP)
    stopped_at = time.time()
    # Continued as soon as the others have dropped it (so that the run is still going).
    while "left" not in open("stop/w0/metrics.jsonl").read():
        if time.time() - stopped_at > 30:
            fail("stop: the others did not drop the stopped worker within 30 s")
        time.sleep(0.02)
    stopped_for = time.time() - stopped_at
    ps[1].send_signal(signal.SIGCONT)
    wait_all(ps, names, "stop")
    w1 = elastic("stop", "w1")[1]
    rejoined = [r for r in w1["rounds"] if "joined" in r and r["joined"].startswith("dropped")]
    if len(w1["member_ids"]) < 2 or not rejoined:
        fail(f"stop: w1 should have been dropped and rejoined as a new member: {w1['member_ids']}, {w1['rounds'][:3]}")
    rounds = rounds_by_number("stop", names)  # fails if any two workers disagree on a round
    print(f"SIGSTOP for {stopped_for:.1f} s (timeout 2 s): dropped, rejoined as member {w1['member_ids'][-1]} at round "
          f"{rejoined[0]['round']}; {len(rounds)} rounds, all workers agree on each")

    # 5. The coordinator stops answering for longer than the timeout (Redis stopped, then
    # continued): the workers ride it out, nobody is dropped, every round agrees.
    names = ["w0", "w1", "w2"]
    ps = [start("outage", n, "outage", long + ["--set", "elastic.min_workers=3", "--set", "train.steps=600",
                                             "--set", "elastic.coordinator_timeout=30s"]) for n in names]
    # Two outages: 4 s (the workers' Redis commands time out, they reconnect and wait) and 2.5 s
    # (their commands stall until Redis answers); both outlast the heartbeats' TTL.
    for step, seconds in ((40, 4), (300, 2.5)):
        wait_step("outage/w0/metrics.jsonl", step)
        redis.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        redis.send_signal(signal.SIGCONT)
    wait_all(ps, names, "outage")
    for n in names:
        e = elastic("outage", n)[1]
        if len(e["member_ids"]) != 1 or any(ev["event"] == "left" for ev in e["events"]):
            fail(f"outage/{n}: a member was dropped over a coordinator outage: {e['member_ids']}, {e['events']}")
    rounds = rounds_by_number("outage", names)
    if len(rounds) != 120 or any(len(c) != 3 for c, _ in rounds.values()):
        fail("outage: expected 120 rounds of 3 contributors")
    print("Redis stopped for 4 s, then for 2.5 s (timeout 2 s): all 3 workers rode it out, 120 rounds of 3")

    # 6. Redis restarted without its data: the workers stop with a clear message.
    ps = [start("lost", n, "lost", long + ["--set", "elastic.min_workers=2", "--set", "train.steps=3000",
                                         "--set", "elastic.coordinator_timeout=20s"]) for n in ["w0", "w1"]]
    wait_step("lost/w0/metrics.jsonl", 40)
    redis.kill()
    redis.wait()
    time.sleep(1)
    redis = subprocess.Popen(["redis-server", "redis.conf"], stdout=open("redis2.log", "w"), stderr=subprocess.STDOUT)
    procs.append(redis)  # the restarted server: cleanup() stops it with the workers
    def expect_state_lost(ps, tag):  # both workers stop within 60 s, saying the coordinator lost the run
        for p, n in zip(ps, ["w0", "w1"]):
            try:
                rc = p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                fail(f"{tag}/{n} did not stop after Redis lost the run")
            log = open(f"{tag}-{n}.log").read()
            if rc == 0 or "lost this run's state" not in log:
                fail(f"{tag}/{n}: expected a clear stop, exit {rc}:\n{log[-2000:]}")

    expect_state_lost(ps, "lost")
    print("Redis restarted without its data: both workers stopped with a clear message")

    # 6a. Redis loses the run while up (FLUSHALL): the workers notice at their next heartbeat and
    # stop at the next round with the same message, instead of beating on (ids would be reused).
    ps = [start("flushed", n, "flushed", long + ["--set", "elastic.min_workers=2", "--set", "train.steps=3000"])
          for n in ["w0", "w1"]]
    wait_step("flushed/w0/metrics.jsonl", 40)
    redis_cli("FLUSHALL")
    expect_state_lost(ps, "flushed")
    print("Redis flushed while up (FLUSHALL): both workers stopped with a clear message")

    # 6b. Members must agree: a worker with another config (same parameter count), other data
    # or another run secret is refused at start, the differing keys named; the run goes on.
    # The members' run is long (3000 steps: about 30 s alone on a 2-core machine) so that they are
    # still in it when the last joiner below comes, however slowly the refused ones start on a
    # loaded machine (60 steps ended within a second, before the joiner, which then found the run
    # over and left with exit 0).
    args = ["--set", "train.steps=3000", "--set", "outer.inner_steps=5", "--set", "elastic.min_workers=2",
            "--set", "elastic.timeout=30s"]
    ps = [start("agree", n, "agree", args) for n in ("w0", "w1")]
    wait_step("agree/w0/metrics.jsonl", 5)
    subprocess.run([sys.executable, f"{root}/tests/tools/make_tokens.py", "other.tok", "256", "20000", "9"], check=True)
    for label, extra, env, expect in (
            ("heads", ["--set", "model.num_heads=4"], ENV, "model.num_heads: this worker 4, the run 2"),
            ("data", ["--set", "data.train=other.tok"], ENV, "data.train tokens: this worker 20000 tokens"),
            ("lr", ["--set", "outer.lr=0.5"], ENV, "outer.lr: this worker 0.5, the run 0.6"),
            ("link", ["--set", "network.latency=1ms", "--set", "network.bandwidth=1Gbit"], ENV,
             "network link model: this worker on (network.bandwidth or network.latency set), the run off"),
            ("secret", [], dict(ENV, LOCO_RUN_SECRET="another secret of the same size"), "another run secret")):
        r = subprocess.run(BASE + args + extra + ["--set", "train.out_dir=agree", "--set", "elastic.address=127.0.0.1",
                                                  "--join", f"redis://127.0.0.1:{port}/agree", "--worker",
                                                  "bad-" + label], env=env, capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or expect not in r.stderr:
            fail(f"agree/bad-{label}: expected a refusal naming {expect!r}: exit {r.returncode}, {r.stderr[-1500:]}")
    # The run's config entry removed (by anyone who can write to Redis) while the members are
    # stopped (SIGSTOP, well within their elastic.timeout of 30 s, so that none of them writes the
    # entry again first): a joiner with another outer.lr registers (its own entry takes the place)
    # and waits; once the members go on, their closer refuses it by the fingerprint in its member
    # record, and writes the entry again.
    if any(p.poll() is not None for p in ps):
        fail("agree: the members' run ended before the joiner of the deleted config entry came (the test needs "
             "them in it; a longer run)")
    for p in ps:
        p.send_signal(signal.SIGSTOP)
    redis_cli("DEL", "loco:agree:config")
    bad = subprocess.Popen(BASE + args + ["--set", "outer.lr=0.5", "--set", "train.out_dir=agree", "--set",
                                          "elastic.address=127.0.0.1", "--join", f"redis://127.0.0.1:{port}/agree",
                                          "--worker", "bad-deleted"], env=ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    procs.append(bad)
    deadline = time.time() + 20
    while int(redis_cli("SCARD", "loco:agree:joiners")) < 1 and time.time() < deadline and bad.poll() is None:
        time.sleep(0.05)
    for p in ps:
        p.send_signal(signal.SIGCONT)
    try:
        _, err = bad.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        fail("agree/bad-deleted: still running 60 s after the members went on")
    r = subprocess.CompletedProcess(bad.args, bad.returncode, "", err)
    expect = "its configuration differs from the run's, which its members must share (outer.lr: this worker 0.5, the run 0.6"
    if r.returncode == 0 or expect not in r.stderr:
        fail(f"agree/bad-deleted: expected a refusal naming {expect!r}: exit {r.returncode}, {r.stderr[-1500:]}")
    restored = redis_cli("GET", "loco:agree:config")
    if '"outer.lr":"0.6"' not in restored.replace(" ", ""):
        fail(f"agree: the run's config entry was not written again: {restored[:300]}")
    wait_all(ps, ["w0", "w1"], "agree", limit=600)
    rounds = rounds_by_number("agree", ["w0", "w1"])
    if any(len(c) != 2 for c, _ in rounds.values()):
        fail(f"agree: a refused worker entered a round: {rounds}")
    print("members must agree: another num_heads, other data, another outer.lr, a link model and another secret each refused "
          "at start with the difference named, another outer.lr also after the run's config entry was deleted "
          "(by the members, who wrote it again); the run's 2 members went on alone")

    # 6c. A member that sends NaN, or a sign-flipped outer gradient ten times too large: every
    # member's screening (on by default in elastic runs) leaves it out of each of the 4 rounds, and
    # all 3 finish with a finite model.
    import numpy

    def finite_model(path):
        raw = open(path, "rb").read()
        hn = int.from_bytes(raw[:8], "little")
        return bool(numpy.isfinite(numpy.frombuffer(raw[8 + hn:], dtype=numpy.float32)).all())

    args = ["--set", "train.steps=20", "--set", "outer.inner_steps=5", "--set", "elastic.min_workers=3",
            "--set", "train.log_interval=5", "--set", "train.checkpoint_interval=20"]
    names = ["w0", "w1", "w2"]
    for fault in ("nan", "scale:-10"):
        tag = "screen-" + fault.replace(":", "")
        ps = [start(tag, n, tag, args + (["--set", f"elastic.fault={fault}"] if n == "w2" else [])) for n in names]
        wait_all(ps, names, tag)
        for n in names:
            log = open(f"{tag}-{n}.log").read()
            if log.count("left out: round member") != 4 or "non-finite outer gradient" not in log and fault == "nan":
                fail(f"{tag}/{n}: expected the bad member left out of 4 rounds:\n" + log[-2000:])
            recs = [json.loads(l) for l in open(f"{tag}/{n}/metrics.jsonl") if '"outer_rejected"' in l]
            if not recs or any(r["outer_rejected"] != 1 for r in recs):
                fail(f"{tag}/{n}: outer_rejected {[r.get('outer_rejected') for r in recs]}, expected 1 in each")
            final = json.load(open(f"{tag}/{n}/summary.json")).get("final_val_loss")
            if not isinstance(final, float) or not math.isfinite(final):
                fail(f"{tag}/{n}: final val loss {final}")
        ckpts = [f"{tag}/{n}/checkpoints/step_00000020/model.safetensors" for n in names]
        written = [c for c in ckpts if os.path.isfile(c)]
        if not written or not all(finite_model(c) for c in written):
            fail(f"{tag}: expected the writer's final checkpoint, finite: {written}")
    print("a member sending NaN or a sign-flipped x10 outer gradient: left out of all 4 rounds by every member's "
          "screening; all 3 finished with a finite loss, and the final checkpoint is finite")
    # The same for Streaming DiLoCo with fp4 outer gradients (all-gathered, every member decodes
    # and screens each one): a x-10 member is left out of every fragment's sync.
    sbad = args + stream + ["--set", "outer.codec=fp4-e3m0", "--set", "streaming.tau=1"]
    subprocess.run(BASE + sbad + ["--set", "distributed.replicas=3", "--set", "train.out_dir=inproc-sbad",
                                  "--set", "distributed.backend=inprocess", "--set", "outer.screen=on"],
                   check=True, stdout=subprocess.DEVNULL)
    ps = [start("sbad", n, "sbad", sbad + (["--set", "elastic.fault=scale:-10"] if n == "w2" else [])) for n in names]
    wait_all(ps, names, "sbad")
    logs = "".join(open(f"sbad-{n}.log").read() for n in names)
    if "sync, left out: round member" not in logs:
        fail("sbad: no member said it left the bad one out:\n" + logs[-2000:])
    ref = val_loss("inproc-sbad/summary.json")

    def near_honest(out, n, ref):
        """The final val loss of member n, failing unless finite and within 3% of the honest run's."""
        loss = val_loss(f"{out}/{n}/summary.json")
        if not math.isfinite(loss) or abs(loss / ref - 1) > 0.03:
            fail(f"{out}/{n}: final val loss {loss}, the honest in-process run's {ref}")
        return loss
    for n in names:
        recs = [json.loads(l) for l in open(f"sbad/{n}/metrics.jsonl") if '"outer_rejected"' in l]
        if not recs or any(r["outer_rejected"] != 1 for r in recs):
            fail(f"sbad/{n}: outer_rejected {[r.get('outer_rejected') for r in recs]}, expected 1 in each")
        loss = near_honest("sbad", n, ref)
    print(f"streaming fp4, a x-10 member: left out of every fragment's sync; final val loss {loss:.4f} "
          f"(3 honest in-process replicas: {ref:.4f})")

    # 6c'. Two members, one goes bad at step 20 (x-10): the median rule cannot tell two apart, the
    # run's history can (algo/robust.h): both members leave it out of each round from step 20 on,
    # agree on every round's parameters, and end near the honest pair.
    args2 = ["--set", "train.steps=40", "--set", "outer.inner_steps=5", "--set", "elastic.min_workers=2",
             "--set", "train.log_interval=5"]
    subprocess.run(BASE + args2 + ["--set", "distributed.replicas=2", "--set", "train.out_dir=inproc-two",
                                   "--set", "distributed.backend=inprocess"], check=True, stdout=subprocess.DEVNULL)
    ps = [start("twobad", n, "twobad", args2 + (["--set", "elastic.fault=scale:-10@20"] if n == "w1" else []))
          for n in ("w0", "w1")]
    wait_all(ps, ["w0", "w1"], "twobad")
    rounds_by_number("twobad", ["w0", "w1"])  # fails unless both hold the same parameters after every round
    ref = val_loss("inproc-two/summary.json")
    for n in ("w0", "w1"):
        got = [(r["step"], r["outer_rejected"]) for r in map(json.loads, open(f"twobad/{n}/metrics.jsonl"))
               if "outer_rejected" in r]
        if got != [(k, int(k >= 20)) for k in range(5, 41, 5)]:
            fail(f"twobad/{n}: (step, rejected) {got}; expected the bad member left out from step 20 on")
        loss = near_honest("twobad", n, ref)
    print(f"two members, one x-10 from step 20: left out of each of the 5 rounds from then on by both (the run's "
          f"history); final val loss {loss:.4f} (2 honest in-process replicas: {ref:.4f})")

    # 6d. The same NaN member with outer.screen = off: no member ends with exit 0, and no
    # checkpoint holds a non-finite value (the writer's latest stays at the last finite step).
    args = ["--set", "train.steps=20", "--set", "outer.inner_steps=5", "--set", "elastic.min_workers=3",
            "--set", "train.checkpoint_interval=1", "--set", "train.log_interval=1", "--set", "outer.screen=off"]
    names = ["w0", "w1", "w2"]
    ps = [start("nan", n, "nan", args + (["--set", "elastic.fault=nan"] if n == "w2" else [])) for n in names]
    codes = []
    for p, n in zip(ps, names):
        try:
            codes.append(p.wait(timeout=120))
        except subprocess.TimeoutExpired:
            fail(f"nan/{n} still running after 120 s")
    if any(c == 0 for c in codes):
        fail(f"nan: a NaN contribution ended with exit codes {codes}; expected every member to fail")
    logs = "".join(open(f"nan-{n}.log").read() for n in names)
    if "no checkpoint written, the latest stays" not in logs:
        fail("nan: no member refused to checkpoint the non-finite model:\n" + logs[-3000:])
    checked = 0
    for n in names:
        for d in sorted(os.listdir(f"nan/{n}/checkpoints")) if os.path.isdir(f"nan/{n}/checkpoints") else []:
            path = f"nan/{n}/checkpoints/{d}/model.safetensors"
            if not os.path.isfile(path):
                continue
            if not finite_model(path):
                fail(f"{path} holds non-finite values")
            checked += 1
    if checked < 3:  # steps 2-4: train.keep_checkpoints = 3
        fail(f"nan: expected the finite checkpoints of steps 2-4, found {checked}")
    print(f"a NaN member: all 3 members stopped with an error (exit codes {codes}); {checked} checkpoints, all "
          "finite; the writer refused the non-finite one")

    # 6e. A member nobody can reach (it advertises an unroutable address): the others blame it
    # for every failed attempt, it is excluded after elastic.exclude_after = 3 of them, stops with
    # an error saying so, and the other two finish the run.
    args = ["--set", "train.steps=20", "--set", "outer.inner_steps=5", "--set", "elastic.min_workers=3",
            "--set", "elastic.timeout=2s"]
    bad = subprocess.Popen(BASE + args + ["--set", "train.out_dir=unreach", "--set", "elastic.address=192.0.2.1",
                                          "--join", f"redis://127.0.0.1:{port}/unreach", "--worker", "wx"],
                           env=ENV, stdout=open("unreach-wx.log", "w"), stderr=subprocess.STDOUT)
    procs.append(bad)
    # wx registers first: member 1, rank 0 of every round (the others connect to it). Waited for,
    # not slept for: under a sanitizer on a loaded machine wx took longer than a fixed 1.5 s, w1
    # registered first, wx connected out to it, and the run finished with wx (exit 0).
    deadline = time.monotonic() + 60
    while redis_cli("EXISTS", "loco:unreach:member:1").strip() != "1":
        if time.monotonic() > deadline or bad.poll() is not None:
            fail("unreach/wx did not register within 60 s")
        time.sleep(0.1)
    ps = [start("unreach", n, "unreach", args) for n in ("w1", "w2")]
    wait_all(ps, ["w1", "w2"], "unreach", limit=180)
    try:
        rc = bad.wait(timeout=60)
    except subprocess.TimeoutExpired:
        fail("unreach/wx still running after the others finished")
    log = open("unreach-wx.log").read()
    if rc == 0 or "was excluded from the run" not in log:
        fail(f"unreach/wx: expected a stop saying it was excluded, exit {rc}:\n{log[-2000:]}")
    events = [e for r in map(json.loads, open("unreach/w1/metrics.jsonl")) for e in r.get("membership", [])]
    excluded = [e for e in events if e.get("event") == "left" and "excluded" in e.get("why", "")]
    if len(excluded) != 1:
        fail(f"unreach: expected one exclusion event, got {events}")
    rounds = rounds_by_number("unreach", ["w1", "w2"])
    if sorted(rounds) != [1, 2, 3, 4] or any(len(c) != 2 for c, _ in rounds.values()):
        fail(f"unreach: expected rounds 1-4 with the 2 reachable members, got {rounds}")
    print(f"a member nobody can reach: excluded after 3 failed attempts ({excluded[0]['why']}), stopped with "
          "an error; the other 2 finished all 4 rounds")

    # 7. Bad input: one clear error each.
    def refuse(args, env, expect):
        r = subprocess.run(BASE + args, env=env, capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or expect not in r.stderr:
            fail(f"expected an error containing {expect!r} from {args}: exit {r.returncode}, {r.stderr}")
    refuse(["--join", "http://x/y", "--worker", "a"], ENV, "not a redis:// address")
    refuse(["--join", f"redis://127.0.0.1:{port}/", "--worker", "a"], ENV, "no run name")
    refuse(["--join", f"redis://127.0.0.1:{port}/r"], ENV, "--join needs --worker")
    refuse(["--join", f"redis://127.0.0.1:{port}/r", "--worker", "a", "--set", "algorithm=ddp"], ENV,
           'runs algorithm = "diloco", "streaming" or "noloco"')
    refuse(["--join", f"redis://127.0.0.1:{port}/r", "--worker", "a", "--set", "algorithm=streaming",
            "--set", "streaming.worker_tau=1,2"], ENV, "one streaming.tau for all members")
    # What elastic runs cannot do, said by the methods (algo/*_elastic_refusal) and the session.
    for extra, expect in ((["--set", "partial.slices=2", "--set", "outer.screen=on"],
                           "outer.screen = \"on\" with partial.slices > 1 is not supported"),
                          (["--set", "outer.start_step=10"], "outer.start_step is not supported"),
                          (["--set", "algorithm=streaming", "--set", "streaming.eval=average"],
                           "evaluates the outer parameters"),
                          (["--set", "pipeline.stages=2"], "does not run pipelines")):
        refuse(["--join", f"redis://127.0.0.1:{port}/r", "--worker", "a"] + extra, ENV, expect)
    refuse(["--join", f"redis://127.0.0.1:{port}/r", "--worker", "a", "--set", "train.out_dir=bad1"],
           dict(ENV, LOCO_REDIS_PASSWORD="wrong"), "refused the password")
    refuse(["--join", f"redis://127.0.0.1:{free_port()}/r", "--worker", "a", "--set", "train.out_dir=bad2",
            "--set", "elastic.coordinator_timeout=1s"], ENV, "unreachable")
    no_secret = {k: v for k, v in ENV.items() if k != "LOCO_RUN_SECRET"}
    refuse(["--join", f"redis://127.0.0.1:{port}/r", "--worker", "a", "--set", "train.out_dir=bad3"], no_secret,
           "needs a secret shared by its members")
    refuse(["--join", f"redis://127.0.0.1:{port}/r", "--worker", "a", "--set", "train.out_dir=bad4"],
           dict(ENV, LOCO_RUN_SECRET="too short"), "it needs at least 16")
    refuse(["--join", f"redis://127.0.0.1:{port}/r", "--worker", "a", "--set", "train.out_dir=bad6",
            "--set", "elastic.fault=scale:x"], ENV, "scale:X needs a finite number")
    refuse(["--join", f"redis://127.0.0.1:{port}/r", "--worker", "a", "--set", "train.out_dir=bad7",
            "--set", "elastic.fault=nan", "--set", "algorithm=noloco"], ENV, "elastic.fault is implemented for")
    refuse(["--join", f"redis://127.0.0.1:{port}/r", "--worker", "a", "--set", "train.out_dir=bad5",
            "--set", "elastic.secret_file=no-such.secret"], ENV, "elastic.secret_file: no-such.secret does not exist")
    print("bad input refused with clear errors")
finally:
    cleanup()
print("elastic: OK")
