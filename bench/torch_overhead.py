"""What loco.torch adds to a PyTorch step: the same loop (examples/llama.py's model, AdamW) timed
plain and wrapped, alternating in one process, one member (no peer to wait for), so the
difference is loco's hooks and, every H steps, its outer step.

  PYTHONPATH=build/python:examples python3 bench/torch_overhead.py [--steps 60 --rounds 3]
"""
import argparse
import time

import torch

import loco
import loco.torch
from llama import Llama

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--d", type=int, default=128)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=128)
p.add_argument("--vocab", type=int, default=4096)
args = p.parse_args()
torch.set_num_threads(2)


def run(method):
    torch.manual_seed(0)
    model = Llama(args.vocab, d=args.d, layers=args.layers, heads=4, f=int(args.d * 2.6875))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sync = None
    if method:
        extra = {} if method == "ddp" else {"inner_steps": 30}
        sync = loco.torch.wrap(model, opt, method, endpoint=loco.inprocess(1)[0], **extra)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, args.vocab, (args.steps, args.batch, args.seq + 1), generator=g)
    start = time.perf_counter()
    for t in range(args.steps):
        loss = model.loss(data[t, :, :-1], data[t, :, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sync:
            sync.step()
    seconds = (time.perf_counter() - start) / args.steps
    if sync:
        sync.close()
    return seconds


params = sum(p.numel() for p in Llama(args.vocab, d=args.d, layers=args.layers, heads=4,
                                      f=int(args.d * 2.6875)).parameters())
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu}, torch {torch.__version__}, 2 threads, "
      f"{params / 1e6:.2f}M parameters, batch {args.batch} x {args.seq}, {args.steps} steps per timing")
best = {}
for r in range(args.rounds):
    for method in (None, "ddp", "diloco", "streaming"):
        s = run(method)
        best[method] = min(best.get(method, s), s)
        print(f"round {r + 1}: {method or 'plain torch'}: {s * 1e3:.1f} ms/step", flush=True)
for method in ("ddp", "diloco", "streaming"):
    print(f"{method}: {best[method] * 1e3:.1f} ms/step, {best[method] / best[None]:.3f}x plain torch "
          f"({best[None] * 1e3:.1f} ms/step), best of {args.rounds}")
