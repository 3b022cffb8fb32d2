"""What a DiLoCo round costs loco with partial updates against without: 2 loco.torch members of
examples/llama.py's model as threads of this process (loco.inprocess), H = 2, inner steps that
only step the optimizer on made-up gradients (no forward or backward: the round is what is
timed), and the median seconds of sync.step() at the round's steps (rounds 2 to --rounds, the
first makes the buffers), for DiLoCo and then for each --slices, in one run. With
LOCO_TORCH_AS_DEVICE=1 the members take the path of a model on a GPU (their parameters copied
to the host for the round and back).

    PYTHONPATH=build/python python3 bench/partial_round.py --hidden 1024 --layers 4 --mlp 2816
"""
import argparse
import os
import statistics
import sys
import threading
import time

import torch

import loco
import loco.torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from llama import Llama  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--hidden", type=int, default=512)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--mlp", type=int, default=1408)
p.add_argument("--vocab", type=int, default=512)
p.add_argument("--slices", default="2", help="partial.slices to time after DiLoCo, e.g. 2 or 2,4 (members: the largest)")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--threads", type=int, default=1, help="loco's compute threads")
args = p.parse_args()
loco._loco.set_threads(args.threads)
torch.set_num_threads(1)
slices = [int(s) for s in args.slices.split(",")]
members = max(slices)


def member(n, endpoint, r, out):
    torch.manual_seed(r)
    model = Llama(args.vocab, d=args.hidden, layers=args.layers, heads=8, f=args.mlp)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sync = loco.torch.wrap(model, opt, "diloco", endpoint=endpoint, inner_steps=2,
                           **({"partial_slices": n} if n > 1 else {}))
    rounds = []
    for t in range(1, 2 * args.rounds + 1):
        for q in model.parameters():
            if q.requires_grad:
                q.grad = torch.full_like(q, 1e-3 * (t % 3))
        opt.step()
        t0 = time.perf_counter()
        sync.step()
        if t % 2 == 0 and t > 2:
            rounds.append(time.perf_counter() - t0)
    out[r] = rounds
    sync.close()


def rounds_of(n):
    endpoints = loco.inprocess(members)
    out = [None] * members
    threads = [threading.Thread(target=member, args=(n, endpoints[r], r, out)) for r in range(members)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return [max(o[i] for o in out) for i in range(len(out[0]))]  # a round ends with its slowest member


params = sum(q.numel() for q in Llama(args.vocab, d=args.hidden, layers=args.layers, heads=8, f=args.mlp).parameters())
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"{params / 1e6:.1f}M parameters, {members} members, {args.threads} loco threads, host CPU {cpu}, "
      f"LOCO_TORCH_AS_DEVICE={os.environ.get('LOCO_TORCH_AS_DEVICE', '0')}")
base = rounds_of(1)
print(f"diloco: round median {statistics.median(base):.3f} s ({' '.join(f'{x:.3f}' for x in base)})")
for n in slices:
    got = rounds_of(n)
    print(f"partial {n} slices: round median {statistics.median(got):.3f} s ({' '.join(f'{x:.3f}' for x in got)}), "
          f"{statistics.median(got) / statistics.median(base):.2f}x diloco's")
