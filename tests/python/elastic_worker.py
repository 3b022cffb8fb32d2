"""One worker of an elastic run for test_elastic.py: the small torch Llama (llama_torch.py)
trained with loco.torch joined to redis://... (password and run secret from the environment).
Reads the batch of its data share: batch(slot, step). Writes OUT/NAME.pt: final parameters,
eval parameters, the inner optimizer's state, the step it started from, its first data share,
and the bytes copied between its model and loco's host buffers in each step.
  elastic_worker.py URL NAME SEED OUT METHOD STEPS [--die-after N] [--gate FILE:STEP] [--partial N]"""
import argparse
import os
import signal
import time

import torch

import loco
import loco.torch
from llama_torch import inner_step, make_model, make_opt, params_of

p = argparse.ArgumentParser()
for a in ("url", "name", "seed", "out", "method", "steps"):
    p.add_argument(a)
p.add_argument("--die-after", type=int, default=-1, help="SIGKILL itself after this many steps")
p.add_argument("--gate", default="", help="FILE:STEP: before step STEP, wait (at most 120 s) for FILE to exist")
p.add_argument("--min-workers", type=int, default=2)
p.add_argument("--heads", type=int, default=0, help="another head count (the same shapes)")
p.add_argument("--sgd", action="store_true", help="SGD with momentum as the inner optimizer")
p.add_argument("--partial", type=int, default=1, help="partial_slices (partial updates)")
a = p.parse_args()
torch.set_num_threads(1)
steps = int(a.steps)
loco.init(a.url, worker=a.name)
model = make_model(int(a.seed))
if a.heads:
    from llama import Llama
    from llama_torch import VOCAB
    torch.manual_seed(int(a.seed))
    model = Llama(VOCAB, d=32, layers=2, heads=a.heads, f=48)
opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9) if a.sgd else make_opt(model)
sync = loco.torch.wrap(model, opt, a.method, inner_steps=4, outer_lr=0.7, outer_momentum=0.9, train_steps=steps,
                       min_workers=a.min_workers, elastic_address="127.0.0.1", elastic_timeout="2s",
                       out_dir=a.out, **({"partial_slices": a.partial} if a.partial > 1 else {}))
started, share = sync.steps_done, sync.data_share
print(f"{a.name}: started at step {started}, data share {share}, device path {sync._on_device}", flush=True)
gate_file, gate_step = a.gate.rsplit(":", 1) if a.gate else ("", -1)
crossed = []  # (steps done after a step, bytes copied between the model and loco's buffers in it)
while sync.steps_done < steps:
    t = sync.steps_done
    if t == int(gate_step):
        deadline = time.time() + 120
        while not os.path.exists(gate_file):
            if time.time() > deadline:
                raise SystemExit(f"{a.name}: {gate_file} did not appear within 120 s")
            time.sleep(0.05)
    slot, _ = sync.data_share
    loss = inner_step(model, opt, slot, t)
    opt.step()
    opt.zero_grad()
    before = sync.metrics()["host_device_bytes"]
    sync.step(loss.item(), 64)
    crossed.append((sync.steps_done, sync.metrics()["host_device_bytes"] - before))
    if sync.steps_done == a.die_after:
        os.kill(os.getpid(), signal.SIGKILL)
sync.finish()
torch.save({"params": params_of(model), "eval": list(sync.eval_parameters().values()), "opt": opt.state_dict(),
            "started": started, "share": share, "steps": sync.steps_done, "crossed": crossed},
           os.path.join(a.out, a.name + ".pt"))
sync.close()
print(f"{a.name}: done", flush=True)
