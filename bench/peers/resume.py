"""Resumed TLS handshakes for bench/peers: for DURATION seconds, one new TLS connection per
request to HOST:PORT, each offering the session the previous connection was given (TLS 1.3
tickets are single-use, so the client keeps the newest, as browsers do); one GET per connection.
The first connection is a full handshake, every later one must resume.
Prints one JSON line: {"requests": connections, "resumed": ..., "elapsed": s, "errors": [...]}.

    python3 resume.py 127.0.0.1:28443 5
"""

import json
import socket
import ssl
import sys
import time

REQUEST = b"GET / HTTP/1.1\r\nHost: bench.local\r\nX-Bench: resumed-handshake\r\nConnection: close\r\n\r\n"


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    duration = float(sys.argv[2])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    session = None
    requests = resumed = 0
    errors = []
    started = time.time()
    while time.time() - started < duration:
        try:
            with socket.create_connection((host, int(port)), timeout=5) as raw:
                with ctx.wrap_socket(raw, server_hostname="bench.local", session=session) as tls:
                    tls.sendall(REQUEST)
                    response = b""
                    while True:  # to the end: the tickets come before the response
                        try:
                            chunk = tls.recv(65536)
                        except ssl.SSLEOFError:  # closed without close_notify, after answering
                            chunk = b""
                        if not chunk:
                            break
                        response += chunk
                    if not response.startswith(b"HTTP/1.1 200"):
                        errors.append(f"response {response[:40]!r}")
                        break
                    if tls.session_reused:
                        resumed += 1
                    elif requests > 0:
                        errors.append(f"connection {requests + 1} was not resumed")
                        break
                    session = tls.session
                    requests += 1
        except (OSError, ssl.SSLError) as error:
            errors.append(f"{type(error).__name__}: {error}")
            break
    print(json.dumps({"requests": requests, "resumed": resumed,
                      "elapsed": time.time() - started, "errors": errors}))


if __name__ == "__main__":
    main()
