"""loco.torch's cost on a GPU: the same training loop plain and under each method, with one
member (no peer to wait for: loco's own cost) and with 2 in-process members (threads sharing the
device), timed in one run so that the ratios compare like with like.

  PYTHONPATH=build/python:examples python3 bench/torch_gpu.py                 # small, any device
  PYTHONPATH=build/python:examples python3 bench/torch_gpu.py --hf --hidden 2048 --layers 16 \\
      --heads 16 --kv-heads 4 --mlp 5632 --vocab 32000 --batch 8 --seq 1024   # the 0.85B Llama

The model is examples/llama.py's, or with --hf a Hugging Face LlamaForCausalLM of the sizes given
(untied, as loco's checkpoints load into). AdamW (fused on CUDA), bf16 autocast on CUDA. Each step
ends with loss.item(), as a loop that logs its loss does. Per row: median and mean seconds per
step over the timed steps (after --warmup steps), their ratio to the plain loop of the same
member count, the slowest step against the median, wrap()'s seconds, peak device memory, the
host memory loco holds (the resident-set growth across wrap() and the run), and host_device_bytes
per step (metrics: bytes between the model's tensors and loco's host buffers), and where loco's
hooks spent their time per step (metrics' loop_seconds and background_seconds: waiting for the
background, merges, starts, the C++ hooks, copies waited for). With --turns the members take
turns for their steps' compute (each one's step time and peak memory its own, not raised by
another member's steps on the same device) and then run sync.step() together. On a CPU the same
code path runs with LOCO_TORCH_AS_DEVICE=1 (set it to check the script); its times say nothing
about a GPU. --out FILE also writes the rows as JSON.

Rows diloco and streaming (Streaming DiLoCo: a fragment per block, fp4-e3m0, tau 1) keep the outer
state on the device (outer_device="model"), diloco-host and streaming-host on the host; the
partial rows on the device. A Streaming DiLoCo row named with -tauN (streaming-tau2,
streaming-host-tau2) merges N steps after each start instead of 1. loco's compute threads (its
host work: a sync's outer gradient, codec and outer step with the outer state on the host) are
--loco-threads, by default what loco.init() gives a model on a GPU (half the host's cores: the
loop's own thread, the one that launches the device's work, keeps a core); a row named with -tN
(e.g. streaming-host-t16) runs with N.

Partial updates (methods partial2, partial4, partial2h: DiLoCo where each member trains 1/2 or
1/4 of the MLPs, or 1/2 of the MLPs and 1/2 of the heads; rows only for member counts they divide,
e.g. --members 1,2,4): per member, the parameters it trains, its optimizer's state bytes, the
device's peak memory divided by the members, and the step time, each against DiLoCo's with the
same members, beside the partial-updates paper's table 1 (its 1.3B model: trainable 1.3B / 0.87B
/ 0.67B / 0.72B, memory 19.36 / 14.87 / 12.77 / 13.29 GB for DiLoCo, 1/2 and 1/4 of the MLPs, 1/2
of the MLPs and heads; an analytic estimate there, a measurement here).
"""
import argparse
import gc
import json
import os
import platform
import re
import statistics
import threading
import time

import torch

import loco
import loco.torch
from device_timer import median_seconds
from loco import _partial

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--hf", action="store_true", help="a Hugging Face LlamaForCausalLM (needs transformers)")
p.add_argument("--hidden", type=int, default=128)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--kv-heads", type=int, default=0, help="--hf only; 0: as many as --heads")
p.add_argument("--mlp", type=int, default=344)
p.add_argument("--vocab", type=int, default=2048)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--inner-steps", type=int, default=30, help="H of DiLoCo and Streaming DiLoCo")
p.add_argument("--steps", type=int, default=60, help="timed steps per row (whole rounds: a multiple of H)")
p.add_argument("--warmup", type=int, default=-1,
               help="untimed steps first (default: 2 H, so that the timed steps see Streaming DiLoCo's steady "
                    "state: its fragment j first syncs after H + j floor(H / fragments) steps, and a first sync "
                    "makes its page-locked buffers)")
