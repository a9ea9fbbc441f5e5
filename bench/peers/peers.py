"""Orchestrator of bench/peers/run.sh (run that, not this): starts the upstream, then for each
round, scenario and proxy (order rotated every round) starts the proxy pinned to its core, warms
it up, runs one bounded load, reads the proxy's CPU time and peak RSS from /proc, stops it, and
finally prints medians, ratios, integrity failures and the bottleneck of each cell."""

import base64
import gzip
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.environ["WORKDIR"]
WEIR = os.environ["WEIR_BIN"]
# An optional second weir binary, run as the proxy "weir-base" beside the others: an A/B of two
# builds in one run on one machine (e.g. before and after a change).
WEIR_BASE = os.environ.get("WEIR_BASE_BIN", "")
# Extra `weir serve` flags of weir-base (e.g. `--metrics=false`: the same build without request
# metrics).
WEIR_BASE_ARGS = os.environ.get("WEIR_BASE_ARGS", "").split()
ROUNDS = int(os.environ.get("ROUNDS", "3"))
DURATION = int(os.environ.get("DURATION", "5"))
WARMUP = int(os.environ.get("WARMUP", "1"))
PROXY_CPU = os.environ.get("PROXY_CPU", "1")
LOAD_CPU = os.environ.get("LOAD_CPU", "0")
ALL_SCENARIOS = ["h1", "h1-tls", "h2-tls", "h2-tls-32", "1m", "post-64k", "handshake", "resume",
                 "ws", "h1-rate", "h2-tls-rate", "gzip-100k", "br-100k"]
# Response compression of a 100 KB HTML page, as ingress-nginx configures it (use-gzip: gzip
# level 1; enable-brotli: brotli level 4): each proxy runs a configuration with it on.
# HAProxy has gzip (libslz, its stateless encoder: faster, less compact) and no brotli.
COMPRESSION = {"gzip-100k": "gzip", "br-100k": "br"}
UNSUPPORTED = {("br-100k", "haproxy")}
BROTLI_MODULE = "/usr/lib/nginx/modules/ngx_http_brotli_filter_module.so"
SCENARIOS = os.environ.get("SCENARIOS", ",".join(ALL_SCENARIOS)).split(",")
PROXIES = os.environ.get("PROXIES", "weir,nginx,haproxy" + (",weir-base" if WEIR_BASE else "")).split(",")
if "weir-base" in PROXIES and not WEIR_BASE:
    sys.exit("the proxy weir-base needs WEIR_BASE_BIN")
TICK = os.sysconf("SC_CLK_TCK")

# Loopback only; high ports (checked free at start).
UP = 28900          # upstream nginx: /, /1m, /sink, /up-status
WS_UP = 28910       # weir echo: WebSocket echo upstream
PORTS = {
    "weir": {"http": 28080, "https": 28443, "admin": 28090},
    "weir-base": {"http": 28380, "https": 28743, "admin": 28390},
    "nginx": {"http": 28180, "https": 28543},
    "haproxy": {"http": 28280, "https": 28643},
}

H1_CONNS = 32
H2_CONNS, H2_STREAMS = 8, 16
BIG_CONNS = 8
ZIP_CONNS = 8
POST_CONNS = 16
WS_CONNS = 4
# The fixed-rate scenarios: the same load for every proxy (requests/s in all), below what each
# serves at saturation here, so their p99 compares like for like.
H1_RATE = int(os.environ.get("H1_RATE", "40000"))
H2_RATE = int(os.environ.get("H2_RATE", "40000"))
# The request headers every proxy adds on the way to the upstream. "weir" (the default): nginx
# and HAProxy set what weir sets by default, as ingress-nginx's nginx.conf does too: Host as the
# client sent it, a random X-Request-ID, X-Forwarded-For, X-Real-IP, X-Forwarded-Proto,
# X-Forwarded-Host, X-Forwarded-Port. "none": nginx and HAProxy forward the request as it came
# (nginx's Host is then the upstream block's name); the runs in bench/RESULTS.md before
# 2026-11-23 12:00 UTC used this, so weir did more per request than its peers.
PEER_HEADERS = os.environ.get("PEER_HEADERS", "weir")
if PEER_HEADERS not in ("weir", "none"):
    sys.exit(f"PEER_HEADERS must be weir or none, not {PEER_HEADERS!r}")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is fine
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_port(port, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def pinned(cpu, argv):
    return ["taskset", "-c", cpu] + argv


# === configuration of the upstream and the three proxies ===

def page_html():
    """A 100 KB HTML page of varied prose (it compresses about as a real page does)."""
    rng = random.Random(7)
    words = ("weir ingress route backend service request header proxy table host path cluster node "
             "latency the a of to and in is for with on that by this be are from at as it or an "
             "kubernetes controller gateway endpoint slice secret certificate annotation").split()
    parts = ["<!doctype html>\n<html><head><meta charset=utf-8><title>bench</title></head><body>\n"]
    size = len(parts[0])
    i = 0
    while size < 100_000:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(8, 20)))
        line = f'<p id="p{i}" class="c{i % 7}"><a href="/doc/{rng.randint(1, 999)}">{sentence}</a>.</p>\n'
        parts.append(line)
        size += len(line)
        i += 1
    parts.append("</body></html>\n")
    return "".join(parts)


