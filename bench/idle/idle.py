"""Orchestrator of bench/idle/run.sh (run that, not this): the memory an idle client connection
costs weir, nginx and HAProxy. For each proxy and kind of connection (plain HTTP/1.1 keep-alive,
TLS with HTTP/1.1), starts the proxy fresh, opens N connections that each make one request and
then stay idle, and reads the proxy's resident memory (VmRSS of all its processes) before and
after. Reuses bench/peers' setup (upstream, certificate, configurations), with connection limits
raised to hold N connections."""

import asyncio
import os
import re
import resource
import ssl
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
import peers  # noqa: E402  (the side-by-side bench's setup and process handling)

N = int(os.environ.get("CONNS", "10000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
KINDS = os.environ.get("KINDS", "keepalive,tls").split(",")
# 6 s: weir parks a keep-alive connection after 1 s idle, and its allocator gives the freed task
# memory back a few seconds later; nginx and HAProxy are not affected by the wait.
SETTLE = float(os.environ.get("SETTLE", "6"))
OPENING = int(os.environ.get("OPENING", "200"))  # connections being opened at once
# Connections opened, answered and closed before the first reading, which is then taken SETTLE
# later: the baseline is a proxy that has served traffic and gone idle, not one 0.5 s after its
# start. Neither baseline is neutral (bench/RESULTS.md, 2026-11-27 "transparent huge pages"):
# from the start, weir's release at the settle also gives back its start-up garbage, so its
# figure is net of that; after a warm-up, memory a proxy kept from the warm-up is reused by the
# burst and not counted. Default 0 (the start), as in every earlier figure; compare both and the
# RSS after the burst.
WARMUP = int(os.environ.get("WARMUP_CONNS", "0"))


async def open_idle(port, tls, n):
    """n connections to 127.0.0.1:port, each after one GET / answered; returns them open."""
    ctx = None
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["http/1.1"])
    gate = asyncio.Semaphore(OPENING)
    failures = []

    async def one():
        async with gate:
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=ctx, server_hostname="bench.local" if tls else None)
                writer.write(b"GET / HTTP/1.1\r\nHost: bench.local\r\n\r\n")
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
                await reader.readexactly(length)
                if not head.startswith(b"HTTP/1.1 200"):
                    failures.append(head.split(b"\r\n")[0])
                return reader, writer
            except Exception as e:  # counted, reported
                failures.append(repr(e))
                return None

    conns = await asyncio.gather(*(one() for _ in range(n)))
    return [c for c in conns if c], failures


async def measure(name, kind):
    proxy = peers.Proxy(name, "idle")
    try:
        time.sleep(0.5)
        port = peers.PORTS[name]["https" if kind == "tls" else "http"]
        if WARMUP:
            warm, _ = await open_idle(port, kind == "tls", WARMUP)
            for _, w in warm:
                w.close()
            await asyncio.sleep(SETTLE)
        before = proxy.memory_kb("VmRSS")
        conns, failures = await open_idle(port, kind == "tls", N)
        await asyncio.sleep(SETTLE)
        after = proxy.memory_kb("VmRSS")
        # Still open and idle at the end? (a proxy that closed them would look cheap)
        await asyncio.sleep(0.2)
        closed = sum(1 for r, _ in conns if r.at_eof())
        for _, w in conns:
            w.close()
        return {"before_kb": before, "after_kb": after, "open": len(conns) - closed,
                "failures": len(failures), "first_failure": failures[0] if failures else None}
    finally:
        proxy.stop()


def raise_limits(work):
    """nginx and HAProxy as bench/peers configures them, able to hold N connections."""
    conf = os.path.join(work, "nginx/nginx.conf")
    text = open(conf).read()
    text = text.replace("worker_connections 8192;", f"worker_connections {2 * N + 1000};")
    text = text.replace("worker_processes 1;", f"worker_processes 1;\nworker_rlimit_nofile {2 * N + 64};")
    open(conf, "w").write(text)
    conf = os.path.join(work, "haproxy/haproxy.cfg")
    # HAProxy needs 2 x maxconn + 14 descriptors and refuses to start without them.
    text = open(conf).read().replace("maxconn 4096", f"maxconn {N + 50}")
    open(conf, "w").write(text)


def weir_argv(name, scenario, argv=peers.proxy_argv):
    """weir as bench/peers runs it, admitting N connections whatever the open-file limit."""
    args = argv(name, scenario)
    return args + ["--max-connections", str(N + 1000)] if name.startswith("weir") else args


def main():
    # Each process (the client here, each proxy) holds about N descriptors, plus its upstream's.
    need = 2 * N + 64  # HAProxy's need; the others' is about N
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(need, soft), max(need, hard)))
    except (ValueError, OSError):
        if hard < need:
            sys.exit(f"needs an open-file limit of {need} (hard limit {hard}): run as root or raise it")
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    peers.setup_files()
    raise_limits(peers.WORK)
    peers.proxy_argv = weir_argv
    # Idle keep-alive connections live 300 s in every proxy (bench/peers configures nginx's
    # keepalive_timeout and HAProxy's http-keep-alive so); weir's default is 30 s.
    peers.write(os.path.join(peers.WORK, "weir/manifests/settings.yaml"),
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: weir-settings, namespace: default}\n"
                "data: {keep-alive: \"300\"}\n")
    upstream = peers.subprocess.Popen(
        peers.pinned(peers.LOAD_CPU, ["nginx", "-p", f"{peers.WORK}/up", "-e", f"{peers.WORK}/up/error.log",
                                      "-c", f"{peers.WORK}/up/nginx.conf", "-g", "daemon off;"]),
        start_new_session=True)
    results = {}
    try:
        peers.wait_port(peers.UP)
        print(f"{N} idle connections per run, {ROUNDS} rounds; proxies {peers.PROXIES}; kinds {KINDS}", flush=True)
        for rnd in range(ROUNDS):
            order = peers.PROXIES[rnd % len(peers.PROXIES):] + peers.PROXIES[:rnd % len(peers.PROXIES)]
            for kind in KINDS:
                for name in order:
                    r = asyncio.run(measure(name, kind))
                    per = (r["after_kb"] - r["before_kb"]) * 1024 / max(r["open"], 1)
                    results.setdefault((kind, name), []).append(per)
                    print(f"round {rnd + 1} {kind:9} {name:8} rss {r['before_kb'] / 1024:7.1f} -> "
                          f"{r['after_kb'] / 1024:7.1f} MiB, {r['open']} open, {r['failures']} failed "
                          f"({r['first_failure']}): {per:7.0f} B/conn", flush=True)
    finally:
        upstream.terminate()
        upstream.wait()
    print("\nmedian bytes of resident memory per idle connection")
    peers_of_weir = [p for p in ("nginx", "haproxy") if p in peers.PROXIES and "weir" in peers.PROXIES]
    print(f"{'kind':10}" + "".join(f"{p:>10}" for p in peers.PROXIES)
          + "".join(f"  {'weir/' + p:>12}" for p in peers_of_weir))
    for kind in KINDS:
        med = {p: statistics.median(results[(kind, p)]) for p in peers.PROXIES}
        ratios = "".join(f"  {med['weir'] / med[p]:12.2f}" for p in peers_of_weir)
        print(f"{kind:10}" + "".join(f"{med[p]:10.0f}" for p in peers.PROXIES) + ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
