"""bench/l4/run.sh's orchestrator: upstreams, proxies, clients, CPU accounting, the summary."""

import os
import socket
import statistics
import subprocess
import sys
import threading
import time

WEIR = os.environ["WEIR_BIN"]
# `weir-base` in PROXIES: another weir build (a baseline) run the same way, in the same rounds.
WEIR_BASE = os.environ.get("WEIR_BASE_BIN", "")
WORK = os.environ["WORKDIR"]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SIZE = int(os.environ.get("SIZE_MB", "1024")) << 20
CONNS = int(os.environ.get("CONNS", "10000"))
PROXIES = os.environ.get("PROXIES", "weir,haproxy,nginx").split(",")
PROXY_CPU = os.environ.get("PROXY_CPU", "1")
# stream, conns: each proxy alone in turn; mixed: short connections through all proxies at once
# (one through each in turn), so that the machine's drift falls on all alike.
SCENARIOS = os.environ.get("SCENARIOS", "stream,conns").split(",")
TICK = os.sysconf("SC_CLK_TCK")
CHUNK = 1 << 20


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, timeout=15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


# === upstreams ===

def sink(conn):
    """Reads to the end of stream, then answers the byte count (8 bytes) and closes."""
    total, buf = 0, bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        n = conn.recv_into(view)
        if n == 0:
            break
        total += n
    conn.sendall(total.to_bytes(8, "big"))


def echo_one(conn):
    data = conn.recv(1)
    if data:
        conn.sendall(data)


def served(handler, conn):
    """Runs `handler` on `conn`, then closes it. A client (or proxy) that resets, times out or
    vanishes only ends its own connection: the upstream keeps serving the next one."""
    try:
        # A client that connects and sends nothing holds the inline echo for 10 s at most.
        conn.settimeout(10)
        handler(conn)
    except OSError:
        pass
    finally:
        conn.close()