def setup_files():
    with open(os.path.join(WORK, "1m.bin"), "wb") as f:
        f.write(os.urandom(1 << 20))
    write(os.path.join(WORK, "page.html"), page_html())
    write(os.path.join(WORK, "post.lua"),
          'wrk.method = "POST"\nwrk.body = string.rep("x", 65536)\n'
          'wrk.headers["Content-Type"] = "application/octet-stream"\n')
    cert, key = (open(os.path.join(WORK, n)).read() for n in ("cert.pem", "key.pem"))
    write(os.path.join(WORK, "combined.pem"), cert + key)
    for d in ("up", "nginx", "haproxy", "weir", "weir-base", "weir/manifests"):
        os.makedirs(os.path.join(WORK, d), exist_ok=True)

    write(os.path.join(WORK, "up/nginx.conf"), f"""
worker_processes 1;
pid {WORK}/up/nginx.pid;
error_log {WORK}/up/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  client_body_temp_path {WORK}/up/body;
  server {{
    listen 127.0.0.1:{UP} backlog=4096;
    location = /1m {{ default_type application/octet-stream; alias {WORK}/1m.bin; }}
    location = /page.html {{ default_type text/html; alias {WORK}/page.html; }}
    location = /sink {{ client_max_body_size 2m; client_body_buffer_size 128k; return 200 "ok\\n"; }}
    location = /up-status {{ stub_status; }}
    location / {{ default_type text/plain; return 200 "hello from the upstream, a small fixed body\\n"; }}
  }}
}}
""")

    p = PORTS["nginx"]
    # proxy_set_header in a location replaces every inherited one: each location sets them all.
    nginx_headers = "".join(f"proxy_set_header {h} {v}; " for h, v in (
        ("Host", "$http_host"), ("X-Request-ID", "$request_id"), ("X-Forwarded-For", "$remote_addr"),
        ("X-Real-IP", "$remote_addr"), ("X-Forwarded-Proto", "$scheme"),
        ("X-Forwarded-Host", "$http_host"), ("X-Forwarded-Port", "$server_port"),
    )) if PEER_HEADERS == "weir" else ""
    # ingress-nginx's nginx.tmpl lines for use-gzip and enable-brotli, with its default levels.
    nginx_compression = {
        "": ("", ""),
        "gzip": ("", "gzip on; gzip_comp_level 1; gzip_http_version 1.1; gzip_min_length 256; "
                     "gzip_types text/plain application/json; gzip_proxied any; gzip_vary on;"),
        "br": (f"load_module {BROTLI_MODULE};",
               "brotli on; brotli_comp_level 4; brotli_min_length 20; brotli_types text/plain application/json;"),
    }
    for variant, (main_ctx, http_ctx) in nginx_compression.items():
        conf = "nginx.conf" if not variant else f"nginx-{variant}.conf"
        write(os.path.join(WORK, "nginx", conf), f"""
{main_ctx}
worker_processes 1;
pid {WORK}/nginx/nginx.pid;
error_log {WORK}/nginx/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  {http_ctx}
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  client_body_temp_path {WORK}/nginx/body;
  proxy_temp_path {WORK}/nginx/proxy;
  map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}
  # 320 idle upstream connections: ingress-nginx's upstream-keepalive-connections default.
  upstream up {{ server 127.0.0.1:{UP}; keepalive 320; keepalive_requests 100000000; }}
  upstream ws {{ server 127.0.0.1:{WS_UP}; }}
  server {{
    listen 127.0.0.1:{p['http']} backlog=4096;
    listen 127.0.0.1:{p['https']} ssl http2 backlog=4096;
    ssl_certificate {WORK}/cert.pem;
    ssl_certificate_key {WORK}/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    # Session resumption as ingress-nginx configures it (a 10m shared cache, 10m, no tickets);
    # weir's defaults are the same, and HAProxy below uses its own cache, tickets off too.
    ssl_session_cache shared:SSL:10m;
    ssl_session_timeout 10m;
    ssl_session_tickets off;
    client_max_body_size 2m;
    # ingress-nginx defaults to proxy-buffering off; streaming both ways, like weir.
    proxy_buffering off;
    proxy_request_buffering off;
    proxy_http_version 1.1;
    location / {{ proxy_pass http://up; proxy_set_header Connection ""; {nginx_headers}}}
    location /ws {{
      proxy_pass http://ws;
      {nginx_headers}
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_read_timeout 300s;
    }}
  }}
}}
""")

    p = PORTS["haproxy"]
    haproxy_headers = "".join(f"  http-request set-header {h} {v}\n" for h, v in (
        ("X-Request-ID", "%[uuid]"), ("X-Forwarded-For", "%[src]"), ("X-Real-IP", "%[src]"),
        ("X-Forwarded-Proto", "https if { ssl_fc }"), ("X-Forwarded-Proto", "http if !{ ssl_fc }"),
        ("X-Forwarded-Host", "%[req.hdr(host)]"), ("X-Forwarded-Port", "%[dst_port]"),
    )) if PEER_HEADERS == "weir" else ""
    for variant, compression in (("", ""), ("gzip", "  compression algo gzip\n  compression type text/html\n")):
        conf = "haproxy.cfg" if not variant else f"haproxy-{variant}.cfg"
        write(os.path.join(WORK, "haproxy", conf), f"""
global
  nbthread 1
  maxconn 4096
  tune.ssl.default-dh-param 2048
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client 300s
  timeout server 300s
  timeout tunnel 300s
  timeout http-keep-alive 300s
frontend fe
  bind 127.0.0.1:{p['http']}
  bind 127.0.0.1:{p['https']} ssl crt {WORK}/combined.pem alpn h2,http/1.1 no-tls-tickets
{haproxy_headers}  use_backend ws if {{ path_beg /ws }}
  default_backend up
backend up
{compression}  server up 127.0.0.1:{UP}
backend ws
  server ws 127.0.0.1:{WS_UP}
""")

    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    write(os.path.join(WORK, "weir/manifests/bench.yaml"), f"""
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: weir
  annotations:
    ingressclass.kubernetes.io/is-default-class: "true"
spec:
  controller: weir.dev/ingress-controller
---
apiVersion: v1
kind: Secret
metadata: {{name: bench-tls, namespace: bench}}
type: kubernetes.io/tls
data:
  tls.crt: {b64(cert)}
  tls.key: {b64(key)}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: bench, namespace: bench}}
spec:
  ingressClassName: weir
  rules:
  - http:
      paths:
      - path: /
        pathType: Prefix
        backend: {{service: {{name: up, port: {{number: 80}}}}}}
      - path: /ws
        pathType: Prefix
        backend: {{service: {{name: ws, port: {{number: 80}}}}}}
""" + "".join(f"""
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: bench}}
spec:
  ports: [{{name: http, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: bench
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: http, port: {port}, protocol: TCP}}]
endpoints:
- addresses: ["127.0.0.1"]
  conditions: {{ready: true}}
""" for name, port in (("up", UP), ("ws", WS_UP))))
    # The compression scenarios' weir: the same manifests and the ConfigMap keys ingress-nginx
    # users set (their default levels).
    for variant, keys in (("gzip", 'use-gzip: "true"'), ("br", 'enable-brotli: "true"')):
        d = os.path.join(WORK, f"weir/manifests-{variant}")
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(WORK, "weir/manifests/bench.yaml"), d)
        write(os.path.join(d, "settings.yaml"), "apiVersion: v1\nkind: ConfigMap\n"
              "metadata: {name: weir-settings, namespace: default}\n"
              f"data:\n  {keys}\n")


