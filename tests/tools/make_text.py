#!/usr/bin/env python3
"""Writes deterministic pseudo-English documents for tests: make_text.py DIR DOCS LINES SEED
(DIR/doc0.txt ... each of LINES sentences of 4-12 words from a small vocabulary)."""
import os
import random
import sys

out, docs, lines, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = random.Random(seed)
words = "the a cat dog sat ran on under mat log and but quickly slowly red blue".split()
os.makedirs(out, exist_ok=True)
for d in range(docs):
    with open(os.path.join(out, f"doc{d}.txt"), "w") as f:
        for _ in range(lines):
            f.write(" ".join(r.choice(words) for _ in range(r.randint(4, 12))).capitalize() + ".\n")
