"""A small local Messages API: the one boundary the tests and the bench fake, at the wire.

`FakeAPI` runs stdlib http.server in a thread on 127.0.0.1 (a free port) and
answers POST /v1/messages from a queue of scripted replies, as plain JSON or,
when the request says `"stream": true`, as server-sent events exactly as the
API sends them (message_start, content_block_start/delta/stop with
text_delta and input_json_delta, message_delta with usage, message_stop).
Errors are replies too: `api_error(529)` sends the API's error JSON.

It records every request (body and headers) so tests assert on what the
harness really sent. Usage numbers are scripted, or computed by a small
model of prompt caching: every cache_control breakpoint writes its prefix
(tools, system, messages up to that block, without the markers) to a cache;
a later request that repeats a cached prefix byte for byte reads it. So a
prefix that changes between steps (a timestamp in the system prompt, a
reordered tool list) shows up as zero cache reads.

Not here: any knowledge of wakeloop. It only speaks the wire format.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Callable, Sequence, Union

CHARS_PER_TOKEN = 4  # the cache model's token estimate
CHUNK = 7  # characters per SSE delta: small, to exercise accumulation
MODEL_ECHO = "claude-fake-1"
FAKE_KEY = "sk-ant-test-CANARY-7f3a9c1e5b2d"  # the tests' key: if it shows up anywhere, it leaked


@dataclass
class Reply:
    content: list[dict] = field(default_factory=list)
    stop_reason: str | None = None
    usage: dict | None = None  # None: computed by the cache model
    status: int = 200
    error_type: str = ""
    message: str = ""
    headers: dict = field(default_factory=dict)


Responder = Union[Reply, Callable[["Recorded"], Reply]]


@dataclass
class Recorded:
    path: str
    headers: dict  # lower-cased names
    body: dict
    raw: bytes


_ids = itertools.count(1)


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def tool_use(name: str, input, id: str | None = None) -> dict:
    return {"type": "tool_use", "id": id or f"toolu_fake_{next(_ids):04d}", "name": name, "input": input}


def turn(*blocks: dict, stop_reason: str | None = None, usage: dict | None = None) -> Reply:
    stop = stop_reason or ("tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn")
    return Reply(content=list(blocks), stop_reason=stop, usage=usage)


def usage(input_tokens=0, output_tokens=0, cache_read=0, cache_creation=0) -> dict:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": cache_creation,
    }


def api_error(
    status: int = 529, type: str = "overloaded_error", message: str = "Overloaded", retry_after_ms: int | None = 10
) -> Reply:
    headers = {"retry-after-ms": str(retry_after_ms)} if retry_after_ms is not None else {}
    return Reply(status=status, error_type=type, message=message, headers=headers)


class FakeAPI:
    def __init__(self, replies: Sequence[Responder] = (), then: Responder | None = None, one_at_a_time: bool = False):
        """`one_at_a_time`: requests answered in turn on the server's own thread, not each on a
        thread started for it (the client, one wake, then pays for no thread start of the fake's:
        1-12 ms on a loaded 2-core host, which a real API's would never cost it)."""
        self.queue: list[Responder] = list(replies)
        self.then = then  # used when the queue is empty; None: a plain end_turn
        self.requests: list[Recorded] = []
        self.cache: set[str] = set()
        self._lock = threading.Lock()
        if one_at_a_time:
            self._server = HTTPServer(("127.0.0.1", 0), self._handler())
        else:
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
            self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeAPI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def push(self, *replies: Responder) -> None:
        with self._lock:
            self.queue.extend(replies)

    # -- one request -----------------------------------------------------------------

    def _next(self, rec: Recorded) -> Reply:
        with self._lock:
            self.requests.append(rec)
            item = self.queue.pop(0) if self.queue else (self.then or turn(text("(fake: end)")))
        return item(rec) if callable(item) else item

    def _usage(self, body: dict, reply: Reply) -> dict:
        if reply.usage is not None:
            return reply.usage
        with self._lock:
            read, create, total = cache_model(body, self.cache)
        out = max(1, len(json.dumps(reply.content)) // CHARS_PER_TOKEN)
        return usage(input_tokens=total - read - create, output_tokens=out, cache_read=read, cache_creation=create)

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                rec = Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body, raw)
                if not self.path.startswith("/v1/messages"):
                    return self._json(404, _error_body("not_found_error", f"no route {self.path}"))
                reply = api._next(rec)
                if reply.status != 200:
                    return self._json(reply.status, _error_body(reply.error_type, reply.message), reply.headers)
                message = _message(body, reply, api._usage(body, reply))
                if body.get("stream"):
                    return self._sse(message)
                return self._json(200, message)

            def _json(self, status, data, headers=None):
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.send_header("request-id", f"req_fake_{next(_ids)}")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

            def _sse(self, message):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.end_headers()
                for event in sse_events(message):
                    self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()

        return Handler


def _error_body(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind or "api_error", "message": message or "error"}}


