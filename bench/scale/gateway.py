"""Gateway API variant of bench/scale (run `MODE=gateway bench/scale/run.sh`, not this).

Against a real etcd + kube-apiserver (scripts/kube-apiserver.sh, cached build), in a private
network namespace (run.sh starts it with `unshare --net`; its `lo` carries 10.0.0.0/8 because the
API server refuses endpoints on 127.0.0.0/8): the repository's Gateway API CRDs, one
GatewayClass, one Gateway (one HTTP listener, routes from all namespaces), SERVICES Services with
Endpoints naming BACKENDS `weir echo` processes, then `weir serve --kubeconfig`, then ROUTES
HTTPRoutes created through the API (CREATORS at once), each with its own hostname and three rules
(`/a`, `/b`, a header match) to three different Services.

Measured, from the first create:
- all created (the API server's pace);
- all routed: every route's `/a` answered by the right backend (a poller walks the routes not
  yet routed, over and over);
- attachedRoutes: the Gateway's listener says ROUTES;
- all Accepted: every route's status has weir's parent entry Accepted for its generation (a
  watch on HTTPRoutes);
then CHANGES single edits (one route's hostname changed): time to the new hostname routed (polled
every 2 ms) and to the route's status Accepted for the new generation; and, from weir's log, the
translation per table (`routing table published`) and the status writes per change.

Then (RESTART=1, the default) the restart case, twice: weir stopped and a new one started with
every route already in the API server, first with the statuses the previous weir wrote (a
rolling restart: nothing to write), then with every status emptied beforehand (a first install
on existing routes). From the new weir's start: the first table (`/readyz`), all routed (8
pollers over the routes), the Gateway's attachedRoutes = ROUTES, every route Accepted for its
generation, the status writes and translate times from its log.
"""

import http.client
import json
import os
import random
import re
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
WORK = os.environ["WORKDIR"]
WEIR = os.environ["WEIR_BIN"]
ROUTES = int(os.environ.get("ROUTES", "5000"))
SERVICES = int(os.environ.get("SERVICES", "1000"))
NAMESPACES = int(os.environ.get("NAMESPACES", "10"))
BACKENDS = int(os.environ.get("BACKENDS", "8"))
CHANGES = int(os.environ.get("CHANGES", "20"))
CREATORS = int(os.environ.get("CREATORS", "8"))
SAMPLE = int(os.environ.get("SAMPLE", "200"))
BACKEND_IP = "10.244.7.1"
HTTP, ADMIN, ECHO = 28480, 28490, 28500
GROUP = "/apis/gateway.networking.k8s.io/v1"
PUBLISHED = re.compile(r"routing table published.*?version=(\d+).*?translate_ms=([\d.]+).*?total_ms=([\d.]+)")
STATUS_LINE = "Gateway API status updated"
# weir's --log-level (WEIR_LOG_LEVEL: e.g. add `kube_client=debug` for every API request).
LOG_LEVEL = os.environ.get("WEIR_LOG_LEVEL", "warn,weir::serve=info,weir::status_gateway=info")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def summary(values):
    return f"p50 {statistics.median(values):.0f} ms, p90 {pct(values, 0.9):.0f} ms, max {max(values):.0f} ms"


# === the API ===

class Api:
    """A minimal client of the API server: one keep-alive connection per thread."""

    def __init__(self, port, token):
        self.port, self.token = port, token
        self.ctx = ssl._create_unverified_context()  # loopback, the API server's own certificate
        self.local = threading.local()

    def conn(self):
        c = getattr(self.local, "conn", None)
        if c is None:
            c = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=60)
            self.local.conn = c
        return c

    def call(self, method, path, body=None, content_type="application/json", ok=(200, 201)):
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": content_type}
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        for attempt in range(5):
            try:
                c = self.conn()
                c.request(method, path, body=body, headers=headers)
                resp = c.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                self.local.conn = None
                time.sleep(0.2 * (attempt + 1))
                continue
            if resp.status == 429 or resp.status >= 500:
                time.sleep(0.2 * (attempt + 1))
                continue
            if resp.status not in ok:
                raise RuntimeError(f"{method} {path}: {resp.status} {data[:300]!r}")
            return json.loads(data) if data else None
        raise RuntimeError(f"{method} {path}: no answer")

    def stream(self, path):
        c = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=3600)
        c.request("GET", path, headers={"Authorization": f"Bearer {self.token}"})
        resp = c.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"watch {path}: {resp.status}")
        resp.connection = c  # to shut it down from another thread
        return resp


