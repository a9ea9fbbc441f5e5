"""Orchestrator of bench/scale/run.sh (run that, not this)."""

import http.client
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.environ["WORKDIR"]
WEIR = os.environ["WEIR_BIN"]
INGRESSES = int(os.environ.get("INGRESSES", "10000"))
SERVICES = int(os.environ.get("SERVICES", "20000"))
ENDPOINTS = int(os.environ.get("ENDPOINTS", "100000"))
CHANGES = int(os.environ.get("CHANGES", "100"))
CHURN = int(os.environ.get("CHURN", "1000"))
CHURN_INTERVAL = int(os.environ.get("CHURN_INTERVAL_MS", "50")) / 1e3
FULL = int(os.environ.get("FULL", "10"))
HTTP, ADMIN, LIVE = 28380, 28390, 28950    # loopback only
# weir's "routing table published" line: version, Ingresses translated again, the wait for the
# burst of notifications to settle (debounce), the directory scan, translate, and translate +
# compile + swap (total).
PUBLISHED = re.compile(r"routing table published.*?version=(\d+).*?retranslated=(\d+).*?debounce_ms=([\d.]+)"
                       r".*?scan_ms=([\d.]+).*?translate_ms=([\d.]+).*?total_ms=([\d.]+)")
FIELDS = ("version", "retranslated", "debounce", "scan", "translate", "total")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def ingress(name, host, paths):
    items = "\n".join(f"      - {{path: {p}, pathType: Prefix, backend: {{service: {{name: live, port: {{number: 80}}}}}}}}"
                      for p in paths)
    return f"""apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: {name}, namespace: live}}
spec:
  rules:
  - host: {host}
    http:
      paths:
{items}
"""


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        text = f.read()
    get = lambda key: int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) / 1024  # noqa: E731
    return get("VmRSS"), get("VmHWM")


def published(logfile, since=0):
    with open(logfile) as f:
        f.seek(since)
        text = f.read()
    return [dict(zip(FIELDS, (float(x) for x in m.groups()))) for m in PUBLISHED.finditer(text)]


