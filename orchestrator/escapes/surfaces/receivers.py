"""Receivers of our own on 127.0.0.1, for what a notification reaches: an HTTP endpoint and an SMTP server.

Real servers on real sockets (the stdlib's http.server; a small SMTP over
socketserver, since this Python's smtpd is gone and aiosmtpd is no
dependency of ours), each in a thread, stopped when its `with` ends. Nothing
leaves the machine. The surface probes (escapes/surfaces/notify.py) run them
inside `wakeloop escapes`, so only runtime dependencies; the tests use the
same ones (tests/test_notify*.py, test_approvals.py, the console's browser
tests).

Not here: the OTLP collector of the tracing tests (tests/helpers/receivers.py).
"""

from __future__ import annotations

import base64
import json
import socketserver
import threading
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

POLL_S = 0.05  # a receiver's shutdown waits up to this
LINE_CAP = 1 << 20  # an SMTP line read at most: what a sender says is not trusted to end


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes
    headers: dict[str, str]
    status: int  # what it was answered
    whole: bool  # the body arrived as long as its Content-Length said (a sender killed mid-send: not)


@dataclass
class Hook:
    """An HTTP receiver: every request kept, answered with `status` (and `location`, for a 3xx)."""

    status: int = 200
    location: str = ""
    requests: list[Request] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return len(self.requests)

    @property
    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    @property
    def accepted(self) -> list[Request]:
        return [r for r in self.requests if r.method == "POST" and r.whole and 200 <= r.status < 300]

    @property
    def received(self) -> list[Any]:
        """The JSON bodies of the whole POSTs answered 2xx, in order."""
        return [json.loads(r.body) for r in self.accepted]

    @property
    def headers(self) -> list[dict[str, str]]:
        return [r.headers for r in self.accepted]

    def __enter__(self) -> Hook:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # a test may wrap it (to hold or note a request)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                status, whole = hook.status, len(body) == length
                hook.requests.append(Request(self.command, self.path, body, dict(self.headers), status, whole))
                self.send_response(status)
                if hook.location:
                    self.send_header("Location", hook.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"no" if status >= 300 else b"ok")

            do_GET = do_POST  # noqa: N815 (http.server's name) only a followed redirect would come as a GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(POLL_S,), daemon=True).start()
        return self

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass(frozen=True)
class Mail:
    rcpt: list[str]  # RCPT TO, as given
    data: bytes  # the message, dot-unstuffed

    @property
    def message(self) -> Message:
        return message_from_bytes(self.data)


class Mailbox:
    """An SMTP server that accepts AUTH PLAIN (no TLS) and keeps every message with its recipients."""

    def __init__(self):
        self.messages: list[Mail] = []
        self.logins: list[tuple[str, str]] = []

    def __enter__(self) -> Mailbox:
        box = self

        class Handler(socketserver.StreamRequestHandler):
            def say(self, line: str) -> None:
                self.wfile.write(line.encode() + b"\r\n")

            def handle(self) -> None:
                self.say("220 test ESMTP")
                rcpt: list[str] = []
                while line := self.rfile.readline(LINE_CAP).decode("utf-8", "replace").rstrip("\r\n"):
                    verb = line.split(" ", 1)[0].upper()
                    if verb == "QUIT":
                        break
                    if verb == "EHLO":
                        self.say("250-test")
                        self.say("250 AUTH PLAIN")
                    elif verb == "AUTH":
                        _, user, password = base64.b64decode(line.split()[2]).decode().split("\0")
                        box.logins.append((user, password))
                        self.say("235 ok")
                    elif verb == "DATA":
                        self.say("354 go on")
                        data = b""
                        while (chunk := self.rfile.readline(LINE_CAP)) not in (b".\r\n", b""):
                            data += chunk[1:] if chunk.startswith(b"..") else chunk
                        box.messages.append(Mail(rcpt, data))
                        rcpt = []
                        self.say("250 queued")
                    else:  # HELO, MAIL, RCPT, RSET, NOOP
                        if verb == "RCPT":
                            rcpt.append(line.split(":", 1)[1].strip().strip("<>"))
                        self.say("250 ok")
                self.say("221 bye")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(POLL_S,), daemon=True).start()
        return self

    def url(self, user: str = "", password: str = "") -> str:
        login = f"{user}:{password}@" if user else ""
        return f"smtp://{login}127.0.0.1:{self.server.server_address[1]}?from=agent@example.com"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