def proxy_argv(name, scenario):
    variant = COMPRESSION.get(scenario)
    suffix = f"-{variant}" if variant else ""
    if name == "nginx":
        return ["nginx", "-p", f"{WORK}/nginx", "-e", f"{WORK}/nginx/error.log",
                "-c", f"{WORK}/nginx/nginx{suffix}.conf", "-g", "daemon off;"]
    if name == "haproxy":
        return ["haproxy", "-db", "-f", f"{WORK}/haproxy/haproxy{suffix}.cfg"]
    p = PORTS[name]
    binary = WEIR_BASE if name == "weir-base" else WEIR
    # nginx and HAProxy log nothing here: neither does weir (builds without the flag log nothing
    # by default); WEIR_BASE_ARGS may turn it back on for weir-base.
    quiet = ["--access-log", "off"] if takes_access_log(binary) else []
    return [binary, "--log-level", "warn", "serve", "--manifests", f"{WORK}/weir/manifests{suffix}",
            "--listen-http", f"127.0.0.1:{p['http']}", "--listen-https", f"127.0.0.1:{p['https']}",
            "--listen-admin", f"127.0.0.1:{p['admin']}", "--threads", "1",
            "--default-certificate", "bench/bench-tls"] + quiet + (WEIR_BASE_ARGS if name == "weir-base" else [])