def summary(values):
    return f"p50 {statistics.median(values):.1f} ms, p99 {pct(values, 0.99):.1f} ms, max {max(values):.1f} ms"


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def main():
    manifests = os.path.join(WORK, "manifests")
    t = time.time()
    out = subprocess.run(["python3", os.path.join(HERE, "gen.py"), manifests, str(INGRESSES),
                          str(SERVICES), str(ENDPOINTS), f"127.0.0.1:{LIVE}"],
                         check=True, capture_output=True, text=True).stdout.strip()
    log(f"generated {out} in {time.time() - t:.1f} s")
    t = time.time()
    subprocess.run([WEIR, "--log-level", "error", "check", "--manifests", manifests],
                   check=True, capture_output=True)
    check_s = time.time() - t
    echo = subprocess.Popen([WEIR, "--log-level", "warn", "echo", "--listen", f"127.0.0.1:{LIVE}",
                             "--name", "live"])
    logfile = os.path.join(WORK, "weir.log")
    weir_log = open(logfile, "w")
    started = time.time()
    weir = subprocess.Popen([WEIR, "--log-level", "warn,weir::serve=info", "serve",
                             "--manifests", manifests, "--listen-http", f"127.0.0.1:{HTTP}",
                             "--listen-https", "127.0.0.1:28393", "--listen-admin",
                             f"127.0.0.1:{ADMIN}"], stdout=weir_log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, NO_COLOR="1"))
    try:
        deadline = started + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}/readyz", timeout=1).read()
                break
            except Exception:
                if time.time() > deadline or weir.poll() is not None:
                    sys.exit(f"weir did not become ready; see {logfile}")
                time.sleep(0.01)
        ready_s = time.time() - started
        first = published(logfile)[0]
        time.sleep(1)
        rss, hwm = rss_mb(weir.pid)
        print(f"weir scale benchmark: {out}")
        print(f"start to ready (read + parse YAML, translate, compile, swap): {ready_s * 1e3:.0f} ms")
        print(f"weir check (read + parse YAML, translate; a separate process): {check_s * 1e3:.0f} ms")
        print(f"first table: translate {first['translate']:.0f} ms, translate + compile + swap "
              f"{first['total']:.0f} ms (weir's log)")
        print(f"RSS after load: {rss:.0f} MB (peak {hwm:.0f} MB)")

        # Change propagation: one new file per change, one new host; poll until it is routed.
        conn = http.client.HTTPConnection("127.0.0.1", HTTP, timeout=5)
        probe = os.path.join(manifests, "zz-probe.yaml")
        latencies = []
        pos = os.path.getsize(logfile)
        for i in range(CHANGES):
            host = f"probe-{i}.bench.local"
            t0 = time.perf_counter()
            write_atomic(probe, ingress("probe", host, ["/"]))
            while True:
                conn.request("GET", "/", headers={"Host": host})
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    break
                if time.perf_counter() - t0 > 30:
                    sys.exit(f"change {i} not routed within 30 s")
                time.sleep(0.002)
            latencies.append((time.perf_counter() - t0) * 1e3)
            time.sleep(0.05)
        time.sleep(0.5)
        tables = published(logfile, pos)
        if latencies:
            print(f"change propagation over {CHANGES} changes (a new file written -> first request routed "
                  f"by its host, polled every 2 ms): {summary(latencies)}")
            if len(tables) == len(latencies):
                waits = [t["debounce"] for t in tables]
                seen = [lat - t["debounce"] for lat, t in zip(latencies, tables)]
                print(f"  waiting for the burst to settle (weir's debounce_ms): {summary(waits)}")
                print(f"  after it is seen (propagation minus that wait): {summary(seen)}")
            else:
                print(f"  ({len(tables)} tables for {len(latencies)} changes: wait not separable)")
            print(f"  rebuild per change (weir's log, {len(tables)} tables): scan {summary([t['scan'] for t in tables])};"
                  f" translate {summary([t['translate'] for t in tables])};"
                  f" translate + compile + swap {summary([t['total'] for t in tables])};"
                  f" Ingresses translated again: max {max(t['retranslated'] for t in tables):.0f}")

        # Full rebuilds: a changed IngressClass makes weir translate and compile everything.
        base = os.path.join(manifests, "00-base.yaml")
        with open(base) as f:
            base_text = f.read()
        pos = os.path.getsize(logfile)
        for i in range(FULL):
            write_atomic(base, base_text.replace("name: weir\n", f"name: weir\n  labels: {{rebuild: \"{i}\"}}\n", 1))
            time.sleep(1.0)
        tables = published(logfile, pos)
        if tables:
            print(f"full rebuilds ({len(tables)} IngressClass edits, weir's log): "
                  f"translate {summary([t['translate'] for t in tables])}; "
                  f"translate + compile + swap {summary([t['total'] for t in tables])}")

        rss, hwm = rss_mb(weir.pid)
        print(f"RSS after the changes: {rss:.0f} MB (peak {hwm:.0f} MB)")

        # Churn under load: a route file rewritten every CHURN_INTERVAL while wrk hits a live host.
        churn = os.path.join(manifests, "zz-churn.yaml")
        pos = os.path.getsize(logfile)
        duration = int(CHURN * CHURN_INTERVAL) + 3
        wrk = subprocess.Popen(["wrk", "-t1", "-c8", f"-d{duration}s", "--timeout", "5s",
                                "-H", "Host: live.bench.local", f"http://127.0.0.1:{HTTP}/"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(1)
        for i in range(CHURN):
            write_atomic(churn, ingress("churn", f"churn-{i % 7}.bench.local",
                                        [f"/v{i}", f"/w{i % 13}"]))
            time.sleep(CHURN_INTERVAL)
        wout = wrk.communicate(timeout=duration + 30)[0]
        swaps = published(logfile, pos)
        requests = int(re.search(r"(\d+) requests in", wout).group(1))
        bad = re.search(r"Non-2xx or 3xx responses: (\d+)", wout)
        sock = re.search(r"Socket errors: (.*)", wout)
        failed = int(bad.group(1)) if bad else 0
        print(f"churn: {CHURN} file rewrites every {CHURN_INTERVAL * 1e3:.0f} ms -> {len(swaps)} "
              f"table swaps under wrk -c8: {requests} requests, {failed} non-2xx"
              f"{', socket errors: ' + sock.group(1) if sock else ', 0 socket errors'}")
        rss, hwm = rss_mb(weir.pid)
        print(f"RSS at the end: {rss:.0f} MB (peak {hwm:.0f} MB)")
        if failed or sock:
            print("FAILED: requests failed during route changes")
            sys.exit(1)
    finally:
        for proc in (weir, echo):
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
