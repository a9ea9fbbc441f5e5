"""The soak orchestrator (bench/soak/run.sh): starts the backends and `weir serve --manifests`,
runs the `weir-soak load` clients for SOAK_MINUTES while injecting faults on a schedule (table
swaps, certificate rotation, endpoint churn with draining, an upstream flap), samples weir every
SOAK_INTERVAL seconds, then attributes every client error to a fault and decides PASS or FAIL.

Writes to OUT_DIR: samples.csv (weir's process, sampled), load.csv (the clients, per interval),
faults.jsonl, errors.jsonl, samples.json (everything), summary.txt, weir.log. See bench/README.md.
"""

import base64
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ENV = os.environ
WEIR = ENV["WEIR_BIN"]
SOAK = ENV["SOAK_BIN"]
OUT = ENV["OUT_DIR"]
MINUTES = float(ENV.get("SOAK_MINUTES", "30"))
INTERVAL = float(ENV.get("SOAK_INTERVAL", "10"))
SCALE = float(ENV.get("SOAK_SCALE", "1"))
SWAP_EVERY = float(ENV.get("SWAP_EVERY", "3"))
ROTATE_EVERY = float(ENV.get("ROTATE_EVERY", "60"))
CHURN_EVERY = float(ENV.get("CHURN_EVERY", "20"))
DRAIN = float(ENV.get("DRAIN", "5"))
FLAP_EVERY = float(ENV.get("FLAP_EVERY", "90"))
FLAP_DOWN = float(ENV.get("FLAP_DOWN", "3"))
# Errors this long after a flapped backend is back still count as the flap's (weir's passive
# health checks, reconnects).
FLAP_GRACE = float(ENV.get("FLAP_GRACE", "5"))
# "Nothing grows": the last third's maximum at most this much above the second third's.
GROWTH_TOLERANCE = float(ENV.get("GROWTH_TOLERANCE", "0.10"))
BASE = int(ENV.get("PORT_BASE", "29100"))
PROXY_CPU = ENV.get("PROXY_CPU", "")
LOAD_CPU = ENV.get("LOAD_CPU", "")

HTTP = f"127.0.0.1:{BASE + 80}"
HTTPS = f"127.0.0.1:{BASE + 43}"
ADMIN = f"127.0.0.1:{BASE + 90}"
PORTS = {"web": BASE + 1, "api": BASE + 2, "grpc": BASE + 3}
BACKENDS = {
    "web": ["127.0.0.21", "127.0.0.22"],
    "api": ["127.0.0.31", "127.0.0.32", "127.0.0.33"],
    "grpc": ["127.0.0.41", "127.0.0.42"],
}
# The backends the flap kills and restarts, in turn: one replica of web (h1, h2, WebSocket)
# and one of grpc (unary calls and streams).
FLAP_TARGETS = ["web-1", "grpc-1"]
# What a killed upstream can make a client see; anything else is never explained by a flap.
FLAP_CLASSES = {
    "http_502", "http_503", "http_504", "closed_before_response", "io", "body", "timeout",
    "ws_closed", "ws_close", "ws_send", "grpc_unavailable", "grpc_internal", "grpc_unknown",
    "grpc_cancelled", "grpc_stream_ended", "grpc_send",
}
GROWTH = [("rss_kb", 4096), ("fds", 20), ("tasks", 20), ("threads", 2)]

MANIFESTS = os.path.join(OUT, "manifests")
PKI = os.path.join(OUT, "pki")
NS = "soak"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pinned(cpu, argv):
    return ["taskset", "-c", cpu] + argv if cpu else argv


