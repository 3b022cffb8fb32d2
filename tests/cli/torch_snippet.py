#!/usr/bin/python3
"""docs/formats.md's PyTorch snippet, run as written: it loads a checkpoint (QK-norm, tied
embeddings) and a run directory's latest checkpoint into float32 tensors equal to the oracle's
reader's, under every name the config implies and no other; the QK-norm model's config.json
says Qwen3ForCausalLM, a plain one LlamaForCausalLM.
Usage: torch_snippet.py LOCO WORK_DIR"""
import os, re, shutil, subprocess, sys

loco, work = os.path.abspath(sys.argv[1]), sys.argv[2]
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
sys.path.insert(0, os.path.join(root, "tests", "oracle"))
from llama_oracle import read_safetensors  # noqa: E402

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.chdir(work)
doc = open(os.path.join(root, "docs", "formats.md")).read()
m = re.search(r"<!-- torch-snippet -->\n```python\n(.*?)```\n<!-- /torch-snippet -->", doc, re.S)
if not m:
    sys.exit("FAIL: docs/formats.md has no torch-snippet block")
ns = {}
exec(compile(m.group(1), "docs/formats.md (torch-snippet)", "exec"), ns)
load = ns["load_loco_checkpoint"]


def expected_names(cfg):
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg["tie_word_embeddings"]:
        names.add("lm_head.weight")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names |= {p + f"self_attn.{x}_proj.weight" for x in "qkvo"}
        names |= {p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        if cfg.get("qk_norm"):
            names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
    return names


def check(path, ckpt, arch):
    state, cfg = load(path)
    ref, _ = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    if cfg["architectures"] != [arch]:
        sys.exit(f"FAIL: {ckpt}/config.json says {cfg['architectures']}, expected [{arch!r}]")
    if set(state) != expected_names(cfg) or set(state) != set(ref):
        sys.exit(f"FAIL: {path}: names {sorted(set(state) ^ expected_names(cfg))} differ from the config's")
    for name, t in state.items():
        if str(t.dtype) != "torch.float32" or not (t.double() == ref[name]).all():
            sys.exit(f"FAIL: {path}: {name} differs from the oracle reader's")
    return len(state)


open("qk.toml", "w").write("[model]\nvocab_size = 64\nhidden_size = 16\nnum_layers = 2\nnum_heads = 2\n"
                           "intermediate_size = 24\nmax_seq_len = 16\nqk_norm = true\ntie_embeddings = true\n")
subprocess.run([loco, "init", "--config", "qk.toml", "--seed", "3", "--out", "qk"], check=True, stdout=subprocess.DEVNULL)
n = check("qk", "qk", "Qwen3ForCausalLM")
subprocess.run([sys.executable, os.path.join(root, "tests", "tools", "make_tokens.py"), "t.tok", "256", "4000", "1"],
               check=True)
subprocess.run([loco, "train", "--config", os.path.join(root, "configs", "tiny.toml"), "--set", "data.train=t.tok",
                "--set", "train.steps=10", "--set", "train.checkpoint_interval=5", "--set", "train.out_dir=run",
                "--quiet"], check=True, stdout=subprocess.DEVNULL)
m2 = check("run", "run/checkpoints/step_00000010", "LlamaForCausalLM")
print(f"torch snippet: {n} tensors of a QK-norm tied checkpoint and {m2} of a run's latest equal the oracle's")
