#!/usr/bin/env bash
# The Python package without the CPU engine (what setup.py builds, docs/python.md): configures
# the checkout with -DLOCO_ENGINE=OFF into $2, builds the extension, and checks that the build
# made neither the engine's library nor the program, that the extension loads none of the
# engine's libraries, and that loco.torch imports (Python loads extensions with RTLD_NOW, so a
# symbol the methods' library lacks fails here) and runs a DiLoCo round of two members.
set -euo pipefail
src=$1 out=$2
rm -rf "$out"
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DLOCO_ENGINE=OFF > "$out.configure.log" 2>&1 ||
  { tail -20 "$out.configure.log"; exit 1; }
cmake --build "$out" --target loco_python -j 2 > "$out.build.log" 2>&1 || { tail -40 "$out.build.log"; exit 1; }
[ -f "$out/libloco.a" ] || { echo "FAIL: no libloco.a"; exit 1; }
if [ -e "$out/libloco_engine.a" ] || [ -e "$out/loco" ]; then echo "FAIL: the engine was built"; exit 1; fi
ext=$(ls "$out"/python/loco/_loco*.so)
if ldd "$ext" | grep -E 'openblas|dnnl|sentencepiece|gomp'; then echo "FAIL: the extension loads the engine's libraries"; exit 1; fi
cp "$src"/python/loco/*.py "$out/python/loco/"
PYTHONPATH=$out/python /usr/bin/python3 - <<'PY'
import threading
import torch
import loco, loco.torch

world = loco.inprocess(2)
losses = []

def member(rank):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sync = loco.torch.wrap(model, opt, method="diloco", endpoint=world[rank], inner_steps=4)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(8):
        x = torch.randn(16, 8, generator=gen)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sync.step()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    sync.close()
    losses.append((rank, params))

threads = [threading.Thread(target=member, args=(r,)) for r in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
assert len(losses) == 2, "a member failed"
a, b = (p for _, p in sorted(losses, key=lambda x: x[0]))
assert torch.equal(a, b), "the members differ after a DiLoCo round"
print("engineless: loco.torch imported and two members ended a DiLoCo round with equal parameters")
PY
echo "engineless: ok ($(ldd "$ext" | wc -l) shared libraries)"
