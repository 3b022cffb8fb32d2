#!/usr/bin/python3
"""Times a full training step (forward, backward, AdamW) of the same Llama in PyTorch (idiomatic
nn.Module code; float32, or with torch.autocast("cpu", torch.bfloat16) as a PyTorch user on a CPU
with bf16 instructions runs it) for bench/run.sh:
torch_step.py D LAYERS HEADS FFN VOCAB SEQ BATCH THREADS ITERS [fp32|bf16]."""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w


class Block(nn.Module):
    def __init__(self, d, h, f):
        super().__init__()
        self.h, self.hd = h, d // h
        self.ln1, self.ln2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, S, d = x.shape
        a = self.ln1(x)
        q, k, v = (t(a).view(B, S, self.h, self.hd).transpose(1, 2) for t in (self.q, self.k, self.v))
        half = self.hd // 2
        rot = lambda t: torch.cat([-t[..., half:], t[..., :half]], -1)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.hd) + mask, -1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(B, S, d))
        m = self.ln2(x)
        return x + self.down(F.silu(self.gate(m)) * self.up(m))


class Llama(nn.Module):
    def __init__(self, d, L, h, f, V, S):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.blocks = nn.ModuleList(Block(d, h, f) for _ in range(L))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, V, bias=False)
        hd = d // h
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.arange(S).float()[:, None] * inv[None]
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1))
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1))
        self.register_buffer("mask", torch.full((S, S), float("-inf")).triu(1))

    def forward(self, idx, tgt):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin, self.mask)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1))


def main():
    d, L, h, f, V, S, B, threads, iters = map(int, sys.argv[1:10])
    bf16 = len(sys.argv) > 10 and sys.argv[10] == "bf16"
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Llama(d, L, h, f, V, S)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    idx = torch.randint(0, V, (B, S))
    tgt = torch.randint(0, V, (B, S))

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()
    best, total = 1e30, 0.0
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        s = time.perf_counter() - t0
        best, total = min(best, s), total + s
    print(f"torch_step_seconds {best:.6f}")
    print(f"torch_step_mean_seconds {total / iters:.6f}")


if __name__ == "__main__":
    main()
