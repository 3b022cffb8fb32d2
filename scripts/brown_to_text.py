#!/usr/bin/env python3
"""Strips the part-of-speech tags from the Brown corpus (word/tag tokens, one sentence per line)
and writes one plain-text file per Brown text: brown_to_text.py BROWN_DIR OUT_DIR."""
import os
import re
import sys

src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
names = sorted(n for n in os.listdir(src) if re.fullmatch(r"c[a-r]\d\d", n))
if not names:
    sys.exit(f"brown_to_text: no Brown texts (ca01 ...) in {src}")
words = 0
for name in names:
    out_lines = []
    with open(os.path.join(src, name), encoding="ascii", errors="strict") as f:
        for line in f:
            toks = line.split()
            if not toks:
                if out_lines and out_lines[-1] != "":
                    out_lines.append("")  # paragraph break
                continue
            ws = [t.rsplit("/", 1)[0] for t in toks]
            words += len(ws)
            s = " ".join(ws)
            s = s.replace("`` ", '"').replace(" ''", '"').replace("``", '"').replace("''", '"')
            s = re.sub(r" ([.,;:?!)\]])", r"\1", s)
            s = re.sub(r"([(\[]) ", r"\1", s)
            out_lines.append(s)
    with open(os.path.join(dst, name + ".txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(out_lines).strip() + "\n")
print(f"brown: {len(names)} texts, {words} words -> {dst}")
