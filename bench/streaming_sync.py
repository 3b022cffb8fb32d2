"""What one Streaming DiLoCo sync costs loco on the host, fragment by fragment: a loco.torch model on
the CPU (its parameters are loco's buffers) of square nn.Linear layers, each a block and so a
fragment (fragment_blocks 1; the parameters outside the blocks, none here, make one more, empty),
one member (no peer to wait for), a codec, tau 1, H = 2 x (layers + 1), so that fragment j's sync
starts after step 2j of a round and is merged after step 2j + 1 (the offsets are taken from the
method's plan). Times sync.step() at the steps that start a layer's sync (the outer gradient, its
encoding, the reduction's start) and at those that merge one (waiting for the reduction, decoding,
the outer step, the merge), over the second round (the first makes the buffers), and prints their
medians and each step's time. (Before 2026-11-29 H was 2 x layers: with the empty fragment's slot
the syncs then came every step, so a step merged one fragment and started the next, and the
medians mixed those steps with the empty fragment's.) This is the host side of a
sync of loco.torch with the outer state on the host, and of loco train's Streaming DiLoCo.

    PYTHONPATH=build/python python3 bench/streaming_sync.py --width 7168 --layers 4 --threads 2
"""
import argparse
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
args = p.parse_args()
loco._loco.set_threads(args.threads)
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
H = 2 * (args.layers + 1)
plan = loco._loco.plan_fragments(args.layers, 1, "strided", H)
layer_starts = {2 * H + f["offset"] for f in plan if f["blocks"]}  # the second round's starts of a layer's sync
sync = loco.torch.wrap(model, opt, "streaming", endpoint=loco.inprocess(1)[0], blocks=list(model), inner_steps=H,
                       fragment_blocks=1, tau=1, alpha=0.5, codec=args.codec, train_steps=3 * H + 1)
starts, merges = [], []
for q in model.parameters():
    q.grad = torch.zeros_like(q)
for t in range(1, 3 * H + 1):
    for q in model.parameters():
        q.grad.fill_(1e-3 * (t % 3))
    opt.step()
    t0 = time.perf_counter()
    sync.step()
    took = time.perf_counter() - t0
    if t in layer_starts:
        starts.append(took)
    elif t - 1 in layer_starts:  # tau 1
        merges.append(took)
n = args.width * args.width
print(f"{args.layers} fragments of {n / 1e6:.1f}M parameters, {args.codec}, {args.threads} threads: "
      f"start {statistics.median(starts):.3f} s, merge {statistics.median(merges):.3f} s (medians of "
      f"{len(starts)} and {len(merges)}): " + ", ".join(f"{t:.3f}" for pair in zip(starts, merges) for t in pair))
sync.close()