p.add_argument("--members", default="1,2", help="member counts to run, e.g. 1 or 1,2")
p.add_argument("--methods", default="plain,ddp,diloco,diloco-host,streaming,streaming-host,partial2,partial4,partial2h")
p.add_argument("--turns", action="store_true",
               help="members take turns for their steps' compute (forward, backward, optimizer step) on the shared "
                    "device, then run sync.step() together: each member's step time and peak memory are its own, "
                    "not raised by the other member's steps (rows of methods whose optimizer step communicates, "
                    "data-parallel, are skipped)")
p.add_argument("--loco-threads", type=int, default=0,
               help="loco's compute threads (0: loco.init()'s choice for a model on a GPU, half the host's cores; "
                    "all of them on the CPU, where the loop's own compute uses them too)")
p.add_argument("--out", default="")
p.add_argument("--profile-wrap", default="", metavar="METHOD",
               help="only profile one member's wrap() of METHOD (cProfile, the 15 costliest calls), then exit")
p.add_argument("--profile-steps", default="", metavar="METHOD",
               help="only profile one member's --steps steps of METHOD after --warmup (torch.profiler: the 25 "
                    "costliest operations by their own time on the host and on the device), then exit; "
                    "e.g. --warmup 25 --steps 6 holds DiLoCo's round at step 30 of H = 30")
args = p.parse_args()
if args.warmup < 0:
    args.warmup = 2 * args.inner_steps
device = torch.device(args.device)
cuda = device.type == "cuda"
if not cuda:
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
if not args.loco_threads:
    args.loco_threads = loco._device_threads() if cuda else max(1, (os.cpu_count() or 1))
loco._loco.set_threads(args.loco_threads)


def make_model(seed):
    torch.manual_seed(seed)
    if args.hf:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.mlp,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          num_key_value_heads=args.kv_heads or args.heads, tie_word_embeddings=False,
                          max_position_embeddings=max(2048, args.seq))
        if cuda and hasattr(torch.device, "__enter__"):  # built on the GPU: a 0.85B model's init on the host takes seconds
            with device:
                return LlamaForCausalLM(cfg)
        model = LlamaForCausalLM(cfg)
    else:
        from llama import Llama
        model = Llama(args.vocab, d=args.hidden, layers=args.layers, heads=args.heads, f=args.mlp)
    return model.to(device)


def loss_of(model, x, y):
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cuda):
        if args.hf:
            logits = model(input_ids=x).logits
            return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        return model.loss(x, y)


def make_opt(model):
    kw = {"fused": True} if cuda else {}
    try:
        return torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
    except (TypeError, RuntimeError):  # torch without the fused AdamW
        return torch.optim.AdamW(model.parameters(), lr=1e-4)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# The partial-updates paper's table 1 (1.3B model): trainable parameters and memory against DiLoCo's.
PAPER = {"partial2": (0.87 / 1.3, 14.87 / 19.36), "partial4": (0.67 / 1.3, 12.77 / 19.36),
         "partial2h": (0.72 / 1.3, 13.29 / 19.36)}


def slices_of(method):
    method = split_row(method)[0]
    return int(method[len("partial"):].rstrip("h")) if method.startswith("partial") else 1


def split_row(method):
    """A row's name without its trailing -tauN and -tN, its tau (1 unless named with -tauN, e.g.
    streaming-host-tau2) and loco's compute threads (--loco-threads unless named with -tN)."""
    tau, threads = 1, args.loco_threads
    while (m := re.fullmatch(r"(.+)-(tau|t)(\d+)", method)):
        method, n = m.group(1), int(m.group(3))
        tau, threads = (n, threads) if m.group(2) == "tau" else (tau, n)
    return method, tau, threads


def base(method):
    """The method a row runs ("diloco-host": DiLoCo with its outer state on the host)."""
    method = split_row(method)[0]
    return "diloco" if slices_of(method) > 1 else method.removesuffix("-host")


