"""A Llama-style decoder in plain PyTorch (RMSNorm, RoPE, causal attention, SwiGLU; no biases,
untied head), the layout of loco's own model. Used by examples/torch_train.py and the Python
layer's tests."""
import math

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


def rope(x, theta=10000.0):
    """Rotary position embedding of x (batch, heads, seq, head_dim), halves rotated."""
    S, hd = x.shape[-2], x.shape[-1]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd)
    ang = torch.arange(S, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin


class Block(nn.Module):
    def __init__(self, d, heads, f):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.input_layernorm = RMSNorm(d)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj, self.up_proj = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        B, S, d = x.shape
        a = self.input_layernorm(x)
        q, k, v = (p(a).view(B, S, self.heads, self.hd).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rope(q), rope(k)
        mask = torch.full((S, S), float("-inf"), device=x.device).triu(1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.hd) + mask, -1) @ v
        x = x + self.o_proj(att.transpose(1, 2).reshape(B, S, d))
        m = self.post_attention_layernorm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(m)) * self.up_proj(m))


class Llama(nn.Module):
    def __init__(self, vocab, d=256, layers=6, heads=8, f=688):
        super().__init__()
        self.vocab = vocab
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, heads, f) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def loss(self, x, y):
        h = self.embed_tokens(x)
        for b in self.layers:
            h = b(h)
        return nn.functional.cross_entropy(self.lm_head(self.norm(h)).reshape(-1, self.vocab), y.reshape(-1))