def _message(body: dict, reply: Reply, use: dict) -> dict:
    return {
        "id": f"msg_fake_{next(_ids):04d}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", MODEL_ECHO),
        "content": reply.content,
        "stop_reason": reply.stop_reason or "end_turn",
        "stop_sequence": None,
        "usage": use,
    }


def sse_events(message: dict) -> list[dict]:
    """The event sequence the API streams for `message`."""
    use = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**use, "output_tokens": 1}}
    events: list[dict] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}})
            events += [
                {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": part}}
                for part in _chunks(block["text"])
            ]
        elif block["type"] == "tool_use":
            events.append(
                {
                    "type": "content_block_start",
                    "index": i,
                    "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}},
                }
            )
            events += [
                {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": part}}
                for part in _chunks(json.dumps(block["input"]))
            ]
        else:
            events.append({"type": "content_block_start", "index": i, "content_block": block})
        events.append({"type": "content_block_stop", "index": i})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": use["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    return events


def _chunks(s: str) -> list[str]:
    return [s[i : i + CHUNK] for i in range(0, len(s), CHUNK)] or [""]


# -- the prompt-cache model ---------------------------------------------------------


def strip_cache_control(value):
    if isinstance(value, dict):
        return {k: strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache_control(v) for v in value]
    return value


def _segments(body: dict) -> list[tuple[str, bool]]:
    """(canonical text, has a breakpoint) for tools, system blocks, message blocks, in prefix order."""
    segs = []
    for tool in body.get("tools", []) or []:
        segs.append((json.dumps(strip_cache_control(tool), sort_keys=True), "cache_control" in tool))
    system = body.get("system", [])
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    for block in system:
        segs.append((json.dumps(strip_cache_control(block), sort_keys=True), "cache_control" in block))
    if body.get("tool_choice"):  # as documented: a new tool_choice invalidates the messages' cache only
        segs.append((json.dumps(body["tool_choice"], sort_keys=True), False))
    for msg in body.get("messages", []):
        content = msg["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in content:
            segs.append(
                (msg["role"] + json.dumps(strip_cache_control(block), sort_keys=True), "cache_control" in block)
            )
    return segs


LOOKBACK = 20  # blocks before a breakpoint the API also checks for a hit


def cache_model(body: dict, cache: set[str]) -> tuple[int, int, int]:
    """(cache read, cache creation, total input tokens) for one request; updates `cache`.

    As documented: a breakpoint writes the prefix ending at its block; a hit is
    looked for at the breakpoint and at up to LOOKBACK block boundaries before it."""
    digest, tokens, prefixes, marks = hashlib.sha256(), 0, [], []
    for canon, breakpoint in _segments(body):
        digest.update(canon.encode())
        tokens += max(1, len(canon) // CHARS_PER_TOKEN)
        prefixes.append((digest.hexdigest(), tokens))
        if breakpoint:
            marks.append(len(prefixes) - 1)
    read = max(
        (prefixes[j][1] for i in marks for j in range(max(0, i - LOOKBACK), i + 1) if prefixes[j][0] in cache),
        default=0,
    )
    last = prefixes[marks[-1]][1] if marks else 0
    cache.update(prefixes[i][0] for i in marks)
    return read, max(0, last - read), tokens
