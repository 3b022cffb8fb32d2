"""params_close.py A B TOL: exit 0 if every tensor of safetensors file B agrees with A to TOL
(max-abs-diff / max-abs per tensor); prints the worst relative difference."""
import json
import struct
import sys

import numpy as np


def load(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype=np.float32)
            for k, v in header.items()}


a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
worst = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(b[k]).max(), 1e-12)) for k in b)
print(f"worst relative difference {worst:.2e}")
sys.exit(0 if worst <= tol else 1)
