#!/usr/bin/env bash
# citations.sh ROOT: the code cites pages a reader of the repository has. Fails on a comment that
# cites a specification file kept outside it ("spec 01-diloco.md", "spec 04"), and on a cited
# docs/ page that does not exist.
set -euo pipefail
root=$1
cd "$root"
dirs=(src python tests scripts bench examples)
status=0
pattern='spec 0[0-9]|[0-9][0-9]-(system|diloco|streaming|partial|noloco|protocol|simulator)\.md'
if hits=$(grep -rEn "$pattern" "${dirs[@]}" --include=*.cpp --include=*.h --include=*.py --include=*.sh |
          grep -v '^tests/docs/citations.sh:'); then
  echo "FAIL: citations of specification files outside the repository (cite a page under docs/):"
  echo "$hits"
  status=1
fi
cited=$(grep -rhoE 'docs/[A-Za-z0-9_./-]+\.md' "${dirs[@]}" --include=*.cpp --include=*.h --include=*.py --include=*.sh |
        sort -u)
for page in $cited; do
  if [ ! -f "$page" ]; then
    echo "FAIL: $page is cited and does not exist"
    status=1
  fi
done
[ $status -eq 0 ] && echo "docs.citations: OK ($(echo "$cited" | wc -l) pages cited, all present)"
exit $status
