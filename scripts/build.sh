#!/usr/bin/env bash
# Installs the build dependencies (Debian 12) and builds Release into build/ (program build/loco,
# Python package build/python/loco). As root it also points Debian's python3 at that package (a
# loco.pth file in /usr/local/lib/python3.X/dist-packages), so that `import loco` works.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
loco_install build
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$(nproc)"
if [ "$(id -u)" -eq 0 ] && [ -d build/python/loco ]; then
  site=$(/usr/bin/python3 -c 'import sys; print(f"/usr/local/lib/python3.{sys.version_info.minor}/dist-packages")')
  mkdir -p "$site"
  echo "$PWD/build/python" > "$site/loco.pth"
fi
