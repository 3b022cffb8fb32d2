#!/usr/bin/env bash
# mpirun's remote-shell agent for scripts/netlab.sh: "HOST COMMAND..." runs COMMAND (as ssh
# would, through a shell) inside the lab namespace of HOST, an address 10.77.0.(i+1) of host i.
set -euo pipefail
while [[ "${1:-}" == -* ]]; do shift; done  # options meant for ssh
host=$1
shift
case $host in
  10.77.0.*) i=$((${host##*.} - 1)) ;;
  *) echo "netlab-rsh: unknown lab host $host" >&2; exit 255 ;;
esac
# Every host has a temporary directory of its own: all hosts share this machine's name and /tmp,
# and Open MPI's daemons, which keep a session directory under TMPDIR named after the host,
# failed now and then creating it at the same moment (mkdir error in orte_init).
tmp=${NETLAB_STATE_DIR:?set by netlab.sh}/tmp-$i
mkdir -p "$tmp"
exec ip netns exec "loco-h$i" env TMPDIR="$tmp" /bin/sh -c "$*"
