#!/usr/bin/env bash
# The network lab (scripts/netlab.sh), where the machine allows network namespaces (else skipped
# with the reason, exit code 77):
#  - the delay helper: a ping between two hosts at 10 ms one-way takes 20-30 ms (the minimum of
#    5); a TCP transfer through a 100 Mbit/s host link runs at 70-100% of 12.5 MB/s (measured
#    0.88; at most 0.956 of the rate is payload); at 1 Gbit/s it carries whole TCP segments
#    (offload), several frames each;
#  - tiny DDP on 2 MPI ranks, one per namespace, over 100 Mbit/s + 10 ms == the in-process run
#    bitwise; the bytes through the shaped links (tc -s) are at least loco's counted payload
#    and at most 10% above it (TCP/IP headers, ACKs, MPI's own messages);
#  - `run` removes every namespace it made when the command fails or is interrupted; `up` and
#    `run` refuse a second lab and leave the first one up;
#  - the hosts use cubic, and the machine's allowed congestion controls are restored.
set -euo pipefail
loco=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
netlab=$root/scripts/netlab.sh
export NETLAB_DELAY_BIN=$(dirname "$loco")/netlab-delay
py=/usr/bin/python3
if [ "$(id -u)" -ne 0 ]; then echo "SKIPPED: not root (network namespaces need it)"; exit 77; fi
if ! ip netns add loco-test-probe 2> /dev/null; then
  echo "SKIPPED: network namespaces are not allowed on this machine"; exit 77
fi
ip netns del loco-test-probe
if [ ! -c /dev/net/tun ]; then echo "SKIPPED: no /dev/net/tun (TAP devices) on this machine"; exit 77; fi
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$netlab" down
no_lab_left() {  # no namespace and, within 5 s (stopped processes are reaped by init), no orted
  ! ip netns list | grep -qE '^loco-(hub|h[0-9]+)' || return 1
  for _ in $(seq 1 50); do pgrep -x orted > /dev/null || return 0; sleep 0.1; done
  return 1
}
trap '"$netlab" down' EXIT

# Streams MB megabytes from host 0 to host 1 over TCP; prints "bytes seconds" as host 1 saw them.
tcp_transfer() {
  ip netns exec loco-h1 $py - > server.out <<'PY' &
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.77.0.2", 5001)); s.listen(1)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.monotonic()
    n += len(b)
print(n, time.monotonic() - t0)
PY
  local server=$!
  sleep 0.5
  ip netns exec loco-h0 $py -c "
import socket
s = socket.create_connection(('10.77.0.2', 5001)); s.sendall(b'x' * ($1 << 20)); s.close()"
  wait $server
  cat server.out
}

# Delay and rate; the hosts use the congestion control asked for (cubic by default) whatever
# the machine's own default, and the machine's list of allowed ones is as before once the lab
# is down.
allowed_before=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
"$netlab" up 2 100mbit 10ms
[ "$(ip netns exec loco-h1 sysctl -n net.ipv4.tcp_congestion_control)" = cubic ] || { echo "lab hosts not on cubic"; exit 1; }
rtt=$(ip netns exec loco-h0 ping -c 5 -i 0.2 10.77.0.2 | sed -nE 's|^rtt [^=]*= ([0-9.]+)/.*|\1|p')
$py -c "import sys; r = float(sys.argv[1]); assert 20 <= r <= 30, f'min rtt {r} ms'" "$rtt"
read -r bytes secs < <(tcp_transfer 24)
$py -c "import sys; r = int(sys.argv[1]) / float(sys.argv[2]) / 12.5e6; assert 0.7 <= r <= 1.0, f'{r:.3f} of 100 Mbit/s'; print(f'TCP through the shaped link: {r:.3f} of 100 Mbit/s')" "$bytes" "$secs"
if "$netlab" up 2 100mbit 2> refused.txt; then echo "a second lab was made"; exit 1; fi
grep -q "already up" refused.txt
# A refused `run` leaves the lab it found alone (it once removed it on the way out).
if "$netlab" run 2 100mbit -- true 2> refused.txt; then echo "run made a second lab"; exit 1; fi
grep -q "already up" refused.txt
ip netns exec loco-h0 ping -c 1 -W 2 10.77.0.2 > /dev/null || { echo "a refused run removed the lab"; exit 1; }
"$netlab" down
no_lab_left
[ "$(sysctl -n net.ipv4.tcp_allowed_congestion_control)" = "$allowed_before" ] || { echo "allowed congestion controls changed"; exit 1; }
echo "delay: min rtt $rtt ms at 10 ms one-way"

# At 1 Gbit/s the delay helper moves whole TCP segments (offload), not one frame per copy: its
# counters (printed when it stops) show segments far larger than an Ethernet frame.
"$netlab" up 2 1gbit
tcp_transfer 16 > /dev/null
kill -TERM "$(head -1 /run/loco-netlab/pids)"
for _ in $(seq 1 50); do grep -q "out .* frames" /run/loco-netlab/delay-0.log && break; sleep 0.1; done
$py - /run/loco-netlab/delay-0.log <<'PY'
import re, sys
frames, nbytes = map(int, re.search(r"out (\d+) frames (\d+) bytes", open(sys.argv[1]).read()).groups())
print(f"delay helper at 1 Gbit/s: {nbytes} bytes in {frames} segments ({nbytes / frames:.0f} bytes each)")
assert nbytes >= 16 << 20 and nbytes / frames > 4 * 1514, (frames, nbytes)
PY
"$netlab" down

# DDP across two namespaces == in-process; tc bytes vs loco's.
$py "$here/../tools/make_tokens.py" train.tok 256 20000 5
$py "$here/../tools/make_tokens.py" val.tok 256 3000 6
args=(--config "$root/configs/tiny.toml" --set data.train="$PWD/train.tok" --set data.val="$PWD/val.tok"
      --set train.steps=20 --set train.threads=1 --quiet)
NETLAB_STATS=tc.txt timeout 120 "$netlab" run 2 100mbit 10ms -- "$loco" train "${args[@]}" --set train.out_dir="$PWD/lab" > lab.out
no_lab_left
"$loco" train "${args[@]}" --set distributed.replicas=2 --set train.out_dir="$PWD/inproc" > /dev/null
cmp lab/checkpoints/step_00000020/model.safetensors inproc/checkpoints/step_00000020/model.safetensors
$py - lab/summary.json tc.txt <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
sent = {w["rank"]: w["bytes_sent"] for w in s["workers"]}
tc = {}
for line in open(sys.argv[2]):
    f = line.split()
    tc[int(f[1])] = int(f[3])
for r in (0, 1):
    ratio = tc[r] / sent[r]
    print(f"host {r}: loco counted {sent[r]} bytes, the shaped link carried {tc[r]} ({ratio:.3f})")
    assert 1.0 <= ratio <= 1.10, ratio
PY
echo "DDP over the lab == in-process (bitwise)"

# Cleanup on failure and on interruption.
if "$netlab" run 2 100mbit -- false; then echo "a failing command succeeded"; exit 1; fi
no_lab_left
timeout -s INT 5 "$netlab" run 2 100mbit -- sleep 60 || true
no_lab_left
echo "the lab is removed when its command fails or is interrupted"
