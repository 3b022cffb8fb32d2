#!/usr/bin/env bash
# Tries the elastic backend on one machine: starts a Redis server on a free loopback port (a
# fresh random password and a fresh run secret, given to the workers through their environment,
# never a command line) and N workers w0..w{N-1} of `loco train ARGS... --join redis://127.0.0.1:PORT/local`,
# each in its own run directory train.out_dir/wK (log: train.out_dir/wK.log); waits for them,
# stops Redis, and exits non-zero if any worker failed. Ctrl-C stops everything it started.
# Usage: scripts/elastic-local.sh N ARGS...   e.g.
#   scripts/elastic-local.sh 4 --config configs/small.toml --set algorithm=diloco --set train.out_dir=runs/el
# Set LOCO to another binary than build/loco; extra workers can join later with
#   LOCO_REDIS_PASSWORD=... build/loco train ARGS... --set elastic.secret_file=OUT/run.secret \
#     --join redis://127.0.0.1:PORT/local --worker NAME
# (the script prints the address, the password file and the secret file).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
[ $# -ge 2 ] || { echo "usage: scripts/elastic-local.sh N ARGS... (loco train arguments)" >&2; exit 2; }
n=$1
shift
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "scripts/elastic-local.sh: N must be a positive integer, not '$n'" >&2; exit 2; }
command -v redis-server > /dev/null || loco_install elastic
loco=${LOCO:-build/loco}
[ -x "$loco" ] || { echo "scripts/elastic-local.sh: $loco not built (scripts/build.sh)" >&2; exit 2; }
out=$("$loco" train --print-config "$@" | sed -nE '/^\[train\]/,/^\[/ s/^out_dir = "([^"]*)".*$/\1/p')
[ -n "$out" ] || { echo "scripts/elastic-local.sh: cannot read train.out_dir from the config" >&2; exit 2; }
mkdir -p "$out"
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pwfile="$out/redis.password"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$pwfile")
secret="$out/run.secret"
(umask 077 && head -c 32 /dev/urandom | base64 > "$secret")
conf="$out/redis.conf"
(umask 077 && printf 'bind 127.0.0.1\nport %s\nsave ""\nappendonly no\nrequirepass %s\n' "$port" "$(cat "$pwfile")" > "$conf")
redis-server "$conf" > "$out/redis.log" 2>&1 &
redis_pid=$!
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  kill "$redis_pid" 2> /dev/null || true
  wait 2> /dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 100); do
  REDISCLI_AUTH=$(cat "$pwfile") redis-cli -p "$port" ping 2> /dev/null | grep -q PONG && break
  sleep 0.05
done
url="redis://127.0.0.1:$port/local"
echo "elastic: Redis at $url (password in $pwfile, run secret in $secret); $n workers, logs in $out/w*.log"
export LOCO_REDIS_PASSWORD
LOCO_REDIS_PASSWORD=$(cat "$pwfile")
for k in $(seq 0 $((n - 1))); do
  "$loco" train "$@" --set elastic.address=127.0.0.1 --set elastic.min_workers="$n" --set elastic.secret_file="$secret" \
    --join "$url" --worker "w$k" \
    > "$out/w$k.log" 2>&1 &
  pids+=($!)
done
status=0
for k in "${!pids[@]}"; do
  if ! wait "${pids[$k]}"; then
    echo "elastic: worker w$k failed:" >&2
    tail -n 5 "$out/w$k.log" >&2
    status=1
  fi
done
pids=()
for k in $(seq 0 $((n - 1))); do grep -A3 '^summary' "$out/w$k.log" | head -4 | sed "s/^/w$k: /" || true; done
exit $status