def upstream(handler):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                # ECONNABORTED (reset while queued), EMFILE: this connection is lost, not the
                # upstream.
                time.sleep(0.01)
                continue
            if handler is echo_one:
                served(handler, conn)  # short: serve inline, no thread per connection
            else:
                threading.Thread(target=served, args=(handler, conn), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


# === proxies ===

def weir_files(port, backend):
    # A directory per port: in the mixed scenario two weir builds run at once.
    d = os.path.join(WORK, f"weir-{port}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "app.yaml"), "w") as f:
        f.write(f"""apiVersion: v1
kind: Service
metadata: {{name: up, namespace: default}}
spec:
  ports: [{{name: tcp, port: 9000}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: up-1, namespace: default, labels: {{kubernetes.io/service-name: up}}}}
addressType: IPv4
ports: [{{name: tcp, port: {backend}}}]
endpoints:
- addresses: ["127.0.0.1"]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: tcp, namespace: default}}
data:
  "{port}": "default/up:9000"
""")
    return d


def proxy_argv(name, port, backend):
    if name in ("weir", "weir-copy", "weir-base"):
        d = weir_files(port, backend)
        # weir-copy: the same weir relaying through its copy buffer instead of splice(2).
        splice = "false" if name == "weir-copy" else "true"
        binary = WEIR
        if name == "weir-base":
            if not WEIR_BASE:
                raise SystemExit("weir-base needs WEIR_BASE_BIN")
            binary = WEIR_BASE
        return [binary, "serve", "--manifests", d, "--threads", "1", "--listen-http", "127.0.0.1:0",
                "--listen-https", "127.0.0.1:0", "--listen-admin", "127.0.0.1:0",
                "--tcp-services-configmap", "default/tcp", "--l4-listen-address", "127.0.0.1",
                "--log-level", "warn", f"--l4-splice={splice}",
                # The peers are configured without logs: weir's L4 access log off too.
                "--access-log", "off"]
    if name == "haproxy":
        cfg = os.path.join(WORK, "haproxy.cfg")
        with open(cfg, "w") as f:
            f.write(f"""global
  nbthread 1
  maxconn 8000
defaults
  mode tcp
  timeout connect 5s
  timeout client 600s
  timeout server 600s
frontend f
  bind 127.0.0.1:{port}
  default_backend b
backend b
  server s1 127.0.0.1:{backend}
""")
        return ["haproxy", "-db", "-f", cfg]
    if name == "nginx":
        cfg = os.path.join(WORK, "nginx.conf")
        with open(cfg, "w") as f:
            f.write(f"""load_module /usr/lib/nginx/modules/ngx_stream_module.so;
worker_processes 1;
daemon off;
pid {WORK}/nginx.pid;
error_log {WORK}/nginx.err warn;
events {{ worker_connections 8000; }}
stream {{
  server {{
    listen 127.0.0.1:{port} reuseport;
    proxy_pass 127.0.0.1:{backend};
    proxy_timeout 600s;
    proxy_half_close on;
  }}
}}
""")
        return ["nginx", "-c", cfg, "-e", f"{WORK}/nginx.err"]
    raise SystemExit(f"unknown proxy {name}")


class Proxy:
    def __init__(self, name, port, backend):
        self.name = name
        self.port = port
        argv = ["taskset", "-c", PROXY_CPU] + proxy_argv(name, port, backend)
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port)

    def pids(self):
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            try:
                kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
            except OSError:
                kids = []
            todo.extend(int(k) for k in kids)
        return out

    def cpu_seconds(self):
        total = 0
        for pid in self.pids():
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime + stime
        return total / TICK

    def cpu_ns(self):
        """CPU time of the live threads of its process tree, in ns (the scheduler's own count,
        not sampled at ticks)."""
        total = 0
        for pid in self.pids():
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tasks:
                try:
                    total += int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
                except (OSError, ValueError, IndexError):
                    pass
        return total

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# === clients ===

def stream(port):
    """One connection: SIZE bytes up, end of stream, the upstream's count back (checked)."""
    buf = bytes(CHUNK)
    s = socket.create_connection(("127.0.0.1", port))
    sent = 0
    while sent < SIZE:
        s.sendall(buf)
        sent += len(buf)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while len(got) < 8:
        more = s.recv(8 - len(got))
        if not more:
            break
        got += more
    s.close()
    if int.from_bytes(got, "big") != SIZE:
        raise SystemExit(f"the upstream counted {got!r}, not {SIZE}")


def short_conns(ports, conns=CONNS):
    """`conns` short connections through each of `ports`, one through each in turn."""
    failed = 0
    for _ in range(conns):
        for p in ports:
            try:
                s = socket.create_connection(("127.0.0.1", p))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.sendall(b"x")
                if s.recv(1) != b"x":
                    failed += 1
                s.close()
            except OSError:
                failed += 1
    if failed:
        raise SystemExit(f"{failed} short connections failed")


def mixed_in_order(order, echo_port):
    """All proxies at once on PROXY_CPU, CONNS short connections through each, one through each
    in turn: each proxy's CPU per 10k connections (scheduler time), the rate of all together."""
    pxs = []
    try:
        for name in order:
            pxs.append(Proxy(name, free_port(), echo_port))
        ports = [px.port for px in pxs]
        short_conns(ports, conns=200)
        cpu0, t0 = [px.cpu_ns() for px in pxs], time.time()
        short_conns(ports)
        wall = time.time() - t0
        cpu = [px.cpu_ns() - c for px, c in zip(pxs, cpu0)]
    finally:
        for px in pxs:
            px.stop()
    rate = CONNS * len(pxs) / wall
    return {name: {"rate": rate, "cpu": c / 1e9 / CONNS * 1e4, "unit": ("conn/s", "CPU s/10k conns")}
            for name, c in zip(order, cpu)}


def run(scenario, proxy, sink_port, echo_port):
    port = free_port()
    px = Proxy(proxy, port, sink_port if scenario == "stream" else echo_port)
    try:
        time.sleep(0.3)
        cpu0, t0 = px.cpu_seconds(), time.time()
        stream(port) if scenario == "stream" else short_conns([port])
        wall = time.time() - t0
        cpu = px.cpu_seconds() - cpu0
    finally:
        px.stop()
    if scenario == "stream":
        gib = SIZE / (1 << 30)
        return {"rate": SIZE / wall / 1e6, "cpu": cpu / gib, "unit": ("MB/s", "CPU s/GiB")}
    return {"rate": CONNS / wall, "cpu": cpu / CONNS * 1e4, "unit": ("conn/s", "CPU s/10k conns")}


def main():
    sink_port, echo_port = upstream(sink), upstream(echo_one)
    results = {}
    for scenario in SCENARIOS:
        if scenario not in ("stream", "conns", "mixed"):
            raise SystemExit(f"unknown scenario {scenario} (stream, conns, mixed)")
    for r in range(ROUNDS):
        for scenario in SCENARIOS:
            if scenario == "mixed":
                # The proxies' order rotates: each starts first as often.
                shift = r % len(PROXIES)
                order = PROXIES[shift:] + PROXIES[:shift]
                round_results = mixed_in_order(order, echo_port)
            else:
                round_results = {proxy: run(scenario, proxy, sink_port, echo_port) for proxy in PROXIES}
            for proxy in PROXIES:
                res = round_results[proxy]
                results.setdefault((scenario, proxy), []).append(res)
                print(f"round {r + 1} {scenario:7} {proxy:8} {res['rate']:10.1f} {res['unit'][0]:7} "
                      f"{res['cpu']:8.3f} {res['unit'][1]}", flush=True)
    print()
    print(f"medians of {ROUNDS} rounds (SIZE_MB={SIZE >> 20}, CONNS={CONNS}, proxy on CPU {PROXY_CPU}):")
    for scenario in SCENARIOS:
        med = {p: (statistics.median(x["rate"] for x in results[(scenario, p)]),
                   statistics.median(x["cpu"] for x in results[(scenario, p)])) for p in PROXIES}
        unit = results[(scenario, PROXIES[0])][0]["unit"]
        for p in PROXIES:
            line = f"  {scenario:7} {p:8} {med[p][0]:10.1f} {unit[0]:7} {med[p][1]:8.3f} {unit[1]}"
            if p != "weir" and "weir" in med:
                ratios = [w["cpu"] / max(1e-9, x["cpu"])
                          for w, x in zip(results[(scenario, "weir")], results[(scenario, p)])]
                at_or_below = sum(1 for q in ratios if q <= 1.0)
                line += (f"   weir/{p}: rate {med['weir'][0] / med[p][0]:.2f}, CPU {med['weir'][1] / max(1e-9, med[p][1]):.2f}"
                         f" (per round: median {statistics.median(ratios):.3f}, {at_or_below}/{len(ratios)} at or below)")
            print(line)


if __name__ == "__main__":
    sys.exit(main())