def settings(method):
    method, tau, _ = split_row(method)
    if method == "ddp":
        return {}
    where = {"outer_device": "cpu" if method.endswith("-host") else "model"}
    if device.type == "cpu" and os.environ.get("LOCO_TORCH_AS_DEVICE", "0") != "1":
        where = {}  # a CPU model's parameters are loco's buffers: the outer state is there too
    method = method.removesuffix("-host")
    if method == "streaming":
        return {"inner_steps": args.inner_steps, "fragment_blocks": 1, "codec": "fp4-e3m0", "tau": tau, **where}
    if slices_of(method) > 1:
        out = {"inner_steps": args.inner_steps, "partial_slices": slices_of(method), **where}
        if method.endswith("h"):  # the heads too (a Hugging Face model gives its head counts)
            out["partial_strategy"] = "mlp+heads"
            if not args.hf:
                out["num_heads"] = args.heads
        return out
    return {"inner_steps": args.inner_steps, **where}


def train_step(model, opt, sync, batch):
    """One step of the loop (sync None: the plain loop); its seconds, the loss read back."""
    start = time.perf_counter()
    loss = loss_of(model, batch[:, :-1], batch[:, 1:])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if sync:
        sync.step()
    loss.item()
    return time.perf_counter() - start


def turn_step(model, opt, sync, batch, rank, shared):
    """One step with --turns: this member's compute alone on the device (the others wait for the
    lock), then every member's sync.step() at once. Returns its seconds (compute + sync), the
    device memory it allocated above what was allocated when its turn began (its own peak less
    what every member holds between steps, which turn_step returns too), and that peak by phase:
    the forward's, the backward's and the optimizer step's, and what each left allocated."""
    phases = {}
    with shared["lock"]:
        if cuda:
            torch.cuda.synchronize(device)
            held = torch.cuda.memory_allocated(device)

        def phase(label, f):
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            out = f()
            if cuda:
                phases[label] = torch.cuda.max_memory_allocated(device) - held
                phases[label + "_end"] = torch.cuda.memory_allocated(device) - held
            return out

        start = time.perf_counter()
        loss = phase("forward", lambda: loss_of(model, batch[:, :-1], batch[:, 1:]))
        phase("backward", loss.backward)
        phase("optimizer", opt.step)
        opt.zero_grad(set_to_none=True)
        loss.item()
        compute = time.perf_counter() - start
        above = max(phases.get(k, 0) for k in ("forward", "backward", "optimizer"))
    barrier = shared["barrier"]
    if barrier.wait() == 0 and cuda:  # every member's compute done: the syncs' own peak next
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    barrier.wait()
    start = time.perf_counter()
    if sync:
        sync.step()
    if cuda:
        torch.cuda.synchronize(device)
    took = compute + time.perf_counter() - start
    if barrier.wait() == 0 and cuda and shared["timed"]:  # the members' syncs at once: an even share of their peak
        shared["sync_peak"] = max(shared["sync_peak"], torch.cuda.max_memory_allocated(device) / barrier.parties)
    barrier.wait()
    return took, above, held if cuda else 0, phases


