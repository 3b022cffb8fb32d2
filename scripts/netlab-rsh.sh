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
exec ip netns exec "loco-h$i" /bin/sh -c "$*"
