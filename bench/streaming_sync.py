"""What one Streaming DiLoCo sync costs loco on the host, fragment by fragment: a loco.torch model on
the CPU (its parameters are loco's buffers) of square nn.Linear layers, each a block and so a
fragment (fragment_blocks 1; the parameters outside the blocks, none here, make one more, empty),
one member (no peer to wait for), a codec, tau 1, H = 2 x (layers + 1), so that fragment j's sync
starts after step 2j of a round and is merged after step 2j + 1 (the offsets are taken from the
method's plan). Times sync.step() at the steps that start a layer's sync (the outer gradient, its
encoding, the reduction's start) and at those that merge one (waiting for the reduction, decoding,
the outer step, the merge), over the rounds from the second to the next-to-last (the first makes
the buffers; --rounds, 3 by default, so the second alone), and prints their medians and each
step's time. (Before 2026-11-29 H was 2 x layers: with the empty fragment's slot
the syncs then came every step, so a step merged one fragment and started the next, and the
medians mixed those steps with the empty fragment's.) This is the host side of a
sync of loco.torch with the outer state on the host, and of loco train's Streaming DiLoCo.

    PYTHONPATH=build/python python3 bench/streaming_sync.py --width 7168 --layers 4 --threads 2

--device-path takes instead the path of a model on a GPU with the outer state on the host
(outer_device="cpu", run on CPU tensors by LOCO_TORCH_AS_DEVICE=1): a sync's start and completion
run on loco.torch's background thread while the loop goes on, and the merge mixes the synchronized
values into the model. It prints, per sync, the seconds that thread was busy and, within them, the
C++ method's parts (the start: the outer gradient, its encoding, the reduction's start; the
completion ahead of the merge: the decoding and the outer step, whose pass also writes the
synchronized values into the buffer that crosses to the device; before 2026-11-29's change to
that pass, a part of its own, copy_synced, copied them there), the rest being torch's copies and
buffers (on a CPU, fresh ones cost the kernel page faults that a GPU's caching allocators do not).
"""
import argparse
import os
import statistics
import time

import torch

import loco
import loco.torch

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--width", type=int, default=4096, help="each layer is width x width (one fragment)")
p.add_argument("--layers", type=int, default=4)
p.add_argument("--threads", type=int, default=2, help="loco's compute threads")
p.add_argument("--codec", default="fp4-e3m0")
p.add_argument("--rounds", type=int, default=3, help="rounds to run; those from the second to the next-to-last are timed")
p.add_argument("--warm-host-buffers", action="store_true",
               help="with --device-path: the host buffers that cross to the device taken from a pool, as CUDA's "
                    "caching allocator gives page-locked ones, instead of made anew (page faults) at every sync")
p.add_argument("--device-path", action="store_true",
               help="a GPU model's path with the outer state on the host, on CPU tensors (see above)")
args = p.parse_args()
if args.device_path:
    os.environ["LOCO_TORCH_AS_DEVICE"] = "1"  # read at wrap()
loco._loco.set_threads(args.threads)
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
H = 2 * (args.layers + 1)
plan = loco._loco.plan_fragments(args.layers, 1, "strided", H)
if args.rounds < 3:
    p.error("--rounds must be at least 3")
# The starts of a layer's sync in the timed rounds.
layer_starts = {k * H + f["offset"] for k in range(2, args.rounds) for f in plan if f["blocks"]}
sync = loco.torch.wrap(model, opt, "streaming", endpoint=loco.inprocess(1)[0], blocks=list(model), inner_steps=H,
                       fragment_blocks=1, tau=1, alpha=0.5, codec=args.codec, train_steps=args.rounds * H + 1,
                       **(dict(outer_device="cpu") if args.device_path else {}))
PARTS = {"after_step": "start", "prepare_merges": "completion", "copy_synced": "copy_synced"}  # the last: libraries before 2026-11-29
spent = dict.fromkeys(PARTS.values(), 0.0)  # since the last reset, on whichever thread


class Timed:
    """The C++ method with the calls of a sync's parts timed."""

    def __init__(self, core):
        self._core = core

    def __getattr__(self, name):
        f = getattr(self._core, name)
        if name not in PARTS:
            return f

        def timed(*a):
            t0 = time.perf_counter()
            try:
                return f(*a)
            finally:
                spent[PARTS[name]] += time.perf_counter() - t0
        return timed


if args.device_path:
    sync._core = Timed(sync._core)
if args.device_path and args.warm_host_buffers:
    # Two buffers per size, in turn: on a CPU a buffer's copy "to the device" is done when
    # aside_to_device returns, and with tau 1 at most one sync is in flight here at a time.
    pool, made = {}, sync._copier.host_tensor

    def warm(n):
        bufs = pool.setdefault(n, [made(n).fill_(0), made(n).fill_(0)])
        bufs.append(bufs.pop(0))
        return bufs[-1]
    sync._copier.host_tensor = warm
starts, merges, background = [], [], []
for q in model.parameters():
    q.grad = torch.zeros_like(q)
for t in range(1, args.rounds * H + 1):
    for q in model.parameters():
        q.grad.fill_(1e-3 * (t % 3))
    opt.step()
    if t in layer_starts:
        spent.update(dict.fromkeys(spent, 0.0))
        if args.device_path:  # the background thread idle (metrics() waits for it)
            busy = sync.metrics()["background_seconds"].get("busy", 0.0)
    t0 = time.perf_counter()
    sync.step()
    took = time.perf_counter() - t0
    if t in layer_starts:
        starts.append(took)
    elif t - 1 in layer_starts:  # tau 1; the merge waited for the background thread's sync work
        merges.append(took)
        if args.device_path:
            now = sync.metrics()["background_seconds"].get("busy", 0.0)
            background.append((now - busy, dict(spent)))
n = args.width * args.width
print(f"{args.layers} fragments of {n / 1e6:.1f}M parameters, {args.codec}, {args.threads} threads: "
      f"start {statistics.median(starts):.3f} s, merge {statistics.median(merges):.3f} s (medians of "
      f"{len(starts)} and {len(merges)}): " + ", ".join(f"{t:.3f}" for pair in zip(starts, merges) for t in pair))
if args.device_path:
    def med(f):
        return statistics.median(f(b) for b in background)
    cpp = med(lambda b: sum(b[1].values()))
    print(f"device path, per sync on the background thread (medians): busy {med(lambda b: b[0]):.3f} s; the "
          f"C++ method's start {med(lambda b: b[1]['start']):.3f} s, completion {med(lambda b: b[1]['completion']):.3f} "
          f"s, copy_synced {med(lambda b: b[1]['copy_synced']):.3f} s (together {cpp:.3f} s); busy: "
          + ", ".join(f"{b[0]:.3f}" for b in background))
sync.close()
