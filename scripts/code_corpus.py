#!/usr/bin/env python3
"""Copies the kernel's C sources that the parity study trains on (scripts/code-data.sh) from an
extracted tree SRC to DST: .c and .h files outside drivers/gpu and tools/, skipping files that
are not valid UTF-8 (a few carry Latin-1 names) and empty files. Prints what it kept."""
import os
import sys

EXCLUDED = ("drivers/gpu/", "tools/")


def main():
    src, dst = sys.argv[1], sys.argv[2]
    kept = skipped = size = 0
    for root, dirs, files in os.walk(src):
        dirs.sort()
        rel_root = os.path.relpath(root, src)
        for name in sorted(files):
            rel = os.path.normpath(os.path.join(rel_root, name))
            if not name.endswith((".c", ".h")) or rel.startswith(EXCLUDED) or name.startswith("."):
                continue
            with open(os.path.join(root, name), "rb") as f:
                data = f.read()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                skipped += 1
                continue
            if not data.strip():
                continue
            out = os.path.join(dst, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(data)
            kept += 1
            size += len(data)
    print(f"code corpus: {kept} files, {size / 1e6:.0f} MB kept in {dst}; {skipped} not valid UTF-8 skipped")


if __name__ == "__main__":
    main()
