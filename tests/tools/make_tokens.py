#!/usr/bin/python3
"""Writes a small LOCOTOKS file of seeded pseudo-random tokens: make_tokens.py OUT VOCAB COUNT SEED."""
import random
import struct
import sys

out, vocab, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
# A little structure (repeated bigrams) so that training has something to learn.
tokens = []
while len(tokens) < count:
    a = rng.randrange(vocab)
    tokens += [a, (a * 7 + 3) % vocab] if rng.random() < 0.5 else [a]
tokens = tokens[:count]
width = 2 if vocab <= 65536 else 4
header = b"LOCOTOKS" + struct.pack("<IIQQ", 1, width, vocab, count)
header += b"\0" * (64 - len(header))
with open(out, "wb") as f:
    f.write(header + struct.pack("<%d%s" % (count, "H" if width == 2 else "I"), *tokens))
