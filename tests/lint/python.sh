#!/bin/bash
# pyflakes over every Python file of the repository: an undefined name or a misspelt variable on
# an error path that no test takes is found here, not by the user who takes it; unused imports
# and variables, and f-strings without placeholders, are kept out too.
# Usage: python.sh SOURCE_DIR
set -euo pipefail
cd "$1"
mapfile -t files < <(find bench examples python scripts tests setup.py -name '*.py' -not -path '*/__pycache__/*' | sort)
[ ${#files[@]} -ge 40 ] || { echo "FAIL: found only ${#files[@]} Python files under $1"; exit 1; }
/usr/bin/python3 -m pyflakes "${files[@]}"
echo "pyflakes: ${#files[@]} files, nothing found"
