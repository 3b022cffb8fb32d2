#!/usr/bin/python3
"""Independent PyTorch oracle for loco (test-only).

Builds the Llama of docs/model.md in torch (float64) from a loco checkpoint directory,
computes the mean loss over token windows and all parameter gradients, and compares them with
a gradient file written by `loco grad`; or runs torch.optim.AdamW steps and compares the
resulting parameters with a checkpoint written by loco. Exits non-zero on any mismatch.
"""
import argparse
import json
import math
import struct
import sys

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F64": np.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    meta = header.pop("__metadata__", {})
    data = raw[8 + hlen:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        arr = np.frombuffer(data[b:end], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.astype(np.float64))
    return out, meta


def read_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    assert raw[:8] == b"LOCOTOKS", "bad magic"
    version, width, vocab, count = struct.unpack("<IIQQ", raw[8:32])
    assert version == 1
    dt = {2: np.uint16, 4: np.uint32}[width]
    return np.frombuffer(raw[64:64 + count * width], dtype=dt).astype(np.int64), vocab


class Llama:
    def __init__(self, cfg, weights):
        self.cfg = cfg
        self.w = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
        self.d = cfg["hidden_size"]
        self.h = cfg["num_attention_heads"]
        self.hd = self.d // self.h
        self.kv = cfg.get("num_key_value_heads", self.h)
        self.eps = cfg["rms_norm_eps"]
        self.tied = cfg.get("tie_word_embeddings", False)
        self.qk_norm = cfg.get("qk_norm", False)
        self.z = cfg.get("loco_z_loss", 0.0)

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x, seq):
        half = self.hd // 2
        inv = 1.0 / (self.cfg["rope_theta"] ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
        ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1)
        sin = torch.cat([ang.sin(), ang.sin()], -1)
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def loss(self, inp, tgt):
        w = self.w
        B, S = inp.shape
        x = w["model.embed_tokens.weight"][inp]
        mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
        for l in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            a = self.rms(x, w[p + "input_layernorm.weight"])
            q = (a @ w[p + "self_attn.q_proj.weight"].T).view(B, S, self.h, self.hd)
            k = (a @ w[p + "self_attn.k_proj.weight"].T).view(B, S, self.kv, self.hd)
            v = (a @ w[p + "self_attn.v_proj.weight"].T).view(B, S, self.kv, self.hd)
            if self.qk_norm:
                q = self.rms(q, w[p + "self_attn.q_norm.weight"])
                k = self.rms(k, w[p + "self_attn.k_norm.weight"])
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            q, k = self.rope(q, S), self.rope(k, S)
            # Grouped-query attention as Hugging Face's Llama computes it: each key/value head
            # repeated for the h / kv query heads that read it.
            k, v = (t.repeat_interleave(self.h // self.kv, dim=1) for t in (k, v))
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.hd) + mask, -1) @ v
            att = att.transpose(1, 2).reshape(B, S, self.d)
            x = x + att @ w[p + "self_attn.o_proj.weight"].T
            m = self.rms(x, w[p + "post_attention_layernorm.weight"])
            g = m @ w[p + "mlp.gate_proj.weight"].T
            u = m @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
        x = self.rms(x, w["model.norm.weight"])
        head = w["model.embed_tokens.weight"] if self.tied else w["lm_head.weight"]
        logits = (x @ head.T).reshape(B * S, -1)
        lse = torch.logsumexp(logits, -1)
        ce = torch.nn.functional.cross_entropy(logits, tgt.reshape(-1))
        return ce + self.z * (lse ** 2).mean()


def windows(tokens, seq, first, count):
    inp = np.stack([tokens[(first + i) * seq:(first + i) * seq + seq] for i in range(count)])
    tgt = np.stack([tokens[(first + i) * seq + 1:(first + i) * seq + seq + 1] for i in range(count)])
    return torch.from_numpy(inp), torch.from_numpy(tgt)


