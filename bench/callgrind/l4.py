"""bench/callgrind/l4.sh's upstream and client (Debian's python3, no module beyond the stdlib).

  l4.py echo PORTFILE      an upstream on 127.0.0.1: per connection, reads one byte, echoes it,
                           closes; writes its port to PORTFILE, serves until killed
  l4.py conns PORT N       N short connections to 127.0.0.1:PORT one after another: connect,
                           one byte each way, close with a reset (SO_LINGER 0, as
                           bench/l4/l4bench.py); exits 1 naming how many failed
  l4.py wait PORT          waits (60 s at most) until a short connection through PORT works
"""

import socket
import sys
import time

LINGER0 = b"\x01\x00\x00\x00\x00\x00\x00\x00"


def echo(portfile):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(listener.getsockname()[1]))
    import os
    os.rename(portfile + ".tmp", portfile)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            time.sleep(0.01)
            continue
        try:
            conn.settimeout(10)
            data = conn.recv(1)
            if data:
                conn.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()


def one(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER0)
        s.sendall(b"x")
        return s.recv(1) == b"x"
    finally:
        s.close()


def conns(port, n):
    failed = 0
    for _ in range(n):
        try:
            if not one(port):
                failed += 1
        except OSError:
            failed += 1
    if failed:
        print(f"{failed} of {n} connections failed", file=sys.stderr)
        return 1
    return 0


def wait(port):
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if one(port):
                return 0
        except OSError:
            pass
        time.sleep(0.2)
    print(f"no working connection through port {port} within 60 s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "echo":
        echo(sys.argv[2])
    elif mode == "conns":
        sys.exit(conns(int(sys.argv[2]), int(sys.argv[3])))
    elif mode == "wait":
        sys.exit(wait(int(sys.argv[2])))
    else:
        sys.exit(f"unknown mode {mode}")
