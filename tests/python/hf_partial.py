"""A partial-updates run's model loads into Hugging Face's LlamaForCausalLM (issue 44, item 5).

Two in-process members train a small Hugging Face Llama (grouped-query attention, untied) with
DiLoCo where each trains 1/2 of the MLPs and 1/2 of the heads; after a round, member 0's model
(its projections rewritten by wrap()) is saved with save_pretrained and read back with
from_pretrained: the same keys, shapes and values as the outer parameters (eval_parameters), and
the same loss as the wrapped model on a batch. Needs transformers (not on the project's CI
machines: there it says so and exits 0); run by scripts/gpu-session.sh on the GPU machine, on
the device LOCO_TEST_DEVICE names (default cuda when there is one).
"""
import os
import sys
import tempfile

import torch

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    print("skipped: transformers is not installed")
    sys.exit(0)

import loco.torch
from harness import check, failures, run_members

dev = torch.device(os.environ.get("LOCO_TEST_DEVICE", "cuda" if torch.cuda.is_available() else "cpu"))
cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  tie_word_embeddings=False)
batch = torch.randint(0, cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(7)).to(dev)


def loss_of(model):
    with torch.no_grad():
        return model(input_ids=batch, labels=batch).loss.item()


def member(r, endpoint):
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sync = loco.torch.wrap(model, opt, "diloco", endpoint=endpoint, inner_steps=2, outer_lr=0.7,
                           outer_momentum=0.9, partial_slices=2, partial_strategy="mlp+heads")
    g = torch.Generator().manual_seed(10 + r)
    for _ in range(4):  # two rounds
        x = torch.randint(0, cfg.vocab_size, (2, 33), generator=g).to(dev)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync.step()
    outer = sync.eval_parameters()
    sliced = sum(1 for n, _ in model.named_parameters() if n.endswith("weight_slice"))
    sync.close()
    return model, outer, sliced


got = run_members(2, member)
model, outer, sliced = got[0]
check(sliced == cfg.num_hidden_layers * 6, f"wrap() sliced {sliced} projections (gate, up, down, q, k, v per layer)")
plain = LlamaForCausalLM(cfg).state_dict()
sd = model.state_dict()
check(list(sd) == list(plain) and all(sd[k].shape == plain[k].shape for k in sd),
      "the wrapped model's state_dict has Hugging Face's keys and shapes")
with tempfile.TemporaryDirectory() as d:
    model.save_pretrained(d)
    loaded = LlamaForCausalLM.from_pretrained(d).to(dev)
lsd = loaded.state_dict()
worst = max((lsd[n].float() - p.to(dev)).abs().max().item() for n, p in outer.items())
check(set(outer) <= set(lsd) and worst == 0,
      f"from_pretrained gives the outer parameters of the partial run (max diff {worst:.1e})")
a, b = loss_of(model), loss_of(loaded)
check(a == b, f"the loaded model's loss equals the wrapped model's ({b:.6f} vs {a:.6f})")
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