def start_apiserver():
    kube = os.path.join(WORK, "kube")
    out = subprocess.run([os.path.join(ROOT, "scripts/kube-apiserver.sh"), "start", kube], check=True,
                         capture_output=True, text=True)
    with open(os.path.join(kube, "admin-token")) as f:
        token = f.read().strip()
    with open(os.path.join(kube, "kubeconfig")) as f:
        port = int(re.search(r"https://127.0.0.1:(\d+)", f.read()).group(1))
    kubeconfig = os.path.join(kube, "kubeconfig-weir")
    with open(kubeconfig, "w") as f:
        f.write(f"""apiVersion: v1
kind: Config
clusters:
- name: bench
  cluster: {{server: "https://127.0.0.1:{port}", certificate-authority: "{kube}/certs/apiserver.crt"}}
users:
- name: admin
  user: {{token: "{token}"}}
contexts:
- name: bench
  context: {{cluster: bench, user: admin}}
current-context: bench
""")
    log(out.stderr.strip().splitlines()[-1])
    return kube, Api(port, token), kubeconfig


def install_crds(api):
    crds = os.path.join(ROOT, "examples/kubernetes/gateway-api/crds")
    for name in sorted(os.listdir(crds)):
        with open(os.path.join(crds, name)) as f:
            api.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", f.read(),
                     content_type="application/yaml")
    deadline = time.time() + 60
    while True:
        try:
            served = {r["name"] for r in api.call("GET", GROUP)["resources"]}
            if {"gatewayclasses", "gateways", "httproutes"} <= served:
                return
        except RuntimeError:
            pass
        if time.time() > deadline:
            sys.exit("the Gateway API CRDs are not served after 60 s")
        time.sleep(0.2)


# === the objects ===

def ns_of(i):
    return f"gw-{i % NAMESPACES}"


def per_ns():
    return max(3, SERVICES // NAMESPACES)


def backend_of(svc, ns_index):
    """The echo backend (its name) behind Service `s-{svc}` of namespace `gw-{ns_index}`."""
    return f"e{(svc + ns_index) % BACKENDS}"


def route_services(i):
    """The Services of route i's three rules (`/a`, `/b`, header `x-lane: c`)."""
    n = per_ns()
    return [(i // NAMESPACES + k) % n for k in range(3)]


def expected(i, rule):
    return backend_of(route_services(i)[rule], i % NAMESPACES)


def httproute(i, host):
    a, b, c = (f"s-{s}" for s in route_services(i))
    ref = lambda svc: [{"name": svc, "port": 80}]  # noqa: E731
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": f"r-{i}", "namespace": ns_of(i)},
        "spec": {
            "parentRefs": [{"name": "edge", "namespace": "gw-edge"}],
            "hostnames": [host],
            "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/a"}}], "backendRefs": ref(a)},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/b"}}], "backendRefs": ref(b)},
                {"matches": [{"headers": [{"name": "x-lane", "value": "c"}]}], "backendRefs": ref(c)},
            ],
        },
    }


# Route i's hostname now (the edits below give some routes a new one).
CURRENT = {}


def host_of(i, version=None):
    return f"r-{i}.gw.bench" if version is None else f"r-{i}-v{version}.gw.bench"