def write_atomic(name, text):
    path = os.path.join(MANIFESTS, name)
    tmp = os.path.join(MANIFESTS, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# === manifests ===

def make_ca():
    os.makedirs(PKI, exist_ok=True)
    key, cert = os.path.join(PKI, "ca.key"), os.path.join(PKI, "ca.pem")
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key)
    openssl("req", "-x509", "-new", "-key", key, "-out", cert, "-days", "2", "-subj", "/CN=weir soak CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    return cert


def secret_yaml(n):
    """A new key and leaf for the three hosts, signed by the soak CA, as a TLS Secret."""
    key, csr, cert = (os.path.join(PKI, f"leaf{n}.{ext}") for ext in ("key", "csr", "pem"))
    ext = os.path.join(PKI, "leaf.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:web.soak.test,DNS:api.soak.test,DNS:grpc.soak.test\n")
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key)
    openssl("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN=soak leaf {n}")
    openssl("x509", "-req", "-in", csr, "-CA", os.path.join(PKI, "ca.pem"), "-CAkey",
            os.path.join(PKI, "ca.key"), "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext)
    b64 = lambda p: base64.b64encode(open(p, "rb").read()).decode()
    return (f"apiVersion: v1\nkind: Secret\nmetadata: {{name: soak-tls, namespace: {NS}}}\n"
            f"type: kubernetes.io/tls\ndata:\n  tls.crt: {b64(cert)}\n  tls.key: {b64(key)}\n")


def service_yaml(name, endpoints):
    """A Service and its EndpointSlice; `endpoints` maps an address to ready/terminating."""
    lines = [
        f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {NS}}}\n"
        f"spec:\n  ports: [{{name: main, port: 80, targetPort: {PORTS[name]}}}]\n---\n"
        f"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n"
        f"  namespace: {NS}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\n"
        f"ports: [{{name: main, port: {PORTS[name]}, protocol: TCP}}]\nendpoints:\n"
    ]
    for addr, state in endpoints.items():
        if state == "ready":
            cond = "{ready: true, serving: true, terminating: false}"
        else:
            cond = "{ready: false, serving: true, terminating: true}"
        lines.append(f"- addresses: [\"{addr}\"]\n  conditions: {cond}\n")
    return "".join(lines)


def ingress_yaml(generation):
    """The Ingresses the load uses; `generation` adds a path, so each rewrite changes the table."""
    rule = lambda host, svc, extra="": (
        f"  - host: {host}\n    http:\n      paths:\n"
        f"      - {{path: /, pathType: Prefix, backend: {{service: {{name: {svc}, port: {{number: 80}}}}}}}}\n"
        + extra)
    gen = (f"      - {{path: /gen-{generation}, pathType: Prefix, backend: {{service: {{name: api, "
           f"port: {{number: 80}}}}}}}}\n")
    return (
        f"apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: main\n  namespace: {NS}\n"
        f"  annotations: {{nginx.ingress.kubernetes.io/ssl-redirect: \"false\"}}\nspec:\n"
        f"  ingressClassName: weir\n  tls:\n  - hosts: [web.soak.test, api.soak.test]\n"
        f"    secretName: soak-tls\n  rules:\n"
        + rule("web.soak.test", "web", gen) + rule("api.soak.test", "api")
        + f"---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: grpc\n"
        f"  namespace: {NS}\n  annotations:\n    nginx.ingress.kubernetes.io/backend-protocol: GRPC\n"
        f"    nginx.ingress.kubernetes.io/ssl-redirect: \"false\"\nspec:\n  ingressClassName: weir\n"
        f"  tls:\n  - hosts: [grpc.soak.test]\n    secretName: soak-tls\n  rules:\n"
        + rule("grpc.soak.test", "grpc"))


def extra_yaml(count, generation):
    """`count` more Ingresses no client uses (hosts come and go with the swaps)."""
    docs = []
    for i in range(count):
        docs.append(
            f"apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: extra-{i}\n"
            f"  namespace: {NS}\nspec:\n  ingressClassName: weir\n  rules:\n"
            f"  - host: extra-{i}-{generation}.soak.test\n    http:\n      paths:\n"
            f"      - {{path: /e{i}, pathType: Exact, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}\n")
    return "---\n".join(docs)


CLASS_YAML = ("apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: weir\n"
              "spec:\n  controller: weir.dev/ingress-controller\n")


# === processes ===

class Procs:
    def __init__(self):
        self.procs = {}
        self.logs = {}

    def start(self, name, argv, cpu=LOAD_CPU):
        logf = self.logs.get(name) or open(os.path.join(OUT, f"{name}.log"), "ab")
        self.logs[name] = logf
        self.procs[name] = subprocess.Popen(pinned(cpu, argv), stdout=logf, stderr=logf,
                                            stdin=subprocess.DEVNULL)
        return self.procs[name]

    def start_backend(self, name):
        svc, i = name.rsplit("-", 1)
        addr = f"{BACKENDS[svc][int(i)]}:{PORTS[svc]}"
        if svc == "grpc":
            argv = [SOAK, "grpc-server", "--listen", addr, "--name", name]
        else:
            argv = [WEIR, "echo", "--listen", addr, "--name", name, "--log-level", "warn"]
        self.start(name, argv)
        wait_port(addr, 10)

    def kill(self, name, sig=signal.SIGKILL):
        proc = self.procs.get(name)
        if proc and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self):
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM)


