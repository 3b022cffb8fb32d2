"""What one DiLoCo round costs loco on the host: a loco.torch model on the CPU (its parameters are
loco's buffers) of square nn.Linear layers, one member (no peer to wait for), H = 1, so that each
step is a round: the norms, the outer step and the replicas' restart from the outer parameters.
Prints each round's seconds and their median (the first round excluded).

    PYTHONPATH=build/python python3 bench/diloco_round.py --width 4096 --layers 12 --threads 2
"""
import argparse
import statistics
import time

import torch

import loco
import loco.torch

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--width", type=int, default=4096, help="each layer is width x width")
p.add_argument("--layers", type=int, default=12)
p.add_argument("--threads", type=int, default=2, help="loco's compute threads")
p.add_argument("--rounds", type=int, default=6)
args = p.parse_args()
loco._loco.set_threads(args.threads)
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
sync = loco.torch.wrap(model, opt, "diloco", endpoint=loco.inprocess(1)[0], inner_steps=1)
times = []
for _ in range(args.rounds):
    for q in model.parameters():
        q.grad = torch.zeros_like(q)
    opt.step()
    t0 = time.perf_counter()
    sync.step()
    times.append(time.perf_counter() - t0)
n = sum(q.numel() for q in model.parameters())
print(f"{n / 1e6:.0f}M parameters, {args.threads} threads; a round (s): " + " ".join(f"{t:.3f}" for t in times) +
      f"; median {statistics.median(times[1:]):.3f}")
sync.close()
