"""A Redis server for the elastic tests (tests/cli/elastic_env.py, tests/python/test_elastic.py):
password-protected, on a free loopback port, its config (redis.conf) and log in the current
directory."""
import os
import shutil
import socket
import subprocess
import sys
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_redis():
    """(process, port, password) of a new server, once it accepts connections (at most 10 s)."""
    if not shutil.which("redis-server"):
        sys.exit("FAIL: redis-server is not installed (scripts/deps.sh installs it with the test packages)")
    password = "loco-test-" + os.urandom(6).hex()
    port = free_port()
    with open("redis.conf", "w") as f:
        f.write(f'bind 127.0.0.1\nport {port}\nsave ""\nappendonly no\nrequirepass {password}\n')
    proc = subprocess.Popen(["redis-server", "redis.conf"], stdout=open("redis.log", "w"), stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, port, password
