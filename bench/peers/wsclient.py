"""WebSocket round trips for bench/peers: CONNS connections to HOST:PORT/ws, each keeping one
64-byte masked text message in flight, for DURATION seconds; every echo must equal what was sent.
Prints one JSON line: {"requests": round trips, "elapsed": s, "p99_ms": ..., "errors": [...]}.

    python3 wsclient.py 127.0.0.1:28080 4 5
"""

import base64
import json
import os
import selectors
import socket
import struct
import sys
import time


def handshake(addr):
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws HTTP/1.1\r\nHost: bench.local\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  f"Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("connection closed during the upgrade")
        head += chunk
    status = head.split(b"\r\n", 1)[0]
    if b" 101 " not in status + b" ":
        raise RuntimeError(f"upgrade refused: {status!r}")
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, head.split(b"\r\n\r\n", 1)[1]


def frame(payload):
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return struct.pack("!BB", 0x81, 0x80 | len(payload)) + mask + masked


def main():
    addr, conns, duration = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sel = selectors.DefaultSelector()
    state = {}
    errors = []
    for i in range(conns):
        sock, rest = handshake(addr)
        state[sock] = {"buf": rest, "sent": None, "t": 0.0, "n": 0, "i": i}
        sel.register(sock, selectors.EVENT_READ)

    def send(sock, st):
        st["n"] += 1
        st["sent"] = f"conn {st['i']:03} message {st['n']:012} ".ljust(64, "x").encode()
        st["t"] = time.perf_counter()
        sock.sendall(frame(st["sent"]))

    latencies = []
    start = time.perf_counter()
    deadline = start + duration
    for sock, st in state.items():
        send(sock, st)
    done = 0
    while time.perf_counter() < deadline and state:
        for key, _ in sel.select(timeout=0.5):
            sock, st = key.fileobj, state[key.fileobj]
            chunk = sock.recv(65536)
            if not chunk:
                errors.append(f"connection {st['i']} closed")
                sel.unregister(sock)
                del state[sock]
                continue
            st["buf"] += chunk
            while len(st["buf"]) >= 2:
                b0, b1 = st["buf"][0], st["buf"][1]
                n = b1 & 0x7F
                if n >= 126 or len(st["buf"]) < 2 + n:
                    break
                payload, st["buf"] = st["buf"][2:2 + n], st["buf"][2 + n:]
                if b0 != 0x81 or payload != st["sent"]:
                    errors.append(f"connection {st['i']}: echo differs from the message sent")
                latencies.append(time.perf_counter() - st["t"])
                done += 1
                if time.perf_counter() < deadline:
                    send(sock, st)
    elapsed = time.perf_counter() - start
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99)] * 1e3 if latencies else None
    print(json.dumps({"requests": done, "elapsed": elapsed, "p99_ms": p99,
                      "errors": errors[:5]}))


if __name__ == "__main__":
    main()