def member(method, endpoint, rank, out, barrier, shared):
    model = make_model(rank)
    opt = make_opt(model)
    g = torch.Generator().manual_seed(100 + rank)
    data = torch.randint(0, args.vocab, (8, args.batch, args.seq + 1), generator=g).to(device)
    barrier.wait()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    sync = loco.torch.wrap(model, opt, base(method), endpoint=endpoint, **settings(method)) if method != "plain" else None
    if cuda:
        torch.cuda.synchronize(device)
    wrap_s = time.perf_counter() - t0
    times, bytes0, m0, own_peak, own_phases = [], 0, {}, 0, {}
    for t in range(args.warmup + args.steps):
        if t == args.warmup:
            if cuda and rank == 0:
                torch.cuda.reset_peak_memory_stats(device)
            m0 = sync.metrics() if sync else {}
            bytes0 = m0.get("host_device_bytes", 0)
            barrier.wait()
            shared["timed"], shared["sync_peak"] = True, 0
        if args.turns:
            took, above, held, phases = turn_step(model, opt, sync, data[t % 8], rank, shared)
            times.append(took)
            if t >= args.warmup:  # what every member holds between steps is shared evenly (members alike)
                own_peak = max(own_peak, held / len(out) + above)
                own_phases = {k: max(v, own_phases.get(k, v)) for k, v in phases.items()}
                own_phases["held"] = held / len(out)
        else:
            times.append(train_step(model, opt, sync, data[t % 8]))
    row = {"wrap_s": wrap_s, "times": times[args.warmup:], "host_bytes": rss_bytes() - rss0,
           "trainable_params": sum(q.numel() for q in model.parameters() if q.requires_grad),
           "opt_state_bytes": _partial.state_bytes(opt)}
    if sync:
        m = sync.metrics()
        row["host_device_bytes_per_step"] = (m["host_device_bytes"] - bytes0) / args.steps
        # Where loco's hooks spent their time per timed step, on the loop's thread and the background's
        for key in ("loop_seconds", "background_seconds"):
            row[key + "_per_step"] = {k: (v - m0.get(key, {}).get(k, 0)) / args.steps for k, v in m[key].items()}
        row["syncs_in_background"] = m["syncs_in_background"]
        r = sync.report()
        row["outer_device"], row["outer_state_bytes"] = r.get("outer_device"), r.get("outer_state_bytes", 0)
        if "tau" in r:  # Streaming DiLoCo's, as the method took it
            row["tau"] = r["tau"]
        sync.close()
    if cuda and rank == 0:
        row["peak_device_bytes"] = torch.cuda.max_memory_allocated(device)
        if args.turns:  # one member's: its own step's (above an even share of what all hold) or the syncs' share
            row["peak_own_step_bytes"], row["peak_sync_share_bytes"] = own_peak, shared["sync_peak"]
            row["step_phase_bytes"] = own_phases
            row["peak_device_bytes"] = len(out) * max(own_peak, shared["sync_peak"])
    out[rank] = row
    del model, opt, sync
    if cuda:
        torch.cuda.empty_cache()


