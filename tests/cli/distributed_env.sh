# Sourced by the distributed CLI tests (after `set -euo pipefail`), with $1 = loco, $2 = work
# directory: sets loco, work, here, root and py, allows mpirun as root and oversubscribed, and
# enters a fresh work directory holding generated train.tok and val.tok.
loco=$1 work=$2
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
root=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$work" && mkdir -p "$work" && cd "$work"
$py "$here/../tools/make_tokens.py" train.tok 256 20000 5
$py "$here/../tools/make_tokens.py" val.tok 256 3000 6