def takes_access_log(binary):
    """Whether this weir build has `--access-log` (and so logs every request by default)."""
    out = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, check=False)
    return "--access-log" in out.stdout


class Proxy:
    """One proxy process (tree), pinned to the proxy core, started fresh for every run."""

    def __init__(self, name, scenario):
        self.name = name
        self.log = open(os.path.join(WORK, name, "stdout.log"), "ab")
        self.proc = subprocess.Popen(pinned(PROXY_CPU, proxy_argv(name, scenario)), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        if name.startswith("weir"):
            admin = PORTS[name]["admin"]
            deadline = time.time() + 15
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=1).read()
                    break
                except Exception:
                    if time.time() > deadline or self.proc.poll() is not None:
                        raise RuntimeError("weir did not become ready; see " + self.log.name)
                    time.sleep(0.05)
        wait_port(PORTS[name]["http"])
        wait_port(PORTS[name]["https"])

    def pids(self):
        """The process and its descendants (nginx: master and worker)."""
        return tree(self.proc.pid)

    def cpu_seconds(self):
        """(utime, stime) of every process of the proxy (all threads, live and exited)."""
        user = system = 0
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                user += int(fields[11])
                system += int(fields[12])
            except FileNotFoundError:
                pass
        return user / TICK, system / TICK

    def memory_kb(self, field):
        """A /proc/PID/status memory field (VmRSS, VmHWM...), summed over the proxy's processes."""
        total = 0
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/status") as f:
                    m = re.search(rf"{field}:\s+(\d+) kB", f.read())
                total += int(m.group(1)) if m else 0
            except FileNotFoundError:
                pass
        return total

    def peak_rss_mb(self):
        return self.memory_kb("VmHWM") / 1024

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # nginx's worker may outlive the master by a moment; wait for the ports to free up.
        for port in (PORTS[self.name]["http"], PORTS[self.name]["https"]):
            for _ in range(100):
                if port_free(port):
                    break
                time.sleep(0.05)
        self.log.close()


# === load generators and their parsers ===

def seconds(value, unit):
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[unit]


def run_wrk(url, conns, duration, script=None, header=None):
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", "--timeout", "5s"]
    if script:
        argv += ["-s", script]
    if header:
        argv += ["-H", header]
    out = run_bounded(argv + [url], duration + 15)
    res = {"raw": out, "inflight": conns}
    m = re.search(r"(\d+) requests in ([\d.]+)(\w+),", out)
    res["requests"] = int(m.group(1))
    res["elapsed"] = seconds(m.group(2), m.group(3))
    m = re.search(r"\s99%\s+([\d.]+)(us|ms|s)", out)
    res["p99_ms"] = seconds(m.group(1), m.group(2)) * 1e3 if m else None
    errors = []
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errors.append(f"{m.group(1)} non-2xx/3xx responses")
    m = re.search(r"Socket errors: (.*)", out)
    if m:
        errors.append("socket errors: " + m.group(1))
    res["errors"] = errors
    return res


def run_h2load(url, duration, streams=H2_STREAMS, conns=H2_CONNS, rate=None, h1=False):
    """h2load: HTTP/2 (or HTTP/1.1 with `h1`), `conns` connections x `streams` in flight, as fast
    as it goes or at `rate` requests/s in all (spread over the connections); p99 from its log of
    every request."""
    logfile = os.path.join(WORK, "h2load.log")
    if os.path.exists(logfile):
        os.remove(logfile)
    argv = ["h2load", "-t1", f"-c{conns}", f"-m{streams}", "-D", str(duration),
            "--log-file", logfile]
    if rate:
        argv.append(f"--rps={max(1, rate // conns)}")
    if h1:
        argv.append("--h1")
    argv.append(url)
    started = time.time()
    out = run_bounded(argv, duration + 15)
    res = {"raw": out, "inflight": conns * streams, "elapsed": time.time() - started}
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                  r"(\d+) failed, (\d+) errored, (\d+) timeout", out)
    total, _, done, ok, failed, errored, timeout = map(int, m.groups())
    res["requests"] = ok
    m = re.search(r"finished in ([\d.]+)(\w+),", out)
    if m:
        res["elapsed"] = seconds(m.group(1), m.group(2))
    errors = []
    if failed or errored or timeout:
        errors.append(f"h2load: {failed} failed, {errored} errored, {timeout} timeout")
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if m and (int(m.group(3)) or int(m.group(4))):
        errors.append(f"h2load: {m.group(3)} 4xx, {m.group(4)} 5xx")
    if not h1 and "Application protocol: h2" not in out:
        errors.append("h2 was not negotiated")
    if rate and ok < rate * duration * 0.95:
        errors.append(f"rate not held: {ok} requests in {duration} s at {rate}/s asked")
    durations = []
    with open(logfile) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1].startswith("2"):
                durations.append(int(parts[2]))
    durations.sort()
    res["p99_ms"] = durations[int(len(durations) * 0.99)] / 1e3 if durations else None
    res["errors"] = errors
    return res