def run(method, members):
    # The last run's tensors freed (reference cycles too), so that each run's peak is its own.
    gc.collect()
    before = 0
    if cuda:
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(device)
    loco_threads = split_row(method)[2]
    loco._loco.set_threads(loco_threads)  # between rows: no sync in flight
    endpoints = loco.inprocess(members) if method != "plain" else [None] * members
    out, errors = [None] * members, []
    barrier = threading.Barrier(members)
    shared = {"lock": threading.Lock(), "barrier": threading.Barrier(members), "timed": False}  # --turns

    def body(r):
        try:
            member(method, endpoints[r], r, out, barrier, shared)
        except Exception as e:
            errors.append(f"member {r}: {e!r}")
            barrier.abort()
            shared["barrier"].abort()
            if endpoints[r] is not None:
                endpoints[r].abort(str(e))

    threads = [threading.Thread(target=body, args=(r,)) for r in range(members)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    if errors:  # e.g. out of device memory: said, and the other rows still run
        print(f"{method:>9} x{members}: FAILED: " + "; ".join(errors), flush=True)
        if cuda:
            torch.cuda.empty_cache()
        return None
    # A step of the group ends when its slowest member's does.
    per_step = [max(o["times"][i] for o in out) for i in range(args.steps)]
    row = dict(out[0])
    row.update(method=method, members=members, loco_threads=loco_threads, median_s=statistics.median(per_step),
               mean_s=statistics.fmean(per_step), max_s=max(per_step), step_s=[round(t, 5) for t in per_step])
    del row["times"]
    if "peak_device_bytes" in row:  # above what was allocated before the run (a leak would show here)
        row["peak_device_bytes"] -= before
        row["device_bytes_before"] = before
    return row


def skipped_products(method):
    """Seconds a step of the weight-gradient products a member of `method` skips (partial updates:
    the products of the projections' rows or columns it does not train), each timed alone on the
    device in bf16 (CUDA events) or float32 (the CPU): every layer's full products less those of
    one slice, as python/loco/_partial.py computes them (gate and up: the slice's output units
    times the input; down: the output gradient times the slice's input units; with the heads, q,
    k and v as gate and up)."""
    k, n = slices_of(method), args.batch * args.seq
    dtype = torch.bfloat16 if cuda else torch.float32
    h, kv = args.hidden, args.hidden * (args.kv_heads or args.heads) // args.heads
    shapes = [(args.mlp, h, 0), (args.mlp, h, 0), (h, args.mlp, 1)]  # (outputs, inputs, sliced dim)
    if split_row(method)[0].endswith("h"):
        shapes += [(h, h, 0), (kv, h, 0), (kv, h, 0)]
    g = torch.Generator(device=device).manual_seed(0)

    total = 0.0
    with torch.no_grad():
        for out_units, in_units, dim in shapes:
            gy = torch.randn(n, out_units, generator=g, device=device).to(dtype)
            x = torch.randn(n, in_units, generator=g, device=device).to(dtype)
            full = median_seconds(lambda: gy.t().mm(x), device, 7)
            if dim == 0:
                part = median_seconds(lambda: gy[:, :out_units // k].t().mm(x), device, 7)
            else:
                xs = x[:, :in_units // k].contiguous()
                part = median_seconds(lambda: gy.t().mm(xs), device, 7)
            total += full - part
    return total * args.layers


nparams = sum(q.numel() for q in make_model(0).parameters())
name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or "cpu")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"device: {name} ({device.type}); host CPU: {cpu} ({os.cpu_count()} cores), loco's compute threads "
      f"{args.loco_threads}; torch {torch.__version__}; LOCO_TORCH_AS_DEVICE={os.environ.get('LOCO_TORCH_AS_DEVICE', '0')}")
print(f"model: {'Hugging Face Llama' if args.hf else 'examples/llama.py'}, {nparams / 1e6:.1f}M parameters, "
      f"batch {args.batch} x {args.seq}, H = {args.inner_steps}, {args.steps} timed steps after {args.warmup}")
if args.profile_wrap:
    import cProfile
    import pstats
    model = make_model(0)
    opt = make_opt(model)
    if cuda:
        torch.cuda.synchronize(device)
    core = loco._loco.Method

    def method_constructor(*a, **k):  # the C++ constructor, as a line of its own in the profile
        return core(*a, **k)
    loco._loco.Method = method_constructor
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    sync = loco.torch.wrap(model, opt, base(args.profile_wrap), endpoint=loco.inprocess(1)[0],
                           **settings(args.profile_wrap))
    if cuda:
        torch.cuda.synchronize(device)
    prof.disable()
    print(f"wrap() of {args.profile_wrap}, 1 member: {time.perf_counter() - t0:.2f} s")
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    sync.close()
    raise SystemExit(0)
if args.profile_steps:
    from torch.profiler import ProfilerActivity, profile
    model = make_model(0)
    opt = make_opt(model)
    method = args.profile_steps
    sync = loco.torch.wrap(model, opt, base(method), endpoint=loco.inprocess(1)[0], **settings(method))
    data = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1))
    data = data.to(device)
    for _ in range(args.warmup):
        train_step(model, opt, sync, data)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:  # pick --warmup and --steps to hold a round or the syncs
        times = [train_step(model, opt, sync, data) for _ in range(args.steps)]
    print(f"{method}, 1 member, {len(times)} steps profiled: " + " ".join(f"{t:.3f}" for t in times))
    table = prof.key_averages().table
    if cuda:  # the device's own time first (torch 2.4 renamed the key)
        for key in ("self_device_time_total", "self_cuda_time_total"):
            try:
                print(table(sort_by=key, row_limit=25))
                break
            except Exception as e:  # an unknown key in this torch: the other name
                print(f"(sorting by {key}: {e!r})")
    print(table(sort_by="self_cpu_time_total", row_limit=25))
    sync.close()
    raise SystemExit(0)
saved = args.steps
args.steps = max(1, min(args.warmup, 5))
run("plain", 1)  # the first loop of a process pays for kernel selection and allocator growth: not timed
args.steps = saved
rows = []


def save():  # after each row, so that a run stopped at its time limit keeps the rows it measured
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump({"device": name, "cpu": cpu, "torch": torch.__version__, "params": nparams, "args": vars(args),
                       "rows": rows}, f, indent=1)
        os.replace(args.out + ".tmp", args.out)


