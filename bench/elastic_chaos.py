#!/usr/bin/python3
"""Chaos run of elastic DiLoCo or Streaming DiLoCo on the Brown corpus (docs/results/elastic.md).

Starts a password-protected Redis on a free loopback port, then
  1. an undisturbed run: 4 elastic workers from start to end;
  2. the chaos run: the same, while workers are killed (SIGKILL) and new ones started at
     seeded random steps (kill, join, kill, join, join, kill: 4 -> 3 -> 4 -> 3 -> 4 -> 5 -> 4).
Measures, from the workers' summaries and metrics: detection time after each kill (kill to the
`left` event), recovery time (kill to the first committed round without the victim), join time
(process start to its first round), tokens lost, and the final validation loss of both runs.
Writes OUT/chaos.json, OUT/timeline.png (members and loss against step) and prints Markdown.
METHOD is diloco (H 20, outer lr 0.7) or streaming (H 20, 3 strided fragments, fp4 outer gradients,
tau 1, alpha 0.5, outer lr 0.4); LINK is the link model over the data plane, e.g. 100Mbit/30ms,
or none.
Usage: bench/elastic_chaos.py OUT_DIR [SEED] [STEPS] [METHOD] [LINK]"""
import json, os, random, shutil, signal, socket, statistics, subprocess, sys, time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = os.path.abspath(sys.argv[1])
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 400
method = sys.argv[4] if len(sys.argv) > 4 else "diloco"
link = sys.argv[5] if len(sys.argv) > 5 else "none"
if method not in ("diloco", "streaming"):
    sys.exit(f"elastic_chaos: METHOD must be diloco or streaming, not {method!r}")
loco = os.path.join(root, "build/loco")
subprocess.run(["bash", f"{root}/scripts/brown-data.sh"], check=True, stdout=subprocess.DEVNULL)
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
os.chdir(out)

s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
password = os.urandom(12).hex()
with open("redis.conf", "w") as f:
    f.write(f'bind 127.0.0.1\nport {port}\nsave ""\nappendonly no\nrequirepass {password}\n')
redis = subprocess.Popen(["redis-server", "redis.conf"], stdout=open("redis.log", "w"), stderr=subprocess.STDOUT)
time.sleep(0.5)
env = dict(os.environ, LOCO_REDIS_PASSWORD=password, LOCO_RUN_SECRET=os.urandom(24).hex())
H = 20
args = [loco, "train", "--config", f"{root}/configs/small.toml", "--quiet",
        "--set", f"data.train={root}/data/brown/tok4k/train.tok", "--set", f"data.val={root}/data/brown/tok4k/val.tok",
        "--set", f"outer.inner_steps={H}", "--set", f"train.steps={steps}",
        "--set", "data.batch_size=4", "--set", "train.log_interval=20", "--set", "train.eval_interval=100",
        "--set", "train.checkpoint_interval=0", "--set", "train.threads=1", "--set", "elastic.address=127.0.0.1",
        "--set", "elastic.timeout=3s", "--set", "elastic.min_workers=4"]
args += {"diloco": ["--set", "algorithm=diloco"],
         "streaming": ["--set", "algorithm=streaming", "--set", "streaming.fragment_blocks=3", "--set",
                       "streaming.pattern=strided", "--set", "streaming.tau=1", "--set", "streaming.alpha=0.5",
                       "--set", "outer.codec=fp4-e3m0", "--set", "outer.lr=0.4"]}[method]
if link != "none":
    bandwidth, latency = link.split("/")
    args += ["--set", f"network.bandwidth={bandwidth}", "--set", f"network.latency={latency}"]
procs = {}


def start(run, name):
    os.makedirs(run, exist_ok=True)
    p = subprocess.Popen(args + ["--set", f"train.out_dir={run}", "--join", f"redis://127.0.0.1:{port}/{run}",
                                 "--worker", name], env=env, stdout=open(f"{run}/{name}.log", "w"),
                         stderr=subprocess.STDOUT)
    procs[(run, name)] = (p, time.time())
    return p


def step_of(path):
    try:
        lines = open(path).read().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def wait_done(run, names):
    for n in names:
        p, _ = procs[(run, n)]
        if p.wait(timeout=3600) != 0:
            sys.exit(f"{run}/{n} failed: " + open(f"{run}/{n}.log").read()[-2000:])


try:
    t0 = time.time()
    for k in range(4):
        start("undisturbed", f"w{k}")
    wait_done("undisturbed", [f"w{k}" for k in range(4)])
    undisturbed_wall = time.time() - t0

    rng = random.Random(seed)
    triggers = sorted(rng.sample(range(2 * H, steps - 2 * H, 10), 6))
    actions = ["kill", "join", "kill", "join", "join", "kill"]
    live = [f"w{k}" for k in range(4)]
    kills, joins = [], []
    t0 = time.time()
    for k in range(4):
        start("chaos", f"w{k}")
    next_name = 4
    for trigger, action in zip(triggers, actions):
        while max(step_of(f"chaos/{n}/metrics.jsonl") for n in live) < trigger:
            time.sleep(0.02)
        if action == "kill":
            victim = rng.choice(live)
            procs[("chaos", victim)][0].send_signal(signal.SIGKILL)
            kills.append({"name": victim, "time": time.time(), "step": trigger})
            live.remove(victim)
        else:
            name = f"w{next_name}"
            next_name += 1
            start("chaos", name)
            joins.append({"name": name, "time": time.time(), "step": trigger})
            live.append(name)
    wait_done("chaos", live)
    chaos_wall = time.time() - t0
finally:
    for p, _ in procs.values():
        if p.poll() is None:
            p.kill()
    redis.kill()


