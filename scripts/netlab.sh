#!/usr/bin/env bash
# A real slow network on one machine: N lab hosts, each a network namespace (loco-h0 ...) with
# one TAP link to a bridge in a hub namespace (loco-hub). Each host's outgoing traffic is
# shaped by a tbf qdisc to RATE and then held for DELAY by tools/netlab_delay.cpp (this kernel
# has no netem), so every path between two hosts crosses one shaped, delayed hop: the link model
# of loco (an outgoing link per worker, a one-way latency). Addresses 10.77.0.0/24 exist only
# inside these namespaces; nothing leaves the machine. Needs root.
#
#   netlab.sh up N RATE [DELAY]          make the lab (RATE: tc rate, e.g. 100mbit, 1gbit; DELAY: e.g. 30ms)
#   netlab.sh run N RATE [DELAY] -- CMD  make it, run `mpirun -np N CMD` with one rank per host, remove it
#   netlab.sh shape RATE                 change every host's rate
#   netlab.sh stats                      bytes and packets each host's shaped link sent
#   netlab.sh down                       remove everything the lab made
#
# `run` removes the lab however CMD ends (failure, Ctrl-C, kill). Environment: NETLAB_DELAY_BIN
# (default build/netlab-delay), NETLAB_OFFLOAD=0 (the helper copies single Ethernet frames instead
# of 64 KB TCP segments; see tools/netlab_delay.cpp), NETLAB_MPI_ARGS (extra mpirun arguments),
# NETLAB_CC (the hosts' TCP congestion control, default cubic: Linux's default, set explicitly
# because a machine may use another, as this project's did, bbr).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
state=/run/loco-netlab
hub=loco-hub
subnet=10.77.0
delay_bin=${NETLAB_DELAY_BIN:-$root/build/netlab-delay}
delay_opts=()
# The hosts' TCP congestion control: Linux's default whatever this machine uses (the link model's
# TCP mode follows the restart after idle that CUBIC does and BBR does not).
cc=${NETLAB_CC:-cubic}
[ "${NETLAB_OFFLOAD:-1}" != 0 ] || delay_opts=(--no-offload)

die() { echo "netlab: $*" >&2; exit 1; }
no_cc() { die "TCP congestion control '$cc' is not available here (see net.ipv4.tcp_available_congestion_control)"; }
host_ns() { echo "loco-h$1"; }
host_ip() { echo "$subnet.$(($1 + 1))"; }

require_namespaces() {
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, TAP devices and qdiscs)"
  # shellcheck source=deps.sh
  source "$here/deps.sh"
  loco_install netlab
  local probe=loco-probe-$$
  if ! ip netns add "$probe" 2> /dev/null; then
    die "network namespaces are not allowed here (ip netns add failed: a container without CAP_SYS_ADMIN?)"
  fi
  ip netns del "$probe"
  [ -c /dev/net/tun ] || die "no /dev/net/tun: TAP devices are not available here"
}

# tbf for RATE: a burst of at least 10 full frames or 2 ms at the rate, a 50 ms queue.
shape_host() {  # index rate
  local ns bytes burst
  ns=$(host_ns "$1")
  bytes=$(rate_bytes "$2")
  burst=$((bytes / 500))
  [ "$burst" -ge 15140 ] || burst=15140
  ip netns exec "$ns" tc qdisc replace dev lab0 root tbf rate "$2" burst "$burst" latency 50ms ||
    die "tc rejected rate $2"
}

# Bytes per second of a tc rate (100mbit, 1gbit, 500kbit, 12mbps ...).
rate_bytes() {
  local r=${1,,} n unit
  n=${r%%[a-z]*}
  unit=${r#"$n"}
  [[ "$n" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "bad rate '$1' (e.g. 100mbit, 1gbit)"
  case $unit in
    bit) awk -v n="$n" 'BEGIN { printf "%d", n / 8 }' ;;
    kbit) awk -v n="$n" 'BEGIN { printf "%d", n * 125 }' ;;
    mbit) awk -v n="$n" 'BEGIN { printf "%d", n * 125000 }' ;;
    gbit) awk -v n="$n" 'BEGIN { printf "%d", n * 125000000 }' ;;
    bps) awk -v n="$n" 'BEGIN { printf "%d", n }' ;;
    kbps) awk -v n="$n" 'BEGIN { printf "%d", n * 1000 }' ;;
    mbps) awk -v n="$n" 'BEGIN { printf "%d", n * 1000000 }' ;;
    *) die "bad rate '$1' (units: bit, kbit, mbit, gbit, bps, kbps, mbps)" ;;
  esac
}