def wait_port(addr, seconds):
    host, port = addr.rsplit(":", 1)
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {addr} after {seconds} s")


def scrape():
    """weir's /metrics as {name: value} (unlabelled samples only)."""
    out = {}
    with urllib.request.urlopen(f"http://{ADMIN}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("#") or "{" in line:
                continue
            parts = line.split()
            if len(parts) == 2:
                try:
                    out[parts[0]] = float(parts[1])
                except ValueError:
                    pass
    return out


def tcp_conns(local_ports, remote_ports):
    """Established TCP connections: (to weir's listeners, from weir to the backends)."""
    to_weir = to_backends = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "01":
                continue
            lport, rport = int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16)
            if lport in local_ports:
                to_weir += 1
            if rport in remote_ports:
                to_backends += 1
    return to_weir, to_backends


def sample(pid):
    status = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        status[k] = v.split()
    fds = os.listdir(f"/proc/{pid}/fd")
    sockets = 0
    for fd in fds:
        try:
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    metrics = scrape()
    to_weir, to_backends = tcp_conns({BASE + 80, BASE + 43}, set(PORTS.values()))
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return {
        "t": time.time(),
        "rss_kb": int(status["VmRSS"][0]),
        "hwm_kb": int(status["VmHWM"][0]),
        "threads": int(status["Threads"][0]),
        "fds": len(fds),
        "sockets": sockets,
        "tasks": int(metrics.get("weir_runtime_alive_tasks", -1)),
        "client_conns": to_weir,
        "upstream_conns": to_backends,
        "table_version": int(metrics.get("weir_routing_table_version", -1)),
        "reloads": int(metrics.get("weir_reloads_total", -1)),
        "reload_failures": int(metrics.get("weir_reload_failures_total", -1)),
        "manifest_errors": int(metrics.get("weir_manifest_errors", -1)),
        "cpu_s": (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"),
    }


# === the run ===

def main():
    os.makedirs(MANIFESTS, exist_ok=True)
    make_ca()
    endpoints = {svc: {a: "ready" for a in addrs} for svc, addrs in BACKENDS.items()}
    write_atomic("class.yaml", CLASS_YAML)
    for svc in BACKENDS:
        write_atomic(f"{svc}.yaml", service_yaml(svc, endpoints[svc]))
    rotation = 0
    write_atomic("secret.yaml", secret_yaml(rotation))
    generation = 0
    write_atomic("ingress.yaml", ingress_yaml(generation))

    procs = Procs()
    faults = []
    fault_log = open(os.path.join(OUT, "faults.jsonl"), "w")

    def fault(kind, **detail):
        event = {"t": time.time(), "kind": kind, **detail}
        faults.append(event)
        fault_log.write(json.dumps(event) + "\n")
        fault_log.flush()
        return event

    try:
        for svc, addrs in BACKENDS.items():
            for i in range(len(addrs)):
                procs.start_backend(f"{svc}-{i}")
        weir = procs.start("weir", [WEIR, "serve", "--manifests", MANIFESTS, "--listen-http", HTTP,
                                    "--listen-https", HTTPS, "--listen-admin", ADMIN,
                                    "--access-log", "off"], cpu=PROXY_CPU)
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{ADMIN}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline or weir.poll() is not None:
                raise SystemExit("weir did not become ready; see weir.log")
            time.sleep(0.1)
        log(f"weir ready (pid {weir.pid}); load for {MINUTES} min, sampling every {INTERVAL} s")

        seconds = int(MINUTES * 60)
        start = time.time()
        load = procs.start("load", [SOAK, "load", "--http", HTTP, "--https", HTTPS, "--ca",
                                    os.path.join(PKI, "ca.pem"), "--seconds", str(seconds),
                                    "--interval", str(INTERVAL), "--out", OUT, "--scale", str(SCALE)])
        end = start + seconds
        samples = [{**sample(weir.pid), "before": True}]
        due = {"sample": start + INTERVAL, "swap": start + SWAP_EVERY, "rotate": start + ROTATE_EVERY,
               "churn": start + CHURN_EVERY, "flap": start + FLAP_EVERY}
        pending = []  # (time, action, args): drain ends, flapped backends coming back
        swap_step = churn_step = flap_step = 0
        while True:
            now = time.time()
            if now >= end or load.poll() is not None or weir.poll() is not None:
                break
            for when, action, arg in sorted(pending):
                if when <= now:
                    pending.remove((when, action, arg))
                    if action == "remove":
                        svc, addr = arg
                        del endpoints[svc][addr]
                        write_atomic(f"{svc}.yaml", service_yaml(svc, endpoints[svc]))
                        fault("churn", step="remove", service=svc, endpoint=addr)
                    elif action == "restart":
                        procs.start_backend(arg)
                        for f in reversed(faults):
                            if f["kind"] == "flap" and f["backend"] == arg:
                                f["t_up"] = time.time()
                                break
                        fault("flap-up", backend=arg)
            if now >= due["sample"]:
                samples.append(sample(weir.pid))
                due["sample"] += INTERVAL
            if now >= due["swap"]:
                swap_step += 1
                kind = swap_step % 3
                if kind == 0:
                    generation += 1
                    write_atomic("ingress.yaml", ingress_yaml(generation))
                    fault("swap", step="rewrite", generation=generation)
                elif kind == 1:
                    count = swap_step % 5 + 1
                    write_atomic("extra.yaml", extra_yaml(count, swap_step))
                    fault("swap", step="add", ingresses=count)
                else:
                    os.remove(os.path.join(MANIFESTS, "extra.yaml"))
                    fault("swap", step="delete")
                due["swap"] += SWAP_EVERY
            if now >= due["rotate"]:
                rotation += 1
                write_atomic("secret.yaml", secret_yaml(rotation))
                fault("rotate", n=rotation)
                due["rotate"] += ROTATE_EVERY
            if now >= due["churn"]:
                # api endpoints in turn: drain one (terminating, still serving), remove it after
                # DRAIN s, bring it back at the next churn.
                svc, addrs = "api", BACKENDS["api"]
                missing = [a for a in addrs if a not in endpoints[svc]]
                if missing:
                    endpoints[svc][missing[0]] = "ready"
                    endpoints[svc] = {a: endpoints[svc][a] for a in addrs if a in endpoints[svc]}
                    write_atomic(f"{svc}.yaml", service_yaml(svc, endpoints[svc]))
                    fault("churn", step="add", service=svc, endpoint=missing[0])
                else:
                    addr = addrs[churn_step % len(addrs)]
                    churn_step += 1
                    endpoints[svc][addr] = "terminating"
                    write_atomic(f"{svc}.yaml", service_yaml(svc, endpoints[svc]))
                    fault("churn", step="drain", service=svc, endpoint=addr)
                    pending.append((time.time() + DRAIN, "remove", (svc, addr)))
                due["churn"] += CHURN_EVERY
            if now >= due["flap"]:
                target = FLAP_TARGETS[flap_step % len(FLAP_TARGETS)]
                flap_step += 1
                procs.kill(target)
                fault("flap", backend=target, service=target.rsplit("-", 1)[0])
                pending.append((time.time() + FLAP_DOWN, "restart", target))
                due["flap"] += FLAP_EVERY
            next_due = min(list(due.values()) + [p[0] for p in pending] + [end])
            time.sleep(max(0.0, min(0.5, next_due - time.time())))

        for when, action, arg in pending:  # a backend still down comes back for the last sample
            if action == "restart":
                procs.start_backend(arg)
        if weir.poll() is not None:
            log(f"weir exited with {weir.returncode}")
        try:
            load.wait(60)
        except subprocess.TimeoutExpired:
            load.kill()
        weir_rc = weir.poll()
        if weir_rc is None:
            # After the load: what weir holds once every client is gone.
            time.sleep(2)
            samples.append({**sample(weir.pid), "after": True})
    finally:
        procs.stop_all()
    fault_log.close()
    report(samples, faults, weir_rc, start)


# === the report ===

def read_jsonl(name):
    path = os.path.join(OUT, name)
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def explain(error, faults):
    """The fault that explains a client error, or None."""
    for f in faults:
        if f["kind"] != "flap":
            continue
        t_up = f.get("t_up", f["t"] + FLAP_DOWN)
        if not (f["t"] - 1.0 <= error["t"] <= t_up + FLAP_GRACE):
            continue
        if error["service"] != f["service"] or error["class"] not in FLAP_CLASSES:
            continue
        if error.get("backend") and error["backend"] != f["backend"]:
            continue
        return f
    return None


def nearest(error, faults):
    """The closest fault of each kind before the error, in seconds: for unexplained errors."""
    out = {}
    for f in faults:
        dt = error["t"] - f["t"]
        if dt >= 0 and (f["kind"] not in out or dt < out[f["kind"]]):
            out[f["kind"]] = round(dt, 2)
    return out


def growth(samples, key, slack):
    """Second third vs last third of the run (the first third is warm-up)."""
    n = len(samples)
    if n < 6:
        return None, f"{key}: too few samples ({n})"
    second = [s[key] for s in samples[n // 3: 2 * n // 3]]
    last = [s[key] for s in samples[2 * n // 3:]]
    limit = max(second) * (1 + GROWTH_TOLERANCE) + slack
    ok = max(last) <= limit
    word = "ok" if ok else "GROWS"
    return ok, (f"{key}: max {max(second)} in the second third, {max(last)} in the last "
                f"(limit {limit:.0f}): {word}")


def report(samples, faults, weir_rc, start):
    intervals = read_jsonl("intervals.jsonl")
    errors = read_jsonl("errors.jsonl")
    try:
        summary = json.load(open(os.path.join(OUT, "summary.json")))
    except (OSError, ValueError):
        summary = {"protos": {}, "certs_first_seen": []}
    protos = ["h1", "h1-new", "h1-tls", "h2-tls", "ws", "grpc-unary", "grpc-stream"]

    with open(os.path.join(OUT, "samples.csv"), "w", newline="") as f:
        fields = [k for k in samples[0] if k not in ("t", "before", "after")]
        w = csv.DictWriter(f, fieldnames=["t_s", "phase"] + fields, extrasaction="ignore")
        w.writeheader()
        for s in samples:
            phase = "before" if s.get("before") else "after" if s.get("after") else "load"
            w.writerow({"t_s": round(s["t"] - start, 1), "phase": phase, **s})
    with open(os.path.join(OUT, "load.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s"] + [f"{p}_{m}" for p in protos for m in ("requests", "errors", "p99_ms", "conns")])
        for it in intervals:
            row = [round(it["t"] - start, 1)]
            for p in protos:
                d = it["protos"].get(p, {})
                row += [d.get("requests", 0), sum(d.get("errors", {}).values()), d.get("p99_ms"), d.get("conns")]
            w.writerow(row)

    counts = {}
    for f in faults:
        key = f["kind"] if f["kind"] not in ("swap", "churn") else f"{f['kind']}:{f['step']}"
        counts[key] = counts.get(key, 0) + 1
    explained, unexplained = {}, []
    for e in errors:
        f = explain(e, faults)
        if f:
            key = f"flap {f['backend']}"
            explained.setdefault(key, {}).setdefault(f"{e['proto']} {e['class']}", 0)
            explained[key][f"{e['proto']} {e['class']}"] += 1
        else:
            unexplained.append({**e, "nearest_faults": nearest(e, faults)})

    lines = []
    duration = (samples[-1]["t"] - samples[0]["t"]) if samples else 0
    lines.append(f"weir soak: {duration / 60:.1f} min, {len(samples)} samples every {INTERVAL:g} s, "
                 f"load scale {SCALE:g}")
    lines.append("")
    lines.append("weir over time (every sample; tasks = weir_runtime_alive_tasks):")
    hdr = ["t_s", "rss_kb", "fds", "threads", "tasks", "client_conns", "upstream_conns", "table_version"]
    lines.append("  " + " ".join(f"{h:>14}" for h in hdr))
    step = max(1, len(samples) // 30)
    shown = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    for s in shown:
        vals = [round(s["t"] - start)] + [s[h] for h in hdr[1:]]
        lines.append("  " + " ".join(f"{v:>14}" for v in vals))
    lines.append("")
    lines.append("clients (per protocol over the run; p99 = median and max of the per-interval p99s):")
    lines.append(f"  {'protocol':<12} {'requests':>9} {'errors':>7} {'p99 med ms':>11} {'p99 max ms':>11}  errors by class")
    for p in protos:
        tot = summary["protos"].get(p, {"ok": 0, "errors": {}})
        errs = sum(tot["errors"].values())
        p99s = sorted(it["protos"][p]["p99_ms"] for it in intervals
                      if it["protos"].get(p, {}).get("p99_ms") is not None)
        med = p99s[len(p99s) // 2] if p99s else None
        mx = p99s[-1] if p99s else None
        fmt = lambda v: f"{v:.1f}" if v is not None else "-"
        lines.append(f"  {p:<12} {tot['ok'] + errs:>9} {errs:>7} {fmt(med):>11} {fmt(mx):>11}  "
                     f"{json.dumps(tot['errors'], sort_keys=True) if errs else ''}")
    lines.append("")
    lines.append("faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    certs = len(summary.get("certs_first_seen", []))
    lines.append(f"certificates seen by the clients: {certs} (rotations: {counts.get('rotate', 0)}, plus the first)")
    if samples:
        lines.append(f"tables published: {samples[-1]['reloads']} (reload failures {samples[-1]['reload_failures']}, "
                     f"manifest errors {samples[-1]['manifest_errors']})")
    lines.append(f"errors explained by faults: {sum(sum(v.values()) for v in explained.values())}")
    for k, v in sorted(explained.items()):
        lines.append(f"  {k}: " + ", ".join(f"{c} {n}" for c, n in sorted(v.items())))
    lines.append(f"unexplained errors: {len(unexplained)}")
    for e in unexplained[:20]:
        lines.append(f"  t+{e['t'] - start:.1f}s {e['proto']} {e['class']} backend={e.get('backend')} "
                     f"nearest faults (s before): {e['nearest_faults']} -- {e['detail'][:160]}")

    reasons = []
    before = [s for s in samples if s.get("before")]
    after = [s for s in samples if s.get("after")]
    loaded = [s for s in samples if not s.get("before") and not s.get("after")]
    if before and after:
        lines.append("")
        lines.append("idle, before the load and 2 s after it stopped: " + ", ".join(
            f"{k} {before[0][k]} -> {after[0][k]}" for k in ("rss_kb", "fds", "tasks", "threads", "upstream_conns")))
    lines.append("")
    lines.append("growth (samples under load, after warm-up; limit = second third's max x "
                 f"{1 + GROWTH_TOLERANCE:.2f} + slack):")
    for key, slack in GROWTH:
        ok, text = growth(loaded, key, slack)
        lines.append("  " + text)
        if ok is False:
            reasons.append(f"{key} grows")
        if ok is None:
            reasons.append(text)
    if unexplained:
        reasons.append(f"{len(unexplained)} unexplained client errors")
    for p in protos:
        if summary["protos"].get(p, {}).get("ok", 0) == 0:
            reasons.append(f"no successful {p} exchange")
    for kind in ("swap:rewrite", "rotate", "churn:drain", "flap"):
        if counts.get(kind, 0) == 0:
            reasons.append(f"no {kind} fault injected (run longer)")
    if certs < counts.get("rotate", 0):
        reasons.append(f"clients saw {certs} certificates after {counts.get('rotate', 0)} rotations")
    if samples and (samples[-1]["reload_failures"] != 0 or samples[-1]["manifest_errors"] != 0):
        reasons.append("weir rejected a table or a manifest")
    if samples and samples[-1]["tasks"] < 0:
        reasons.append("weir_runtime_alive_tasks missing from /metrics")
    if weir_rc is not None:
        reasons.append(f"weir exited during the run ({weir_rc})")
    verdict = "PASS" if not reasons else "FAIL: " + "; ".join(reasons)
    lines.append("")
    lines.append(f"verdict: {verdict}")

    text = "\n".join(lines) + "\n"
    open(os.path.join(OUT, "summary.txt"), "w").write(text)
    json.dump({"samples": samples, "intervals": intervals, "faults": faults, "errors": errors,
               "unexplained": unexplained, "explained": explained, "verdict": verdict},
              open(os.path.join(OUT, "samples.json"), "w"), indent=1)
    print(text)
    sys.exit(0 if not reasons else 1)


if __name__ == "__main__":
    main()
