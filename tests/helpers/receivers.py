"""Real receivers on 127.0.0.1: for the notification tests an HTTP endpoint and an SMTP
server; for traces (and bench/console.py) an OTLP/HTTP collector.

Both are real servers on real sockets (http.server; a small SMTP over
socketserver, since this Python's smtpd is deprecated and aiosmtpd is not
installed), each in a thread of the test, stopped after it. Nothing leaves
the machine.
"""

from __future__ import annotations

import base64
import gzip
import json
import socketserver
import threading
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Hook:
    """An HTTP receiver: POSTs are kept while `status` is 2xx, and answered with `status`."""

    status: int = 200
    received: list[dict] = field(default_factory=list)  # bodies accepted, in order
    attempts: int = 0  # every POST, accepted or not
    headers: list[dict] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # every request's path, accepted or not
    location: str = ""  # sent as Location (with a 3xx status)

    def __enter__(self) -> "Hook":
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # only a followed redirect would come as a GET
                hook.attempts += 1
                hook.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.attempts += 1
                hook.paths.append(self.path)
                if 200 <= hook.status < 300:
                    hook.received.append(json.loads(body))
                    hook.headers.append(dict(self.headers))
                self.send_response(hook.status)
                if hook.location:
                    self.send_header("Location", hook.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"no" if hook.status >= 300 else b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown within 50 ms
        return self

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class SMTP:
    """An SMTP server that accepts AUTH PLAIN and keeps every message it is given."""

    def __init__(self):
        self.messages: list[Message] = []
        self.logins: list[tuple[str, str]] = []

    def __enter__(self) -> "SMTP":
        smtp = self

        class Handler(socketserver.StreamRequestHandler):
            def say(self, line: str) -> None:
                self.wfile.write(line.encode() + b"\r\n")

            def handle(self):
                self.say("220 test ESMTP")
                while True:
                    line = self.rfile.readline().decode("utf-8", "replace").rstrip("\r\n")
                    verb = line.split(" ", 1)[0].upper()
                    if not line or verb == "QUIT":
                        self.say("221 bye")
                        return
                    if verb == "EHLO":
                        self.say("250-test")
                        self.say("250 AUTH PLAIN")
                    elif verb == "AUTH":
                        _, user, password = base64.b64decode(line.split()[2]).decode().split("\0")
                        smtp.logins.append((user, password))
                        self.say("235 ok")
                    elif verb == "DATA":
                        self.say("354 go on")
                        data = b""
                        while (chunk := self.rfile.readline()) not in (b".\r\n", b""):
                            data += chunk[1:] if chunk.startswith(b"..") else chunk
                        smtp.messages.append(message_from_bytes(data))
                        self.say("250 queued")
                    else:  # HELO, MAIL, RCPT, RSET, NOOP
                        self.say("250 ok")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown within 50 ms
        return self

    def url(self, user: str, password: str) -> str:
        return f"smtp://{user}:{password}@127.0.0.1:{self.server.server_address[1]}?from=agent@example.com"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class Collector:
    """An OTLP/HTTP endpoint, answering as a collector does: 200 to POST /v1/traces, 404 elsewhere.
    Each body (gunzipped) goes to `take`, in the server's thread; without one, nothing is kept
    or decoded (the bench: no decoding in the CPU it measures). Stopped by close()."""

    def __init__(self, take=None):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if take is not None:
                    take(gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body)
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown within 50 ms
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
