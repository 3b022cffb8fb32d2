"""A plain PyTorch training loop on Brown; the lines marked `# loco` add one of loco's methods
(without them it is an ordinary single-process loop). Each process is one replica.

  scripts/brown-data.sh                  # data/brown/tok4k: Brown tokenized by loco data prepare
  mpirun -np 2 python3 examples/torch_train.py --method diloco --out runs/torch-diloco
  build/loco report runs/torch-diloco    # the run's page: loss, bytes, waits, per member

With --device cuda each process trains on its own GPU (its local rank's under mpirun, bf16
autocast); its model need not be on the current device: no torch.cuda.set_device is needed.
"""
import argparse
import math
import os

import numpy as np
import torch

import loco.torch  # loco
from llama import Llama

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--data", default="data/brown/tok4k", help="directory with train.tok and val.tok")
p.add_argument("--method", default="diloco", choices=["ddp", "diloco", "streaming", "noloco"])
p.add_argument("--steps", type=int, default=300)
p.add_argument("--batch", type=int, default=8, help="sequences per replica and step")
p.add_argument("--seq", type=int, default=128)
p.add_argument("--lr", type=float, default=2e-3)
p.add_argument("--inner-steps", type=int, default=30, help="H: inner steps per round (not ddp)")
p.add_argument("--out", default="runs/torch-train", help="run directory (loco report reads it)")
p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: this process's GPU")
args = p.parse_args()


def read_tokens(path):
    """A LOCOTOKS file (docs/formats.md): 64-byte header, then 2- or 4-byte token ids."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw[:8].tobytes() != b"LOCOTOKS":
        raise SystemExit(f"{path}: not a loco token file")
    width, vocab, count = int(raw[12:16].view(np.uint32)[0]), int(raw[16:24].view(np.uint64)[0]), int(raw[24:32].view(np.uint64)[0])
    ids = raw[64:64 + count * width].view(np.uint16 if width == 2 else np.uint32)
    return torch.from_numpy(ids.astype(np.int64)), vocab


torch.manual_seed(0)
rank, size = 0, 1
rank, size = loco.init().rank, loco.world_size()  # loco
train, vocab = read_tokens(f"{args.data}/train.tok")
val, _ = read_tokens(f"{args.data}/val.tok")
local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
dev = torch.device("cuda", local % torch.cuda.device_count()) if args.device == "cuda" else torch.device("cpu")
model = Llama(vocab, d=128, layers=4, heads=4, f=344).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
warmup = max(1, args.steps // 20)
schedule = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: min((s + 1) / warmup, 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
sync = loco.torch.wrap(model, opt, args.method, inner_steps=args.inner_steps, train_steps=args.steps, out_dir=args.out)  # loco


def batch(step):
    """This replica's windows of step `step` (replicas draw different ones)."""
    g = torch.Generator().manual_seed(step * size + rank)
    starts = torch.randint(0, len(train) - args.seq - 1, (args.batch,), generator=g)
    w = torch.stack([train[s:s + args.seq + 1] for s in starts]).to(dev)
    return w[:, :-1], w[:, 1:]


for step in range(args.steps):
    x, y = batch(step)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        loss = model.loss(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    schedule.step()
    sync.step(loss.item(), x.numel())  # loco
    if rank == 0 and (step + 1) % 50 == 0:
        print(f"step {step + 1}: train loss {loss.item():.4f}", flush=True)

model.load_state_dict(sync.eval_parameters(), strict=False)  # loco
with torch.no_grad():
    n = min(32, (len(val) - 1) // args.seq)
    w = val[: n * args.seq + 1].to(dev)
    val_loss = model.loss(w[:-1].view(n, args.seq), w[1:].view(n, args.seq)).item()
if rank == 0:
    print(f"validation loss {val_loss:.4f}")
sync.finish(val_loss)  # loco