def summary(run, name):
    return json.load(open(f"{run}/{name}/summary.json"))


json.dump({"kills": kills, "joins": joins, "live": live}, open("raw.json", "w"), indent=2)
ref = summary("chaos", live[0])
el = ref["workers"][0]["elastic"]
events = el["events"]
rounds = {}
for n in live:
    for r in summary("chaos", n)["workers"][0]["elastic"]["rounds"]:
        if "contributors" in r:
            rounds[r["round"]] = r
name_of = {e["member"]: e["name"] for e in events if "member" in e}
detect, recover = [], []
for k in kills:
    left = [e for e in events if e["event"] == "left" and e["name"] == k["name"]]
    k["detected_s"] = left[0]["time"] - k["time"] if left else None
    after = [r for r in sorted(rounds.values(), key=lambda r: r["time"])
             if r["time"] > k["time"] and all(name_of.get(c) != k["name"] for c in r["contributors"])]
    k["recovered_s"] = after[0]["time"] - k["time"] if after else None
    if k["detected_s"] is not None:
        detect.append(k["detected_s"])
    if k["recovered_s"] is not None:
        recover.append(k["recovered_s"])
for j in joins:  # from the membership log: a joiner may itself be killed later
    took_in = [e for e in events if e["event"] == "joined" and e["name"] == j["name"]]
    j["joined_s"] = took_in[0]["time"] - j["time"] if took_in else None
    j["joined_round"] = took_in[0]["round"] if took_in else None
# Members and loss against step, from a survivor present from the start (or the longest-lived).
timeline = []
for line in open(f"chaos/{live[0]}/metrics.jsonl"):
    rec = json.loads(line)
    timeline.append((rec["step"], rec.get("members", 0), rec["train_loss"], rec.get("val_loss")))
und = [json.loads(l) for l in open("undisturbed/w0/metrics.jsonl")]
with open("timeline.dat", "w") as f:
    for st, m, tl, vl in timeline:
        f.write(f"{st} {m} {tl} {vl if vl is not None else 'NaN'}\n")
with open("undisturbed.dat", "w") as f:
    for rec in und:
        f.write(f"{rec['step']} {rec['train_loss']} {rec.get('val_loss', 'NaN')}\n")
kill_lines = "".join(f"set arrow from {k['step']},graph 0 to {k['step']},graph 1 nohead lc rgb '#cc0000' dt 2\n" for k in kills)
join_lines = "".join(f"set arrow from {j['step']},graph 0 to {j['step']},graph 1 nohead lc rgb '#008800' dt 3\n" for j in joins)
subprocess.run(["gnuplot"], input=f"""set terminal pngcairo size 1000,520
set output 'timeline.png'
set multiplot layout 2,1
set xrange [0:{steps}]
set ylabel 'members'
set yrange [0:6]
set title 'elastic {"Streaming DiLoCo" if method == "streaming" else "DiLoCo"}, Brown, link {link}: members (red dashed: kill, green dotted: join)'
{kill_lines}{join_lines}plot 'timeline.dat' using 1:2 with steps lw 2 title 'chaos run'
unset arrow
set title ''
set yrange [*:*]
set ylabel 'loss (nats)'
set xlabel 'step'
plot 'timeline.dat' using 1:3 with lines title 'chaos train', 'undisturbed.dat' using 1:2 with lines title 'undisturbed train', \\
     'timeline.dat' using 1:4 with linespoints pt 7 title 'chaos val', 'undisturbed.dat' using 1:3 with linespoints pt 5 title 'undisturbed val'
unset multiplot
""", text=True, check=True)
result = {"method": method, "link": link, "seed": seed, "steps": steps, "H": H, "kills": kills, "joins": joins,
          "join_s": [j["joined_s"] for j in joins if j["joined_s"] is not None],
          "tokens_lost": el["tokens_lost_run"], "aborted_attempts": el["aborted_attempts"],
          "final_val_loss": {"chaos": ref["final_val_loss"], "undisturbed": summary("undisturbed", "w0")["final_val_loss"]},
          "wall_s": {"chaos": chaos_wall, "undisturbed": undisturbed_wall},
          "mean_cu": {run: statistics.mean(summary(run, n)["workers"][0]["compute_utilization"] for n in names)
                      for run, names in (("chaos", live), ("undisturbed", [f"w{k}" for k in range(4)]))}}
json.dump(result, open("chaos.json", "w"), indent=2)
print("| event | step | worker | detected after s | recovered after s | taken in after s (round) |")
print("|---|---|---|---|---|---|")
for e in sorted(kills + joins, key=lambda e: e["step"]):
    if "detected_s" in e:
        print(f"| kill | {e['step']} | {e['name']} | {e['detected_s']:.2f} | {e['recovered_s']:.2f} | |")
    else:
        took = "not taken in" if e["joined_s"] is None else f"{e['joined_s']:.2f} (round {e['joined_round']})"
        print(f"| join | {e['step']} | {e['name']} | | | {took} |")
print(f"\ndetection: median {statistics.median(detect):.2f} s, max {max(detect):.2f} s; "
      f"recovery: median {statistics.median(recover):.2f} s, max {max(recover):.2f} s; "
      f"join: median {statistics.median(result['join_s']):.2f} s, max {max(result['join_s']):.2f} s; "
      f"tokens lost {result['tokens_lost']}; final val loss chaos {result['final_val_loss']['chaos']:.4f}, "
      f"undisturbed {result['final_val_loss']['undisturbed']:.4f}; wall {chaos_wall:.0f} s vs {undisturbed_wall:.0f} s; "
      f"mean CU of the finishing workers {100 * result['mean_cu']['chaos']:.1f}% vs "
      f"{100 * result['mean_cu']['undisturbed']:.1f}%")