def run_handshakes(port, duration):
    """Full TLS handshakes: openssl s_time -new never offers a session to resume (wrk and h2load
    would). Two clients in parallel; one GET per connection."""
    # s_time sends "GET <page> HTTP/1.0\r\n\r\n": the page smuggles in a Host header, so that
    # every proxy routes and forwards it like the other scenarios' requests.
    page = "/ HTTP/1.0\r\nHost: bench.local\r\nX-Bench: full-handshake"
    argv = ["openssl", "s_time", "-connect", f"127.0.0.1:{port}", "-new", "-time",
            str(duration), "-www", page]
    started = time.time()
    procs = [subprocess.Popen(pinned(LOAD_CPU, argv), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=duration + 15)[0] for p in procs]
    res = {"raw": "\n".join(outs), "inflight": 2, "elapsed": time.time() - started,
           "p99_ms": None, "errors": [], "requests": 0}
    for out in outs:
        m = re.search(r"(\d+) connections in [\d.]+ real seconds", out)
        if not m:
            res["errors"].append("s_time output not understood: " + out[-300:])
            continue
        res["requests"] += int(m.group(1))
    return res


def run_resume(port, duration):
    """Resumed TLS 1.3 handshakes: two `resume.py` clients in parallel, one GET per connection,
    each connection offering the session the previous one was given."""
    argv = ["python3", os.path.join(HERE, "resume.py"), f"127.0.0.1:{port}", str(duration)]
    started = time.time()
    procs = [subprocess.Popen(pinned(LOAD_CPU, argv), stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=duration + 15)[0] for p in procs]
    res = {"raw": "\n".join(outs), "inflight": 2, "elapsed": time.time() - started,
           "p99_ms": None, "errors": [], "requests": 0}
    for out in outs:
        try:
            one = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            res["errors"].append("resume.py output not understood: " + out[-300:])
            continue
        res["requests"] += one["requests"]
        res["errors"] += one["errors"]
        if one["requests"] and one["resumed"] != one["requests"] - 1:
            res["errors"].append(f"{one['resumed']} of {one['requests']} connections resumed")
    return res


def run_ws(port, duration):
    argv = ["python3", os.path.join(HERE, "wsclient.py"), f"127.0.0.1:{port}", str(WS_CONNS),
            str(duration)]
    out = run_bounded(argv, duration + 15)
    res = json.loads(out.strip().splitlines()[-1])
    res["inflight"] = 0
    res["raw"] = out
    return res


