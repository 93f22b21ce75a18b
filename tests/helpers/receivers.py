"""A real receiver on 127.0.0.1 for traces (and bench/console.py): an OTLP/HTTP collector,
a real server on a real socket in a thread of the test, stopped after it.

Not here: the notification tests' HTTP endpoint and SMTP server, which the
surface probes use too (orchestrator/escapes/surfaces/receivers.py).
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