delay_ms() {  # 30ms, 0.5s, 0 -> milliseconds
  local d=${1:-0}
  case $d in
    *ms) d=${d%ms} ;;
    *us) d=$(awk -v n="${d%us}" 'BEGIN { print n / 1000 }') ;;
    *s) d=$(awk -v n="${d%s}" 'BEGIN { print n * 1000 }') ;;
  esac
  [[ "$d" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "bad delay '$1' (e.g. 30ms)"
  echo "$d"
}

lab_namespaces() { ip netns list 2> /dev/null | awk '{print $1}' | grep -E '^loco-(hub|h[0-9]+)$' || true; }

# Stops every process still inside a lab namespace (ranks, orted, mpirun), the delay helpers,
# then removes the namespaces (with them the devices and qdiscs).
cmd_down() {
  local ns pids sig
  for sig in TERM KILL; do
    pids=""
    for ns in $(lab_namespaces); do pids+=" $(ip netns pids "$ns" 2> /dev/null | tr '\n' ' ')"; done
    [ -f "$state/pids" ] && pids+=" $(tr '\n' ' ' < "$state/pids")"
    # shellcheck disable=SC2086
    [ -n "${pids// /}" ] && kill -s "$sig" $pids 2> /dev/null || true
    [ "$sig" = TERM ] && [ -n "${pids// /}" ] && sleep 0.5
  done
  for ns in $(lab_namespaces); do ip netns del "$ns" 2> /dev/null || true; done
  if [ -f "$state/allowed_cc" ]; then
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$(cat "$state/allowed_cc")" > /dev/null || true
  fi
  rm -rf "$state"
}

cmd_up() {
  local n=${1:-} rate=${2:-} delay=${3:-0ms} ms i ns
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "usage: netlab.sh up N RATE [DELAY] (1 <= N <= 200)"
  [ -n "$rate" ] || die "usage: netlab.sh up N RATE [DELAY]"
  rate_bytes "$rate" > /dev/null
  ms=$(delay_ms "$delay")
  [ -x "$delay_bin" ] || die "$delay_bin is missing (build it: scripts/build.sh)"
  require_namespaces
  # Claiming the state directory is atomic: of two concurrent `up`s or `run`s one fails here,
  # before it touches anything, and only the one that made the lab removes it on failure.
  mkdir -p "$(dirname "$state")"
  mkdir "$state" 2> /dev/null || die "a lab is already up ($state): netlab.sh down first"
  trap 'cmd_down' EXIT
  echo "$n $rate $delay" > "$state/config"
  # A namespace may only choose a congestion control the machine allows; add ours for the lab's
  # lifetime (cmd_down restores the list).
  local allowed
  allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
  if [[ " $allowed " != *" $cc "* ]]; then
    echo "$allowed" > "$state/allowed_cc"
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$allowed $cc" > /dev/null 2>&1 || no_cc
  fi
  : > "$state/pids"
  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add labbr type bridge
  ip -n "$hub" addr add "$subnet.254/24" dev labbr
  ip -n "$hub" link set labbr up
  for ((i = 0; i < n; i++)); do
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_congestion_control="$cc" > /dev/null 2>&1 || no_cc
    ip -n "$ns" tuntap add dev lab0 mode tap
    ip -n "$ns" addr add "$(host_ip "$i")/24" dev lab0
    ip -n "$ns" link set lab0 up
    ip -n "$hub" tuntap add dev "tap$i" mode tap
    ip -n "$hub" link set "tap$i" master labbr
    ip -n "$hub" link set "tap$i" up
    shape_host "$i" "$rate"
    "$delay_bin" "${delay_opts[@]}" "$ns" lab0 "$hub" "tap$i" "$ms" 2> "$state/delay-$i.log" &
    echo $! >> "$state/pids"
  done
  # Every host reaches every other (and the hub) before anyone uses the lab.
  for ((i = 0; i < n; i++)); do
    local ok=0
    for _ in $(seq 1 50); do
      if ip netns exec "$(host_ns "$i")" ping -c 1 -W 1 "$subnet.254" > /dev/null 2>&1; then ok=1; break; fi
      sleep 0.1
    done
    [ "$ok" -eq 1 ] || die "host $i cannot reach the hub (see $state/delay-$i.log)"
  done
  echo "netlab: $n hosts $(host_ip 0)..$(host_ip $((n - 1))) (namespaces loco-h0..loco-h$((n - 1))), each sending at $rate with a one-way delay of ${ms} ms, TCP $cc"
}

cmd_shape() {
  [ -f "$state/config" ] || die "no lab is up"
  local n rate delay i
  read -r n rate delay < "$state/config"
  [ -n "${1:-}" ] || die "usage: netlab.sh shape RATE"
  rate_bytes "$1" > /dev/null
  for ((i = 0; i < n; i++)); do shape_host "$i" "$1"; done
  echo "$n $1 $delay" > "$state/config"
}

cmd_stats() {
  [ -f "$state/config" ] || die "no lab is up"
  local n i
  read -r n _ _ < "$state/config"
  for ((i = 0; i < n; i++)); do
    ip netns exec "$(host_ns "$i")" tc -s qdisc show dev lab0 |
      awk -v h="$i" '/Sent/ { printf "host %d sent %d bytes %d packets\n", h, $2, $4 }'
  done
}

# Stops mpirun (pid $1, if any): TERM, up to 10 s for it to end, then KILL.
stop_mpi() {
  [ -n "${1:-}" ] || return 0
  kill -TERM "$1" 2> /dev/null || true
  for _ in $(seq 1 100); do kill -0 "$1" 2> /dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2> /dev/null || true
  wait "$1" 2> /dev/null || true
}

cmd_run() {
  local n=${1:-} rate=${2:-} delay=0ms
  shift 2 || die "usage: netlab.sh run N RATE [DELAY] -- COMMAND..."
  if [ "${1:-}" != "--" ]; then delay=${1:-}; shift || true; fi
  [ "${1:-}" = "--" ] || die "usage: netlab.sh run N RATE [DELAY] -- COMMAND..."
  shift
  [ $# -gt 0 ] || die "usage: netlab.sh run N RATE [DELAY] -- COMMAND..."
  # mpirun runs in the background so that a signal to this script is handled at once: it stops
  # mpirun (which stops its ranks), then the EXIT trap (set by cmd_up once it owns the lab)
  # removes the lab.
  # The wait is bounded: an mpirun caught in its own abort (a Ctrl-C reaches it too) can wait for
  # its daemons indefinitely; after 10 s it is killed, and the EXIT trap's cmd_down stops
  # whatever is left in the namespaces.
  local mpi=""
  trap 'stop_mpi "$mpi"; exit 130' INT
  trap 'stop_mpi "$mpi"; exit 143' TERM
  cmd_up "$n" "$rate" "$delay"
  local hosts="" i rc=0
  for ((i = 0; i < n; i++)); do hosts+="${hosts:+,}$(host_ip "$i")"; done
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NETLAB_STATE_DIR=$state
  # rtc ^hwloc: the daemon started in each namespace otherwise maps the topology into shared
  # memory at a guessed address; it crashed there (segfault in hwloc_shmem_topology_write) in
  # about one start out of four on this machine. Ranks are not bound, so nothing is lost.
  # shellcheck disable=SC2086
  ip netns exec "$hub" mpirun -np "$n" --host "$hosts" --bind-to none --mca rtc ^hwloc \
    --mca plm_rsh_agent "$here/netlab-rsh.sh" --mca pml ob1 --mca btl tcp,self \
    --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
    ${NETLAB_MPI_ARGS:-} "$@" &
  mpi=$!
  wait "$mpi" || rc=$?
  mpi=""
  if [ -n "${NETLAB_STATS:-}" ]; then cmd_stats > "$NETLAB_STATS"; else cmd_stats; fi
  return $rc
}

case ${1:-} in
  up) shift; cmd_up "$@"; trap - EXIT ;;  # a lab made by `up` stays up; a failed `up` is removed
  down) cmd_down ;;
  shape) shift; cmd_shape "$@" ;;
  stats) cmd_stats ;;
  run) shift; cmd_run "$@" ;;
  *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
