"""`python -m orchestrator.healthcheck broker SOCKET | console URL`: compose's healthchecks.

Each answers exit 0 when the service answers as it should, else exit 1 and
one line saying what did not. Run every few seconds by the engine inside the
service's container, so it starts fast and imports almost nothing: the
broker gets the wire's own `ping` line (ops.Ping, encoded by hand here so
as not to import the sandbox package); the console its `/healthz` route,
which needs no token and says only `ok`.

Not here: the routes themselves (broker/server.py and transport.py, console/app.py).
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.request

TIMEOUT_S = 4.0  # under compose's `timeout: 5s`
PING = b'{"op": "ping"}\n'  # ops.encode(ops.Ping()); test_broker.py keeps them equal


def broker(socket_path: str) -> str | None:
    """None if the broker at `socket_path` answers ping, else why not."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT_S)
            sock.connect(socket_path)
            sock.sendall(PING)
            reply = json.loads(sock.makefile("rb").readline(65536))
    except (OSError, ValueError) as exc:
        return f"broker at {socket_path}: {exc}"
    return None if isinstance(reply, dict) and reply.get("ok") else f"broker at {socket_path}: {reply!r:.200}"


def console(url: str) -> str | None:
    """None if the console at `url` (its /healthz) answers 200 ok, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            body = response.read(64)
    except (OSError, ValueError) as exc:
        return f"console at {url}: {exc}"
    return None if body.strip() == b"ok" else f"console at {url}: answered {body!r}"


def main(argv: list[str]) -> int:
    checks = {"broker": broker, "console": console}
    if len(argv) != 2 or argv[0] not in checks:
        print("usage: python -m orchestrator.healthcheck broker SOCKET | console URL", file=sys.stderr)
        return 2
    problem = checks[argv[0]](argv[1])
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