def run_bounded(argv, timeout):
    proc = subprocess.run(pinned(LOAD_CPU, argv), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr


def load(scenario, proxy, duration):
    p = PORTS[proxy]
    http, https = f"http://127.0.0.1:{p['http']}", f"https://127.0.0.1:{p['https']}"
    if scenario == "h1":
        return run_wrk(http + "/", H1_CONNS, duration)
    if scenario == "h1-tls":
        return run_wrk(https + "/", H1_CONNS, duration)
    if scenario == "h2-tls":
        return run_h2load(https + "/", duration)
    if scenario == "h2-tls-32":
        # 32 requests in flight: a diagnostic beside h2-tls's 128 (the first run's 32-connection
        # upstream pool churned with more; see RESULTS.md).
        return run_h2load(https + "/", duration, streams=4)
    if scenario == "h1-rate":
        return run_h2load(http + "/", duration, streams=1, conns=H1_CONNS, rate=H1_RATE, h1=True)
    if scenario == "h2-tls-rate":
        return run_h2load(https + "/", duration, rate=H2_RATE)
    if scenario == "1m":
        return run_wrk(http + "/1m", BIG_CONNS, duration)
    if scenario in COMPRESSION:
        return run_wrk(http + "/page.html", ZIP_CONNS, duration, header=f"Accept-Encoding: {COMPRESSION[scenario]}")
    if scenario == "post-64k":
        return run_wrk(http + "/sink", POST_CONNS, duration, os.path.join(WORK, "post.lua"))
    if scenario == "handshake":
        return run_handshakes(p["https"], duration)
    if scenario == "resume":
        return run_resume(p["https"], duration)
    if scenario == "ws":
        return run_ws(p["http"], duration)
    raise ValueError(scenario)


# === /proc readings ===

def upstream_counters():
    """(connections accepted, requests) of the upstream nginx so far (stub_status; this request
    and its connection included)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{UP}/up-status", timeout=2).read().decode()
    accepts, _, requests = map(int, body.splitlines()[2].split())
    return accepts, requests


def cpu_times():
    """Per-CPU (busy, total) jiffies from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if re.match(r"cpu\d+ ", line):
                name, *vals = line.split()
                vals = list(map(int, vals[:8]))
                idle = vals[3] + vals[4]
                out[name[3:]] = (sum(vals) - idle, sum(vals))
    return out


def tree(pid):
    """A process and its descendants."""
    out, todo = [], [pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return out


def sleeps(pids):
    """Voluntary context switches of every thread of `pids`: how often they blocked (waiting
    in epoll for the next event) and had to be woken."""
    total = 0
    for pid in pids:
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


UPSTREAM_PID = None


def tcp_out_segments():
    """TCP segments sent so far, machine-wide (/proc/net/snmp OutSegs): every process on
    loopback, so per request it counts the client's, the proxy's and the upstream's segments
    (data and pure ACKs); the same harness for every proxy, so it compares proxies."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])


def busy_share(before, after, cpu):
    b0, t0 = before[cpu]
    b1, t1 = after[cpu]
    return (b1 - b0) / max(1, t1 - t0)


def check_coding(proxy, coding):
    """The proxy really compresses the page with `coding` (else the run measures nothing):
    (errors, the compressed size)."""
    p = PORTS[proxy]
    req = urllib.request.Request(f"http://127.0.0.1:{p['http']}/page.html", headers={"Accept-Encoding": coding})
    with urllib.request.urlopen(req, timeout=5) as resp:
        got, body = resp.headers.get("Content-Encoding"), resp.read()
    page = open(os.path.join(WORK, "page.html"), "rb").read()
    if got != coding:
        return [f"the page came with Content-Encoding {got!r}, not {coding}"], None
    if coding == "gzip" and gzip.decompress(body) != page:
        return ["the gzip body does not decode to the page"], None
    if len(body) * 2 > len(page):
        return [f"{coding}: {len(body)} bytes for a {len(page)}-byte page"], len(body)
    return [], len(body)


def one_run(scenario, proxy):
    px = Proxy(proxy, scenario)
    try:
        checked, zipped = check_coding(proxy, COMPRESSION[scenario]) if scenario in COMPRESSION else ([], None)
        if WARMUP > 0:
            load(scenario, proxy, WARMUP)
            time.sleep(0.5)  # the warm-up's last in-flight requests reach the upstream first
        (conns0, up0) = upstream_counters()
        up_pids, px_pids = tree(UPSTREAM_PID), px.pids()
        cpu0, sys0, wall0, segs0 = px.cpu_seconds(), cpu_times(), time.time(), tcp_out_segments()
        upw0, pxw0 = sleeps(up_pids), sleeps(px_pids)
        res = load(scenario, proxy, DURATION)
        upw1, pxw1 = sleeps(up_pids), sleeps(px_pids)
        cpu1, sys1, wall1, segs1 = px.cpu_seconds(), cpu_times(), time.time(), tcp_out_segments()
        (conns1, up1) = upstream_counters()
        res["rss_mb"] = px.peak_rss_mb()
    finally:
        px.stop()
    res.pop("raw", None)
    wall = wall1 - wall0
    res["sys_share"] = (cpu1[1] - cpu0[1]) / max(1e-9, sum(cpu1) - sum(cpu0))
    cpu0, cpu1 = sum(cpu0), sum(cpu1)
    res["proxy_cpu_s"] = cpu1 - cpu0
    res["proxy_util"] = (cpu1 - cpu0) / wall
    res["proxy_core_busy"] = busy_share(sys0, sys1, PROXY_CPU)
    res["load_core_busy"] = busy_share(sys0, sys1, LOAD_CPU)
    # What the load side (client + upstream) spent per request: it differs by proxy too.
    res["load_cpu_per_10k"] = (sys1[LOAD_CPU][0] - sys0[LOAD_CPU][0]) / TICK / max(1, res["requests"]) * 1e4
    res["rps"] = res["requests"] / res["elapsed"]
    res["segs_per_req"] = (segs1 - segs0) / max(1, res["requests"])
    res["up_sleeps_per_req"] = (upw1 - upw0) / max(1, res["requests"])
    res["proxy_sleeps_per_req"] = (pxw1 - pxw0) / max(1, res["requests"])
    res["cpu_per_10k"] = (cpu1 - cpu0) / max(1, res["requests"]) * 1e4
    # Integrity: the upstream saw every completed request exactly once; requests still in
    # flight when the load generator stopped may have reached it without being counted.
    upstream = up1 - up0 - 1
    # New upstream connections per 10k requests: ~0 with working keep-alive and a big enough pool.
    res["upstream_conns_per_10k"] = (conns1 - conns0 - 1) / max(1, res["requests"]) * 1e4
    res["upstream"] = upstream
    if scenario != "ws":
        extra = upstream - res["requests"]
        if extra < 0 or extra > res["inflight"]:
            res["errors"].append(f"upstream saw {upstream} requests, the client completed "
                                 f"{res['requests']} (at most {res['inflight']} in flight)")
    if res["requests"] == 0:
        res["errors"].append("no request completed")
    res["errors"] += checked
    if zipped is not None:
        res["zipped_bytes"] = zipped
    return res


# === report ===

def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def bottleneck(runs):
    """Which side limited the run: the proxy (its share of its core), the load core, or other
    processes on the proxy's core (busy beyond the proxy's own share: a noisy machine)."""
    util = median([r["proxy_util"] for r in runs])
    core = median([r["proxy_core_busy"] for r in runs])
    load_busy = median([r["load_core_busy"] for r in runs])
    shares = f"proxy {util:.0%}, its core {core:.0%}, load core {load_busy:.0%}"
    if util >= 0.90:
        return f"proxy ({shares})"
    if core - util >= 0.15:
        return f"NOISY: others on the proxy core ({shares})"
    if load_busy >= 0.90:
        return f"load side ({shares})"
    return f"neither ({shares})"


def main():
    for port in [UP, WS_UP] + [p for ports in PORTS.values() for p in ports.values()]:
        if not port_free(port):
            sys.exit(f"port 127.0.0.1:{port} is in use")
    setup_files()
    global UPSTREAM_PID
    upstream = subprocess.Popen(
        pinned(LOAD_CPU, ["nginx", "-p", f"{WORK}/up", "-e", f"{WORK}/up/error.log",
                          "-c", f"{WORK}/up/nginx.conf", "-g", "daemon off;"]),
        start_new_session=True)
    UPSTREAM_PID = upstream.pid
    # WebSocket echo upstream (nginx cannot echo WebSocket messages): weir echo, on the load core.
    ws_upstream = subprocess.Popen(
        pinned(LOAD_CPU, [WEIR, "--log-level", "warn", "echo", "--listen",
                          f"127.0.0.1:{WS_UP}", "--name", "ws"]),
        start_new_session=True) if "ws" in SCENARIOS else None
    results = {s: {p: [] for p in PROXIES} for s in SCENARIOS}
    failures = []
    try:
        wait_port(UP)
        if ws_upstream:
            wait_port(WS_UP)
        with open("/proc/loadavg") as f:
            log(f"load average at start: {f.read().split()[:3]}")
        log(f"{ROUNDS} rounds x {DURATION} s (+{WARMUP} s warm-up); proxy on CPU {PROXY_CPU}, "
            f"load and upstream on CPU {LOAD_CPU}; peers' request headers: {PEER_HEADERS}; work dir {WORK}")
        for rnd in range(ROUNDS):
            for scenario in SCENARIOS:
                order = PROXIES[rnd % len(PROXIES):] + PROXIES[:rnd % len(PROXIES)]
                for proxy in order:
                    if (scenario, proxy) in UNSUPPORTED:
                        continue
                    try:
                        res = one_run(scenario, proxy)
                    except Exception as error:  # a failed run is reported, not fatal
                        res = {"errors": [f"run failed: {error}"]}
                    results[scenario][proxy].append(res)
                    for e in res["errors"]:
                        failures.append(f"round {rnd + 1} {scenario} {proxy}: {e}")
                    log(f"round {rnd + 1} {scenario:9} {proxy:8} "
                        f"{fmt(res.get('rps'), '10.0f')} req/s  p99 {fmt(res.get('p99_ms'), '7.2f')} ms  "
                        f"cpu/10k {fmt(res.get('cpu_per_10k'), '6.3f')} s  "
                        f"util {fmt(res.get('proxy_util'), '4.0%')}  "
                        f"segs/req {fmt(res.get('segs_per_req'), '5.2f')}  "
                        f"sleeps/req up {fmt(res.get('up_sleeps_per_req'), '5.3f')} "
                        f"proxy {fmt(res.get('proxy_sleeps_per_req'), '5.3f')}  "
                        + (f"{res['zipped_bytes']} B/page  " if "zipped_bytes" in res else "")
                        + f"{'FAIL' if res['errors'] else 'ok'}")
    finally:
        for proc in filter(None, (upstream, ws_upstream)):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)

    if os.environ.get("JSON_OUT"):
        with open(os.environ["JSON_OUT"], "w") as f:
            json.dump(results, f, indent=1)

    print(f"\nmedians over {ROUNDS} interleaved rounds of {DURATION} s; CPU = proxy utime+stime, "
          f"(sys) = stime's share of it;\nload s/10k = CPU the load core (client + upstream) spent; "
          f"up c/10k = connections the upstream accepted per 10k requests;\nsegs/req = TCP segments sent "
          f"per request by every process (client, proxy, upstream; /proc/net/snmp); "
          f"nginx's and HAProxy's added request headers: {PEER_HEADERS}")
    print(f"{'scenario':12}{'proxy':9}{'req/s':>10}{'p99 ms':>9}{'CPU s/10k':>11}{'(sys)':>6}{'peak RSS MB':>13}{'load s/10k':>11}{'up c/10k':>9}{'segs/req':>9}"
          f"  bottleneck")
    med = {}
    for scenario in SCENARIOS:
        for proxy in PROXIES:
            runs = [r for r in results[scenario][proxy] if "rps" in r]
            if (scenario, proxy) in UNSUPPORTED:
                print(f"{scenario:12}{proxy:9}{'not supported':>30}")
                continue
            if not runs:
                print(f"{scenario:12}{proxy:9}{'no successful run':>30}")
                continue
            m = {k: median([r.get(k) for r in runs])
                 for k in ("rps", "p99_ms", "cpu_per_10k", "rss_mb", "sys_share", "load_cpu_per_10k",
                           "upstream_conns_per_10k", "segs_per_req")}
            med[(scenario, proxy)] = m
            print(f"{scenario:12}{proxy:9}{fmt(m['rps'], '10.0f')}{fmt(m['p99_ms'], '9.2f')}"
                  f"{fmt(m['cpu_per_10k'], '11.3f')}{fmt(m['sys_share'], '6.0%')}{fmt(m['rss_mb'], '13.1f')}"
                  f"{fmt(m['load_cpu_per_10k'], '11.3f')}{fmt(m['upstream_conns_per_10k'], '9.0f')}"
                  f"{fmt(m['segs_per_req'], '9.2f')}"
                  f"  {bottleneck(runs)}")
    zipped = [(scenario, proxy, median([r.get("zipped_bytes") for r in results[scenario][proxy]]))
              for scenario in SCENARIOS if scenario in COMPRESSION for proxy in PROXIES]
    if zipped:
        page = os.path.getsize(os.path.join(WORK, "page.html"))
        print(f"\ncompressed size of the {page}-byte page: " + ", ".join(
            f"{scenario} {proxy} {fmt(size, '.0f')} B" for scenario, proxy, size in zipped if size))
    if "weir" in PROXIES:
        print("\nweir relative to peers (req/s, p99, CPU per request, peak RSS; CPU < 1 is better)")
        for scenario in SCENARIOS:
            w = med.get((scenario, "weir"))
            for peer in [p for p in PROXIES if p != "weir"]:
                o = med.get((scenario, peer))
                if not w or not o:
                    continue
                print(f"{scenario:12}vs {peer:8} req/s {ratio(w['rps'], o['rps']):>5}  "
                      f"p99 {ratio(w['p99_ms'], o['p99_ms']):>5}  "
                      f"CPU {ratio(w['cpu_per_10k'], o['cpu_per_10k']):>5}  "
                      f"RSS {ratio(w['rss_mb'], o['rss_mb']):>5}")
    print("\nintegrity: " + ("ok (no errors, upstream count matches, h2 negotiated, "
                             "full handshakes only in handshake, every later one resumed in resume)" if not failures else f"{len(failures)} FAILURES"))
    for f in failures:
        print("  " + f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