def create_base(api):
    for ns in ["gw-edge"] + [f"gw-{k}" for k in range(NAMESPACES)]:
        api.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    api.call("POST", f"{GROUP}/gatewayclasses", {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "weir"}, "spec": {"controllerName": "weir.dev/gateway-controller"}})
    api.call("POST", f"{GROUP}/namespaces/gw-edge/gateways", {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "gw-edge"},
        "spec": {"gatewayClassName": "weir", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}]}})

    def service(job):
        k, s = job
        ns = f"gw-{k}"
        api.call("POST", f"/api/v1/namespaces/{ns}/services", {
            "metadata": {"name": f"s-{s}"},
            "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
        port = ECHO + int(backend_of(s, k)[1:])
        # The test API server (1.20) serves EndpointSlices as v1beta1 only: weir reads Endpoints.
        api.call("POST", f"/api/v1/namespaces/{ns}/endpoints", {
            "metadata": {"name": f"s-{s}"},
            "subsets": [{"addresses": [{"ip": BACKEND_IP}], "ports": [{"name": "http", "port": port}]}]})

    jobs = [(k, s) for k in range(NAMESPACES) for s in range(per_ns())]
    with ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(service, jobs))
    return len(jobs)


# === requests to weir ===

class Prober:
    """GETs through weir's HTTP listener on one keep-alive connection."""

    def __init__(self):
        self.conn = None

    def backend(self, host, path, headers=None):
        """The name of the backend that answered, or None (not routed, or an error)."""
        for _ in range(2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", HTTP, timeout=10)
                self.conn.request("GET", path, headers={"Host": host, **(headers or {})})
                resp = self.conn.getresponse()
                body = resp.read()
                if resp.status != 200:
                    return None
                return json.loads(body).get("name")
            except (OSError, http.client.HTTPException, ValueError):
                self.conn = None
        return None


# === the route status watch ===

class StatusWatch:
    """Watches HTTPRoutes; remembers when each (route, generation) was first Accepted by weir."""

    def __init__(self, api, since):
        self.api, self.since = api, since
        self.accepted = {}   # (namespace, name) -> {generation: time}
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.stopped = threading.Event()
        self.resp = None
        threading.Thread(target=self.run, daemon=True).start()

    def stop(self):
        """Ends the watch (a watch left open costs the API server an event per status write)."""
        self.stopped.set()
        resp = self.resp
        if resp is not None:
            try:
                resp.connection.sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread
            except (OSError, AttributeError):
                pass

    def run(self):
        rv = self.since
        while not self.stopped.is_set():
            try:
                resp = self.resp = self.api.stream(
                    f"{GROUP}/httproutes?watch=1&resourceVersion={rv}&timeoutSeconds=3000")
                for line in resp:
                    if self.stopped.is_set():
                        break
                    event = json.loads(line)
                    obj = event.get("object", {})
                    meta = obj.get("metadata", {})
                    rv = meta.get("resourceVersion", rv)
                    gen = meta.get("generation")
                    for parent in obj.get("status", {}).get("parents", []):
                        if parent.get("controllerName") != "weir.dev/gateway-controller":
                            continue
                        for cond in parent.get("conditions", []):
                            if (cond.get("type") == "Accepted" and cond.get("status") == "True"
                                    and cond.get("observedGeneration") == gen):
                                key = (meta["namespace"], meta["name"])
                                with self.lock:
                                    seen = self.accepted.setdefault(key, {})
                                    if gen not in seen:
                                        seen[gen] = time.time()
                                        self.changed.notify_all()
            except Exception as error:  # the watch ended or broke: resume from the last version
                if self.stopped.is_set():
                    return
                log(f"route watch: {error}; resuming")
                time.sleep(0.2)

    def count(self):
        with self.lock:
            return len(self.accepted)

    def wait(self, key, generation, deadline):
        with self.lock:
            while generation not in self.accepted.get(key, {}):
                left = deadline - time.time()
                if left <= 0:
                    return None
                self.changed.wait(left)
            return self.accepted[key][generation]

    def wait_all(self, n, deadline):
        with self.lock:
            while len(self.accepted) < n:
                left = deadline - time.time()
                if left <= 0:
                    return None
                self.changed.wait(left)
            return max(min(g.values()) for g in self.accepted.values())


def attached(api):
    gw = api.call("GET", f"{GROUP}/namespaces/gw-edge/gateways/edge")
    listeners = gw.get("status", {}).get("listeners", [])
    return listeners[0].get("attachedRoutes", 0) if listeners else 0


def start_attached_poll(api, at, stop, deadline, every):
    """A thread polling the Gateway until its listener says ROUTES attached: the time goes
    into at[0]; it gives up when `stop` is set or past deadline."""
    def poll():
        while not stop.is_set() and time.time() < deadline:
            try:
                if attached(api) == ROUTES:
                    at[0] = time.time()
                    return
            except RuntimeError:
                pass
            time.sleep(every)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


class CpuMeter:
    """CPU seconds (user + system, /proc/PID/stat) used by the API server, etcd and weir, read
    at marks: where the time of a phase goes (the API server's work, or weir's)."""

    def __init__(self, kube, weir):
        def pid(name):
            with open(os.path.join(kube, f"{name}.pid")) as f:
                return int(f.read().strip())
        self.pids = {"kube-apiserver": pid("apiserver"), "etcd": pid("etcd"), "weir": weir.pid}
        self.marks = [("start", time.time(), self.read())]

    def read(self):
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, pid in self.pids.items():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[name] = (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                out[name] = None
        return out

    def mark(self, label, at=None):
        self.marks.append((label, at or time.time(), self.read()))

    def report(self):
        for (_, t0, c0), (label, t1, c1) in zip(self.marks, self.marks[1:]):
            span = max(t1 - t0, 1e-3)
            parts = ", ".join(
                f"{name} {c1[name] - c0[name]:.2f} s ({(c1[name] - c0[name]) / span * 100:.0f} % of a core)"
                for name in self.pids if c0.get(name) is not None and c1.get(name) is not None)
            print(f"  CPU to {label} ({span:.2f} s): {parts}")


def weir_log_tables(logfile, since):
    with open(logfile) as f:
        f.seek(since)
        text = f.read()
    tables = [(float(t), float(total)) for _, t, total in PUBLISHED.findall(text)]
    return tables, text.count(STATUS_LINE)


def start_weir(kubeconfig, logfile, binary=None):
    return subprocess.Popen(
        [binary or WEIR, "--log-level", LOG_LEVEL, "serve",
         "--kubeconfig", kubeconfig, "--listen-http", f"127.0.0.1:{HTTP}", "--listen-https",
         "127.0.0.1:28493", "--listen-admin", f"127.0.0.1:{ADMIN}", "--publish-status-address",
         "10.0.0.1", "--election-namespace", "default"],
        stdout=open(logfile, "w"), stderr=subprocess.STDOUT, env=dict(os.environ, NO_COLOR="1"))


def wait_ready(weir, logfile, deadline, every):
    """Waits for weir's /readyz (ready once the first routing table is published)."""
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", ADMIN, timeout=1)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return time.time()
        except OSError:
            pass
        if time.time() > deadline or weir.poll() is not None:
            sys.exit(f"weir did not become ready; see {logfile}")
        time.sleep(every)


def poll_all_routed(pollers, deadline):
    """When every route's `/a` was first answered by its backend, POLLERS keep-alive
    connections walking interleaved slices of the routes not yet routed; None past deadline."""
    last = [0.0]
    lock = threading.Lock()

    def walk(k):
        prober = Prober()
        left = list(range(k, ROUTES, pollers))
        while left and time.time() < deadline:
            still = []
            for i in left:
                if prober.backend(CURRENT.get(i, host_of(i)), "/a") == expected(i, 0):
                    with lock:
                        last[0] = max(last[0], time.time())
                else:
                    still.append(i)
            left = still
            if left:
                time.sleep(0.01)
        return not left

    with ThreadPoolExecutor(pollers) as pool:
        done = all(pool.map(walk, range(pollers)))
    return last[0] if done else None


def clear_statuses(api):
    """Empties the status of every route and of the Gateway (as a first install finds them)."""
    def clear(i):
        api.call("PATCH", f"{GROUP}/namespaces/{ns_of(i)}/httproutes/r-{i}/status",
                 {"status": {"parents": []}}, content_type="application/merge-patch+json")

    with ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(clear, range(ROUTES)))
    api.call("PATCH", f"{GROUP}/namespaces/gw-edge/gateways/edge/status",
             {"status": {"listeners": [], "conditions": [], "addresses": []}},
             content_type="application/merge-patch+json")


def restart(api, kube, kubeconfig, procs, clear, label, binary=None, name=""):
    """Stops weir, optionally clears every status, starts a new weir (`binary`, else WEIR_BIN)
    on the routes already in the API server and measures, from its start: the first table
    (ready), all routed, attachedRoutes = ROUTES, every route Accepted for its generation.
    Returns those figures in seconds (None: not reached), by name."""
    old = procs.pop(0)
    old.terminate()
    old.wait(timeout=60)
    if clear:
        t = time.time()
        clear_statuses(api)
        log(f"statuses of {ROUTES} routes and the Gateway cleared in {time.time() - t:.1f} s")
    since = api.call("GET", f"{GROUP}/httproutes?limit=1")["metadata"]["resourceVersion"]
    watch = StatusWatch(api, since)
    already = {}
    if not clear:
        # Statuses weir wrote before the restart already say Accepted for the generation.
        already = {k: v for k, v in accepted_now(api).items()}
    logfile = os.path.join(WORK, f"weir-{label}.log")
    t0 = time.time()
    weir = start_weir(kubeconfig, logfile, binary)
    procs.insert(0, weir)
    cpu = CpuMeter(kube, weir)
    ready = wait_ready(weir, logfile, t0 + 300, 0.005)
    cpu.mark("the first table")
    attached_at = [None]
    stop = threading.Event()
    attacher = start_attached_poll(api, attached_at, stop, t0 + 600, 0.05)
    routed = poll_all_routed(8, t0 + 600)
    accepted = None
    cpu.mark("all routed", routed)
    if clear:
        accepted = watch.wait_all(ROUTES, t0 + 600)
        cpu.mark("every route Accepted", accepted)
    attacher.join(max(0, t0 + 600 - time.time()))
    stop.set()
    watch.stop()
    time.sleep(3)  # the status writes of the first tables, for the count
    tables, writes = weir_log_tables(logfile, 0)
    how = "statuses cleared (a first install)" if clear else "statuses as the previous weir left them"
    figures = {}
    print(f"{name + ': ' if name else ''}restart with {ROUTES} HTTPRoutes already in the API server, {how}; "
          f"from weir's start:")
    print(f"  first table published (/readyz, polled every 5 ms): {ready - t0:.2f} s")
    print(f"  all routed (each route's /a answered by its backend, 8 pollers): "
          + (f"{routed - t0:.2f} s" if routed else "not within 600 s"))
    print(f"  attachedRoutes = {ROUTES} on the Gateway's listener: "
          + (f"{attached_at[0] - t0:.2f} s" if attached_at[0] else "not within 600 s"))
    if clear:
        print(f"  every route Accepted by weir (its generation): "
              + (f"{accepted - t0:.2f} s" if accepted else f"not within 600 s ({watch.count()})"))
        if accepted and ROUTES >= 1000:
            first_1000 = sorted(min(g.values()) for g in watch.accepted.values())[999]
            print(f"  1,000 routes Accepted: {first_1000 - t0:.2f} s")
            figures["1,000 routes Accepted"] = first_1000 - t0
    else:
        print(f"  routes Accepted for their generation before the start: {len(already)} of {ROUTES}")
    if tables:
        print(f"  weir: {len(tables)} tables published, translate {summary([x[0] for x in tables])}, translate + "
              f"compile + swap {summary([x[1] for x in tables])}; {writes} status writes")
    synced = re.search(r"sync_ms=(\d+)", open(logfile).read())
    if synced:
        print(f"  weir: every reflector synced {synced.group(1)} ms after its start of the watches")
    cpu.report()
    figures.update({
        "first table": ready - t0,
        "all routed": routed - t0 if routed else None,
        "attachedRoutes": attached_at[0] - t0 if attached_at[0] else None,
        "tables published": len(tables),
    })
    if clear:
        figures["every route Accepted"] = accepted - t0 if accepted else None
    return figures


def accepted_now(api):
    """Routes whose status says Accepted by weir for their generation, listed now."""
    out = {}
    cont = ""
    while True:
        page = api.call("GET", f"{GROUP}/httproutes?limit=500" + (f"&continue={cont}" if cont else ""))
        for obj in page["items"]:
            meta = obj["metadata"]
            for parent in obj.get("status", {}).get("parents", []):
                if parent.get("controllerName") != "weir.dev/gateway-controller":
                    continue
                if any(c.get("type") == "Accepted" and c.get("status") == "True"
                       and c.get("observedGeneration") == meta.get("generation")
                       for c in parent.get("conditions", [])):
                    out[(meta["namespace"], meta["name"])] = meta.get("generation")
        cont = page["metadata"].get("continue")
        if not cont:
            return out


def main():
    kube, api, kubeconfig = start_apiserver()
    procs = []
    try:
        run(api, kube, kubeconfig, procs)
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        subprocess.run([os.path.join(ROOT, "scripts/kube-apiserver.sh"), "stop", kube], capture_output=True)


def run(api, kube, kubeconfig, procs):
    t = time.time()
    install_crds(api)
    services = create_base(api)
    log(f"CRDs, GatewayClass, Gateway, {services} Services with Endpoints in {time.time() - t:.1f} s")
    for b in range(BACKENDS):
        procs.append(subprocess.Popen([WEIR, "--log-level", "warn", "echo", "--listen",
                                       f"{BACKEND_IP}:{ECHO + b}", "--name", f"e{b}"]))
    logfile = os.path.join(WORK, "weir.log")
    weir = start_weir(kubeconfig, logfile)
    procs.insert(0, weir)
    deadline = time.time() + 120
    wait_ready(weir, logfile, deadline, 0.05)
    while not api.call("GET", f"{GROUP}/namespaces/gw-edge/gateways/edge").get("status", {}).get("listeners"):
        if time.time() > deadline:
            sys.exit("the Gateway's status was not written")
        time.sleep(0.1)
    since = api.call("GET", f"{GROUP}/httproutes?limit=1")["metadata"]["resourceVersion"]
    watch = StatusWatch(api, since)
    pos = os.path.getsize(logfile)

    # --- all routes at once ---
    print(f"weir Gateway API scale benchmark: {ROUTES} HTTPRoutes (3 rules each) in {NAMESPACES} namespaces, "
          f"{services} Services, {BACKENDS} backends, one Gateway")
    routed_at = {}
    done = threading.Event()

    def poll_routed():
        prober = Prober()
        left = list(range(ROUTES))
        while left and not done.is_set():
            still = []
            for i in left:
                if prober.backend(host_of(i), "/a") == expected(i, 0):
                    routed_at[i] = time.time()
                else:
                    still.append(i)
            left = still
            if left:
                time.sleep(0.01)

    t0 = time.time()
    poller = threading.Thread(target=poll_routed, daemon=True)
    poller.start()
    attached_at = [None]
    attacher = start_attached_poll(api, attached_at, done, float("inf"), 0.1)
    with ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(lambda i: api.call("POST", f"{GROUP}/namespaces/{ns_of(i)}/httproutes",
                                         httproute(i, host_of(i))), range(ROUTES)))
    created = time.time() - t0
    limit = time.time() + 600
    all_accepted = watch.wait_all(ROUTES, limit)
    poller.join(max(0, limit - time.time()))
    attacher.join(max(0, limit - time.time()))
    done.set()
    if len(routed_at) < ROUTES:
        sys.exit(f"only {len(routed_at)} of {ROUTES} routes routed within 600 s")
    if all_accepted is None or attached_at[0] is None:
        sys.exit(f"status not written within 600 s: {watch.count()} Accepted, attachedRoutes {attached(api)}")
    time.sleep(2)
    tables, writes = weir_log_tables(logfile, pos)
    print(f"all {ROUTES} created through the API ({CREATORS} at once): {created:.1f} s after the first create")
    print(f"  all routed (each route's /a answered by its backend): {max(routed_at.values()) - t0:.1f} s")
    print(f"  attachedRoutes = {ROUTES} on the Gateway's listener: {attached_at[0] - t0:.1f} s")
    print(f"  every route Accepted by weir (its generation): {all_accepted - t0:.1f} s")
    first_1000 = sorted(min(g.values()) for g in watch.accepted.values())[999] if ROUTES >= 1000 else None
    if first_1000:
        print(f"  1,000 routes Accepted: {first_1000 - t0:.1f} s")
    print(f"  weir: {len(tables)} tables published, translate {summary([x[0] for x in tables])}, translate + "
          f"compile + swap {summary([x[1] for x in tables])}; {writes} status writes")

    # Correctness on a sample: every rule of SAMPLE random routes answered by its backend.
    prober = Prober()
    wrong = 0
    for i in random.Random(7).sample(range(ROUTES), min(SAMPLE, ROUTES)):
        got = (prober.backend(host_of(i), "/a"), prober.backend(host_of(i), "/b/x"),
               prober.backend(host_of(i), "/other", {"x-lane": "c"}))
        if got != tuple(expected(i, r) for r in range(3)):
            wrong += 1
            log(f"route {i}: got {got}, expected {[expected(i, r) for r in range(3)]}")
    print(f"  sample of {min(SAMPLE, ROUTES)} routes, 3 rules each: {wrong} answered by the wrong backend")

    # --- one change at a time ---
    routed, accepted, writes, tables_per = [], [], [], []
    for c in range(CHANGES):
        i = (c * 997 + 13) % ROUTES
        time.sleep(1.5)  # let the previous change's status writes settle
        pos = os.path.getsize(logfile)
        host = host_of(i, c)
        t0 = time.time()
        obj = api.call("PATCH", f"{GROUP}/namespaces/{ns_of(i)}/httproutes/r-{i}",
                       {"spec": {"hostnames": [host]}}, content_type="application/merge-patch+json")
        gen = obj["metadata"]["generation"]
        CURRENT[i] = host
        while prober.backend(host, "/a") != expected(i, 0):
            if time.time() - t0 > 60:
                sys.exit(f"change {c} not routed within 60 s")
            time.sleep(0.002)
        routed.append((time.time() - t0) * 1e3)
        at = watch.wait((ns_of(i), f"r-{i}"), gen, t0 + 60)
        if at is None:
            sys.exit(f"change {c}: status not written within 60 s")
        accepted.append((at - t0) * 1e3)
        time.sleep(1.0)
        tables, n = weir_log_tables(logfile, pos)
        writes.append(n)
        tables_per.extend(tables)
    if CHANGES:
        print(f"one HTTPRoute edited (a new hostname), {CHANGES} times:")
        print(f"  to routed (new hostname answered, polled every 2 ms): {summary(routed)}")
        print(f"  to its status Accepted for the new generation (watch): {summary(accepted)}")
        print(f"  status writes per change: {summary(writes).replace(' ms', '')}")
        print(f"  weir per table ({len(tables_per)} tables): translate {summary([x[0] for x in tables_per])}; "
              f"translate + compile + swap {summary([x[1] for x in tables_per])}")
    with open(f"/proc/{weir.pid}/status") as f:
        rss = int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) / 1024
    print(f"weir RSS at the end: {rss:.0f} MB")

    watch.stop()

    # --- restarts on the routes already there ---
    if os.environ.get("RESTART", "1") == "1":
        restarts(api, kube, kubeconfig, procs)