for members in [int(x) for x in args.members.split(",")]:
    plain = diloco = None
    for method in args.methods.split(","):
        if members % slices_of(method):
            continue  # each slice needs its members
        if args.turns and base(method) == "ddp" and members > 1:
            print(f"{method:>9} x{members}: skipped with --turns (its optimizer step communicates)")
            continue
        row = run(method, members)
        if row is None:
            rows.append({"method": method, "members": members, "failed": True})
            save()
            continue
        plain = row if method == "plain" else plain
        diloco = row if method == "diloco" else diloco
        if plain is not None:
            row["median_ratio"] = row["median_s"] / plain["median_s"]
            row["mean_ratio"] = row["mean_s"] / plain["mean_s"]
        rows.append(row)
        if slices_of(method) > 1 and diloco is not None:
            per = lambda r: r.get("peak_device_bytes", 0) / members
            row["vs_diloco"] = {"trainable": row["trainable_params"] / diloco["trainable_params"],
                                "opt_state": row["opt_state_bytes"] / diloco["opt_state_bytes"],
                                "peak_memory": per(row) / per(diloco) if per(diloco) else float("nan"),
                                "median_step": row["median_s"] / diloco["median_s"]}
            v, paper = row["vs_diloco"], PAPER.get(method)
            print(f"{method:>9} x{members} per member against diloco x{members}: trainable {row['trainable_params']:,} "
                  f"({v['trainable']:.3f}x), optimizer state {row['opt_state_bytes'] / 2**20:.1f} MiB "
                  f"({v['opt_state']:.3f}x), peak device memory {per(row) / 2**30:.2f} GiB ({v['peak_memory']:.3f}x), "
                  f"median step {v['median_step']:.3f}x" +
                  (f"; paper's table 1: trainable {paper[0]:.3f}x, memory {paper[1]:.3f}x" if paper else ""))
        print(f"{method:>9} x{members}: median {row['median_s']:.4f} s ({row.get('median_ratio', float('nan')):.3f}x), "
              f"mean {row['mean_s']:.4f} s ({row.get('mean_ratio', float('nan')):.3f}x), "
              f"slowest/median {row['max_s'] / row['median_s']:.2f}, wrap {row['wrap_s']:.2f} s, "
              f"peak device {row.get('peak_device_bytes', 0) / 2**30:.2f} GiB"
              f"{f' (+{b / 2**30:.2f} GiB held before)' if (b := row.get('device_bytes_before', 0)) > 2**24 else ''}, "
              f"host +{row['host_bytes'] / 2**30:.2f} GiB, "
              f"host<->device {row.get('host_device_bytes_per_step', 0) / 2**20:.1f} MiB/step, "
              f"background syncs {row.get('syncs_in_background', 0)}" +
              (f", outer state on {row['outer_device']} ({row['outer_state_bytes'] / 2**30:.2f} GiB)"
               if row.get("outer_device") else ""), flush=True)
        if "step_phase_bytes" in row:
            ph = {k: v / 2**30 for k, v in row["step_phase_bytes"].items()}
            print(f"{'':>13}one member's step above what it holds between steps ({ph.get('held', 0):.2f} GiB), GiB: "
                  f"forward peak {ph.get('forward', 0):.2f} (kept at its end {ph.get('forward_end', 0):.2f}), "
                  f"backward peak {ph.get('backward', 0):.2f} (kept {ph.get('backward_end', 0):.2f}), "
                  f"optimizer step peak {ph.get('optimizer', 0):.2f}", flush=True)
        if slices_of(method) > 1:
            row["skipped_products_s"] = skipped_products(method)
            print(f"{'':>13}the weight-gradient products its slices skip, timed alone: "
                  f"{row['skipped_products_s'] * 1e3:.1f} ms a step" +
                  (f" (its median step {(diloco['median_s'] - row['median_s']) * 1e3:.1f} ms below DiLoCo's)"
                   if diloco is not None else ""), flush=True)
        if "loop_seconds_per_step" in row:
            ms = lambda d: ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(d.items()) if k not in ("hooks", "busy"))
            loop, bg = row["loop_seconds_per_step"], row["background_seconds_per_step"]
            print(f"{'':>13}loco per step (ms): on the loop {loop.get('hooks', 0) * 1e3:.1f} ({ms(loop)}); "
                  f"background {bg.get('busy', 0) * 1e3:.1f} ({ms(bg) or '-'})", flush=True)
        save()
