#!/usr/bin/env python3
"""Resident memory per open keep-alive connection (docs/BENCHMARKS.md,
"Memory per open connection"): the edge (one worker, every visitor queued,
the queue page) against nginx (one process) serving the same page from a
file, each holding N connections that asked for one page and stay open.

usage: conn-memory.py EDGE_BINARY [N] [ROUNDS]   (N default 4000, ROUNDS 2)

Prints, per server and round, VmRSS before the connections and with them
open, and the difference per connection; then edge ÷ nginx. Needs root
(nginx's user) and nginx. Traffic goes to loopback only; every wait is
bounded.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def ask(port, path):
    """One request on a new connection; the socket (left open) and the answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = next(
        (int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")),
        0,
    )
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return s, head, body


def wait_up(port):
    for _ in range(200):
        try:
            s, head, body = ask(port, "/page")
            s.close()
            return head, body
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answers on port {port}")


def per_connection(pid, port, n):
    """RSS growth per connection for n connections held open."""
    time.sleep(0.5)
    before = rss_kb(pid)
    held = []
    for _ in range(n):
        s, head, _ = ask(port, "/page")
        assert head.startswith(b"HTTP/1.1 200"), head[:80]
        held.append(s)
    time.sleep(1)
    after = rss_kb(pid)
    for s in held:
        s.close()
    return before, after, (after - before) * 1024 / n


def main():
    edge_bin = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    d = tempfile.mkdtemp(prefix="conn-memory.")
    ep = 20000 + os.getpid() % 10000
    np_ = ep + 1
    with open(f"{d}/edge.toml", "w") as f:
        f.write(
            f"""[node]
id = "memory"
listen = "127.0.0.1:{ep}"
workers = 1
counters_path = "{d}/counters.shm"
max_connections_per_worker = 100000
max_connections_per_address = 100000
new_tickets_per_address_per_minute = 0
keepalive_timeout_ms = 300000
[[rooms]]
id = "queue"
path = "/"
origin = "127.0.0.1:9"
total_active_users = 1000
new_users_per_minute = 100
queue_all = true
"""
        )
    results = {"edge": [], "nginx": []}
    for r in range(rounds):
        # Each server started afresh per round: the first connections grow
        # its memory, later ones would reuse what the first freed.
        edge = subprocess.Popen(
            ["taskset", "-c", "0", edge_bin, "--config", f"{d}/edge.toml"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _, page = wait_up(ep)
            results["edge"].append(per_connection(edge.pid, ep, n))
        finally:
            edge.terminate()
            edge.wait(timeout=10)
        os.makedirs(f"{d}/static", exist_ok=True)
        with open(f"{d}/static/page", "wb") as f:
            f.write(page)
        with open(f"{d}/nginx.conf", "w") as f:
            f.write(
                f"""daemon off; master_process off; worker_processes 1; user root;
error_log {d}/nginx-error.log; pid {d}/nginx.pid;
events {{ worker_connections 100000; }}
worker_rlimit_nofile 100000;
http {{ access_log off; keepalive_timeout 300s; keepalive_requests 100000;
  client_body_temp_path {d}/b; proxy_temp_path {d}/p; fastcgi_temp_path {d}/f;
  uwsgi_temp_path {d}/u; scgi_temp_path {d}/s;
  server {{ listen 127.0.0.1:{np_}; location / {{ root {d}/static; default_type text/html; }} }} }}
"""
            )
        nginx = subprocess.Popen(
            ["taskset", "-c", "0", "nginx", "-c", f"{d}/nginx.conf"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_up(np_)
            results["nginx"].append(per_connection(nginx.pid, np_, n))
        finally:
            nginx.terminate()
            nginx.wait(timeout=10)
        for name in ("edge", "nginx"):
            before, after, per = results[name][-1]
            print(f"{name} round={r + 1} connections={n} rss_kb={before}->{after} bytes_per_connection={per:.0f}")
    edge_med = sorted(p for _, _, p in results["edge"])[len(results["edge"]) // 2]
    nginx_med = sorted(p for _, _, p in results["nginx"])[len(results["nginx"]) // 2]
    print(f"edge / nginx bytes per connection: {edge_med / nginx_med:.2f}")


if __name__ == "__main__":
    main()