def restarts(api, kube, kubeconfig, procs):
    """The restart case, for each binary of RESTART_BINS (`name=path ...`, default WEIR_BIN
    alone) in turn, RESTART_ROUNDS times (the binaries alternating in the same conditions);
    with more than one run, the median of each figure per binary."""
    bins = [tuple(b.split("=", 1)) for b in os.environ.get("RESTART_BINS", "").split()] or [("", WEIR)]
    rounds = int(os.environ.get("RESTART_ROUNDS", "1"))
    results = {}  # (binary name, kept | cleared) -> [figures per round]
    for r in range(rounds):
        for name, binary in bins:
            for clear, case in ((False, "kept"), (True, "cleared")):
                label = f"restart-{case}" + (f"-{name}-{r}" if name or rounds > 1 else "")
                figures = restart(api, kube, kubeconfig, procs, clear, label, binary, name)
                results.setdefault((name, case), []).append(figures)
    if rounds > 1:
        print(f"medians over {rounds} rounds (load average now {os.getloadavg()[0]:.1f}):")
        for (name, case), runs in results.items():
            keys = [k for k in runs[0] if all(run.get(k) is not None for run in runs)]
            med = ", ".join(f"{k} {statistics.median(run[k] for run in runs):g}" if k == "tables published"
                            else f"{k} {statistics.median(run[k] for run in runs):.2f} s" for k in keys)
            each = "; ".join(" ".join(f"{run.get(k):.2f}" if isinstance(run.get(k), float) else str(run.get(k))
                                      for k in keys) for run in runs)
            print(f"  {name or 'weir'}, statuses {case}: {med}  (each run: {each})")


if __name__ == "__main__":
    main()