def rel_diff(a, b):
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def compare(name_to_a, name_to_b, tol, what):
    bad = 0
    worst = 0.0
    if set(name_to_a) != set(name_to_b):
        print(f"FAIL {what}: tensor names differ: {sorted(set(name_to_a) ^ set(name_to_b))}")
        return 1
    for name in sorted(name_to_b):
        a, b = name_to_a[name], name_to_b[name]
        if tuple(a.shape) != tuple(b.shape):
            print(f"FAIL {what} {name}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
            bad += 1
            continue
        r = rel_diff(a, b)
        worst = max(worst, r)
        if not r <= tol:
            print(f"FAIL {what} {name}: relative max-abs diff {r:.3e} > {tol:.1e}")
            bad += 1
    print(f"{what}: {len(name_to_b)} tensors, worst relative max-abs diff {worst:.3e} (tolerance {tol:.0e})")
    return bad


def compare_loss(loco_loss, torch_loss, tol):
    lrel = abs(loco_loss - torch_loss) / abs(torch_loss)
    print(f"loss: loco {loco_loss:.8f} torch {torch_loss:.8f} relative diff {lrel:.3e}")
    if not lrel <= tol:
        print("FAIL loss")
        return 1
    return 0


def load_model(ckpt):
    cfg = json.load(open(ckpt + "/config.json"))
    weights, _ = read_safetensors(ckpt + "/model.safetensors")
    return cfg, weights


def cmd_grad(a):
    cfg, weights = load_model(a.checkpoint)
    tokens, _ = read_tokens(a.data)
    model = Llama(cfg, weights)
    inp, tgt = windows(tokens, a.seq_len, 0, a.windows)
    loss = model.loss(inp, tgt)
    loss.backward()
    loco_grads, meta = read_safetensors(a.grads)
    torch_grads = {k: v.grad for k, v in model.w.items()}
    bad = compare(loco_grads, torch_grads, a.tol, "gradients")
    return bad + compare_loss(float(meta["loss"]), loss.item(), a.tol)


def cmd_protocol_grad(a):
    """A protocol model's gradients (loco, through the compressed pipeline) against torch's on
    the materialised Llama: the embedding coordinates E_s get (dL/dE) U, the constrained o_proj
    and down_proj (blocks below constrained_end) U U^T dL/dW, every other tensor dL/dW."""
    cfg, weights = load_model(a.checkpoint)
    tokens, _ = read_tokens(a.data)
    model = Llama(cfg, weights)
    inp, tgt = windows(tokens, a.seq_len, 0, a.windows)
    loss = model.loss(inp, tgt)
    loss.backward()
    loco_grads, meta = read_safetensors(a.grads)
    U = loco_grads.pop("protocol.U")
    k = U.shape[1]
    eye = U.T @ U
    if not (eye - torch.eye(k, dtype=eye.dtype)).abs().max().item() < 1e-6:
        print("FAIL protocol.U is not orthonormal")
        return 1
    end = int(meta["constrained_end"])
    expected = {}
    for name, p in model.w.items():
        g = p.grad
        if name == "model.embed_tokens.weight":
            g = g @ U
        elif any(name == f"model.layers.{l}.{m}.weight" for l in range(end) for m in ("self_attn.o_proj", "mlp.down_proj")):
            g = U @ (U.T @ g)
        expected[name] = g
    bad = compare(loco_grads, expected, a.tol, "protocol gradients")
    return bad + compare_loss(float(meta["loss"]), loss.item(), a.tol)


def cmd_adamw(a):
    cfg, weights = load_model(a.checkpoint)
    tokens, _ = read_tokens(a.data)
    model = Llama(cfg, weights)
    decay, no_decay = [], []
    for name, p in model.w.items():
        (decay if p.dim() == 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    for step in range(a.steps):
        opt.zero_grad()
        inp, tgt = windows(tokens, a.seq_len, step * a.batch, a.batch)
        model.loss(inp, tgt).backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(list(model.w.values()), a.clip)
        opt.step()
    loco_after, _ = read_safetensors(a.result + "/model.safetensors")
    torch_after = {k: v.detach() for k, v in model.w.items()}
    bad = compare(loco_after, torch_after, a.tol, f"parameters after {a.steps} AdamW steps")
    # The update itself must also match, not only the (much larger) parameters.
    upd_loco = {k: loco_after[k] - weights[k] for k in weights}
    upd_torch = {k: torch_after[k] - weights[k] for k in weights}
    bad += compare(upd_loco, upd_torch, a.tol * 10, "parameter updates")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grad")
    g.add_argument("--checkpoint", required=True)
    g.add_argument("--data", required=True)
    g.add_argument("--seq-len", type=int, required=True)
    g.add_argument("--windows", type=int, required=True)
    g.add_argument("--grads", required=True)
    g.add_argument("--tol", type=float, default=1e-4)
    pg = sub.add_parser("protocol-grad")
    for opt in ("--checkpoint", "--data", "--grads"):
        pg.add_argument(opt, required=True)
    pg.add_argument("--seq-len", type=int, required=True)
    pg.add_argument("--windows", type=int, required=True)
    pg.add_argument("--tol", type=float, default=1e-4)
    o = sub.add_parser("adamw")
    o.add_argument("--checkpoint", required=True)
    o.add_argument("--result", required=True)
    o.add_argument("--data", required=True)
    o.add_argument("--seq-len", type=int, required=True)
    o.add_argument("--batch", type=int, required=True)
    o.add_argument("--steps", type=int, required=True)
    o.add_argument("--lr", type=float, required=True)
    o.add_argument("--weight-decay", type=float, required=True)
    o.add_argument("--beta1", type=float, default=0.9)
    o.add_argument("--beta2", type=float, default=0.95)
    o.add_argument("--eps", type=float, default=1e-8)
    o.add_argument("--clip", type=float, default=1.0)
    o.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    bad = {"grad": cmd_grad, "protocol-grad": cmd_protocol_grad, "adamw": cmd_adamw}[a.cmd](a)
    print("oracle: FAILED" if bad else "oracle: OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
