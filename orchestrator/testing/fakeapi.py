"""A small local Messages API: the one boundary the tests and the bench fake, at the wire.

`FakeAPI` runs stdlib http.server in a thread on 127.0.0.1 (a free port) and
answers POST /v1/messages from a queue of scripted replies, as plain JSON or,
when the request says `"stream": true`, as server-sent events exactly as the
API sends them (message_start, content_block_start/delta/stop with
text_delta and input_json_delta, message_delta with usage, message_stop).
Errors are replies too: `api_error(529)` sends the API's error JSON, and
`Reply(midstream_error="overloaded_error")` breaks a 200 stream off with an
`error` event after message_start (whose usage the client has then seen).
Every response carries `anthropic-ratelimit-*` headers.

It speaks today's API (shared/notes/claude-api-2026-12.md), from rules of its
own, not the harness's tables: `temperature`, `top_p`, `top_k` are a 400 on
every model; on the strict 5.x models (STRICT) a forced `tool_choice` (any,
tool), manual thinking (`enabled`) and `disabled` are a 400, thinking is
adaptive when omitted, the model's words before a tool call come back as
`thinking` blocks, and a thinking block's text is shown only when
`display: "summarized"` was asked for (else "" with its signature); on Sonnet
5.5 `between_tools` is accepted and shows those words. Every thinking block is
signed; a later request must send each back unchanged, in the assistant turn
it came in, or it is a 400. Usage splits cache writes by TTL
(`cache_creation`), counts thinking in `output_tokens_details`, names
`inference_geo`, and a refusal carries `stop_details`.

It knows Claude's own client tools (CLIENT_TOOLS): a typed entry must carry
its one name (a text_editor_20250728 under another name is a 400), and the
scripts can call them (`edit()`, `memory()`: tool_use blocks of those names).

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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer

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
    midstream_error: str = ""  # an error type sent as an SSE `error` event after message_start
    stop_details: dict | None = None  # refusal: {"type": "refusal", "category": ..., "explanation": ...}


Responder = Reply | Callable[["Recorded"], Reply]


@dataclass
class Recorded:
    path: str
    headers: dict  # lower-cased names
    body: dict
    raw: bytes


_ids = itertools.count(1)


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def thinking(t: str) -> dict:
    """A thinking block as the model writes it: the fake signs it, and shows its text only when asked."""
    return {"type": "thinking", "thinking": t}


def tool_use(name: str, input, id: str | None = None) -> dict:
    return {"type": "tool_use", "id": id or f"toolu_fake_{next(_ids):04d}", "name": name, "input": input}


def edit(command: str, path: str, id: str | None = None, **args) -> dict:
    """A call of Claude's text editor (text_editor_20250728, named str_replace_based_edit_tool)."""
    return tool_use("str_replace_based_edit_tool", {"command": command, "path": path, **args}, id)


def memory(command: str, id: str | None = None, **args) -> dict:
    """A call of Claude's memory tool (memory_20250818): paths under /memories."""
    return tool_use("memory", {"command": command, **args}, id)


# Anthropic-defined client tools: their type and the one name each must be offered under.
CLIENT_TOOLS = {
    "bash_20250124": "bash",
    "text_editor_20250728": "str_replace_based_edit_tool",
    "memory_20250818": "memory",
}


def turn(*blocks: dict, stop_reason: str | None = None, usage: dict | None = None) -> Reply:
    stop = stop_reason or ("tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn")
    return Reply(content=list(blocks), stop_reason=stop, usage=usage)


def usage(input_tokens=0, output_tokens=0, cache_read=0, cache_creation=0, cache_1h=0, thinking_tokens=0) -> dict:
    """A usage block: `cache_creation` is the 5-minute writes, `cache_1h` the 1-hour ones (split as the API does)."""
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": cache_creation + cache_1h,
        "cache_creation": {"ephemeral_5m_input_tokens": cache_creation, "ephemeral_1h_input_tokens": cache_1h},
        "output_tokens_details": {"thinking_tokens": thinking_tokens},
        "inference_geo": "global",
    }


# The 5.x rules, the fake's own (not the harness's table): models that refuse a forced tool_choice,
# manual and disabled thinking, think adaptively when thinking is omitted, return the words between
# tool calls as thinking blocks, and show thinking only at display "summarized".
STRICT = ("claude-sonnet-5-5", "claude-opus-5-5", "claude-fable-5-1", "claude-fable-5-2")
BETWEEN_TOOLS = ("claude-sonnet-5-5",)  # accept thinking.type between_tools
SAMPLING = ("temperature", "top_p", "top_k")


def model_entry(id: str, lifecycle: str = "active", retires_at: str | None = None, efforts=(), thinking=()) -> dict:
    """One GET /v1/models entry (the SDK's ModelInfo), with the capabilities the harness reads."""
    yes = lambda on: {"supported": bool(on)}  # noqa: E731
    levels = ("low", "medium", "high", "xhigh", "max")
    types = ("adaptive", "between_tools", "disabled", "enabled")
    return {
        "id": id,
        "type": "model",
        "display_name": id,
        "created_at": "2026-01-01T00:00:00Z",
        "lifecycle": lifecycle,
        "retires_at": f"{retires_at}T00:00:00Z" if retires_at else None,
        "max_input_tokens": 1_000_000,
        "max_tokens": 128_000,
        "capabilities": {
            "effort": {"supported": bool(efforts), **{k: yes(k in efforts) for k in levels}},
            "thinking": {"supported": bool(thinking), "types": {k: yes(k in thinking) for k in types}},
        },
    }


MODELS = (
    model_entry("claude-sonnet-5-5", efforts=("low", "medium", "high", "xhigh", "max"), thinking=("adaptive",)),
    model_entry("claude-opus-4-5", "deprecated", "2027-01-22", ("low", "medium", "high"), ("enabled", "disabled")),
)
RATE_LIMIT = {  # what every response says of the account's limits (a continuously refilling bucket)
    "anthropic-ratelimit-requests-limit": "4000",
    "anthropic-ratelimit-requests-remaining": "3999",
    "anthropic-ratelimit-tokens-limit": "2000000",
    "anthropic-ratelimit-tokens-remaining": "1999000",
    "anthropic-ratelimit-input-tokens-limit": "2000000",
    "anthropic-ratelimit-input-tokens-remaining": "1999000",
    "anthropic-ratelimit-output-tokens-limit": "400000",
    "anthropic-ratelimit-output-tokens-remaining": "399000",
}


def refused(body: dict) -> str:
    """Why the API would answer this request 400, or ""."""
    model = str(body.get("model", ""))
    sent = [k for k in SAMPLING if k in body]
    if sent:
        return f"{sent[0]}: sampling parameters are not supported with this API version"
    bad_tool = _tool_refused(body.get("tools") or [])
    if bad_tool:
        return bad_tool
    if model not in STRICT:
        return ""
    kind = (body.get("tool_choice") or {}).get("type")
    if kind in ("any", "tool"):
        return f"tool_choice.type {kind!r} is not supported on {model}; use auto or none"
    think = (body.get("thinking") or {}).get("type")
    if think == "enabled":
        return f"thinking.type 'enabled' is not supported on {model}; use adaptive (with output_config.effort)"
    if think == "disabled" or (think == "between_tools" and model not in BETWEEN_TOOLS):
        return f"thinking.type {think!r} is not supported on {model}"
    return ""


def _tool_refused(tools: list) -> str:
    """Why the API would refuse a tool entry: an Anthropic-defined type under another name, an
    unknown type, a max_characters that is not a positive whole number, a name offered twice."""
    names = [t.get("name") for t in tools if isinstance(t, dict)]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        return f"tools: tool names must be unique: {twice!r}"
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in (None, "custom"):
            continue
        if kind not in CLIENT_TOOLS:
            return f"tools.{i}.type: unknown tool type {kind!r}"
        if tool.get("name") != CLIENT_TOOLS[kind]:
            return f"tools.{i}.name: a {kind} tool must be named {CLIENT_TOOLS[kind]!r}"
        chars = tool.get("max_characters")
        if chars is not None and (isinstance(chars, bool) or not isinstance(chars, int) or chars < 1):
            return f"tools.{i}.max_characters: must be a positive integer"
    return ""


def api_error(
    status: int = 529, type: str = "overloaded_error", message: str = "Overloaded", retry_after_ms: int | None = 10
) -> Reply:
    headers = {"retry-after-ms": str(retry_after_ms)} if retry_after_ms is not None else {}
    return Reply(status=status, error_type=type, message=message, headers=headers)


class FakeAPI:
    def __init__(
        self,
        replies: Sequence[Responder] = (),
        then: Responder | None = None,
        one_at_a_time: bool = False,
        bucket: Bucket | None = None,
    ):
        """`one_at_a_time`: requests answered in turn on the server's own thread, not each on a
        thread started for it (the client, one wake, then pays for no thread start of the fake's:
        1-12 ms on a loaded 2-core host, which a real API's would never cost it)."""
        self.queue: list[Responder] = list(replies)
        self.then = then  # used when the queue is empty; None: a plain end_turn
        self.requests: list[Recorded] = []
        self.cache: set[str] = set()
        self.signed: dict[str, tuple[str, str]] = {}  # signature -> (model, the text it was sent with)
        self.issued: dict[str, list[dict]] = {}  # tool_use id -> the thinking blocks sent before it
        self.models: list[dict] = list(MODELS)  # what GET /v1/models lists
        self.bucket = bucket  # requests beyond it are a 429 with retry-after, as the API's limits are
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

    def __enter__(self) -> FakeAPI:
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
        thought = sum(len(b.get("thinking", "")) for b in reply.content if b.get("type") == "thinking")
        with self._lock:
            read, create, total = cache_model(body, self.cache)
        out = max(1, len(json.dumps(reply.content)) // CHARS_PER_TOKEN)
        hour = _last_ttl(body) == "1h"
        made = usage(
            input_tokens=total - read - create,
            output_tokens=out,
            cache_read=read,
            cache_creation=0 if hour else create,
            cache_1h=create if hour else 0,
            thinking_tokens=thought // CHARS_PER_TOKEN,
        )
        made["inference_geo"] = "us" if body.get("inference_geo") == "us" else "global"
        return made

    def check_thinking(self, body: dict) -> str:
        """Why this request's thinking blocks would be refused (changed, unknown, or missing), or ""."""
        model = str(body.get("model", ""))
        with self._lock:
            for msg in body.get("messages", []):
                if msg.get("role") != "assistant" or not isinstance(msg.get("content"), list):
                    continue
                blocks = [strip_cache_control(b) for b in msg["content"]]
                for b in blocks:
                    if b.get("type") != "thinking":
                        continue
                    if self.signed.get(str(b.get("signature"))) != (model, b.get("thinking")):
                        return "messages: a thinking block was modified, or is not this model's"
                for b in blocks:
                    expected = self.issued.get(str(b.get("id"))) if b.get("type") == "tool_use" else None
                    if expected and any(e not in blocks for e in expected):
                        return "messages: an assistant turn's thinking blocks must be sent back unchanged"
        return ""

    def shape(self, body: dict, reply: Reply) -> list[dict]:
        """The reply's blocks as this model returns them for this request: words before a tool call as
        thinking on the strict models, each thinking block's text shown or not, and signed."""
        model = str(body.get("model", ""))
        think = body.get("thinking") or ({"type": "adaptive"} if model in STRICT else {})
        shown = think.get("type") == "between_tools" or (
            think.get("display") == "summarized" or (model not in STRICT and think.get("display") != "omitted")
        )
        calls = [i for i, b in enumerate(reply.content) if b["type"] == "tool_use"]
        out: list[dict] = []
        for i, block in enumerate(reply.content):
            if model in STRICT and block["type"] == "text" and calls and i < calls[-1]:
                block = {"type": "thinking", "thinking": block["text"]}
            if block["type"] == "thinking":
                text = block["thinking"] if shown else ""
                signature = hashlib.sha256(f"{model}\0{text}\0{next(_ids)}".encode()).hexdigest()[:40]
                with self._lock:
                    self.signed[signature] = (model, text)
                block = {"type": "thinking", "thinking": text, "signature": signature}
            out.append(block)
        with self._lock:
            before: list[dict] = []
            for block in out:
                if block["type"] == "thinking":
                    before.append(block)
                elif block["type"] == "tool_use":
                    self.issued[block["id"]] = list(before)
        return out

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                rec = Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, {}, b"")
                with api._lock:
                    api.requests.append(rec)
                if not self.path.startswith("/v1/models"):
                    return self._json(404, _error_body("not_found_error", f"no route {self.path}"))
                data = list(api.models)
                ids = [m["id"] for m in data]
                page = {"data": data, "has_more": False, "first_id": ids[0] if ids else None}
                return self._json(200, {**page, "last_id": ids[-1] if ids else None})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                rec = Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body, raw)
                if not self.path.startswith("/v1/messages"):
                    return self._json(404, _error_body("not_found_error", f"no route {self.path}"))
                wait_s, limits = api.bucket.take() if api.bucket is not None else (0.0, {})
                if wait_s:  # recorded, and no scripted reply used up
                    with api._lock:
                        api.requests.append(rec)
                    limits["retry-after-ms"] = str(max(1, int(wait_s * 1000)))
                    return self._json(429, _error_body("rate_limit_error", "rate limited"), limits)
                problem = refused(body) or api.check_thinking(body)
                if problem:  # recorded, and no scripted reply used up
                    with api._lock:
                        api.requests.append(rec)
                    return self._json(400, _error_body("invalid_request_error", problem))
                reply = api._next(rec)
                if reply.status != 200:
                    return self._json(reply.status, _error_body(reply.error_type, reply.message), reply.headers)
                content = api.shape(body, reply)
                message = _message(body, reply, api._usage(body, reply), content)
                headers = {**limits, **reply.headers}
                if body.get("stream"):
                    return self._sse(message, reply.midstream_error, headers)
                return self._json(200, message, headers)

            def _json(self, status, data, headers=None):
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.send_header("request-id", f"req_fake_{next(_ids)}")
                for k, v in {**RATE_LIMIT, **(headers or {})}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

            def _sse(self, message, midstream_error: str = "", headers=None):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                for k, v in {**RATE_LIMIT, **(headers or {})}.items():
                    self.send_header(k, v)
                self.end_headers()
                events = sse_events(message)
                if midstream_error:  # message_start, a ping, then the error: the client saw the usage
                    events = [*events[:2], {"type": "error", **_error_body(midstream_error, "Overloaded")}]
                for event in events:
                    self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()

        return Handler


class Bucket:
    """The API's requests limit as a continuously refilling bucket: `capacity` requests, refilled at
    `per_s` a second. `take()`: (0, headers) and a request's slot taken, or (seconds until a slot,
    headers) for a 429. The headers say the limit as a minute's worth, as the API does."""

    def __init__(self, capacity: int, per_s: float):
        self.capacity, self.per_s = capacity, per_s
        self.slots = float(capacity)
        self.seen = time.monotonic()
        self.refused = 0
        self._lock = threading.Lock()

    def take(self) -> tuple[float, dict]:
        with self._lock:
            now = time.monotonic()
            self.slots = min(self.capacity, self.slots + (now - self.seen) * self.per_s)
            self.seen = now
            wait = 0.0 if self.slots >= 1 else (1 - self.slots) / self.per_s
            if wait:
                self.refused += 1
            else:
                self.slots -= 1
            full = datetime.now(UTC) + timedelta(seconds=(self.capacity - self.slots) / self.per_s)
            return wait, {
                "anthropic-ratelimit-requests-limit": str(int(self.per_s * 60)),
                "anthropic-ratelimit-requests-remaining": str(int(self.slots)),
                "anthropic-ratelimit-requests-reset": full.isoformat(),
            }


def _error_body(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind or "api_error", "message": message or "error"}}


def _message(body: dict, reply: Reply, use: dict, content: list[dict] | None = None) -> dict:
    return {
        "id": f"msg_fake_{next(_ids):04d}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", MODEL_ECHO),
        "content": reply.content if content is None else content,
        "stop_reason": reply.stop_reason or "end_turn",
        "stop_sequence": None,
        "stop_details": reply.stop_details,
        "usage": use,
    }


def _last_ttl(body: dict) -> str:
    """The TTL of the request's last cache breakpoint ("5m" when it names none)."""
    ttl = "5m"
    for msg in body.get("messages", []):
        for b in msg.get("content") if isinstance(msg.get("content"), list) else []:
            if isinstance(b, dict) and isinstance(b.get("cache_control"), dict):
                ttl = b["cache_control"].get("ttl", "5m")
    return ttl


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
        elif block["type"] == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            events.append({"type": "content_block_start", "index": i, "content_block": start})
            events += [
                {"type": "content_block_delta", "index": i, "delta": {"type": "thinking_delta", "thinking": part}}
                for part in _chunks(block["thinking"])
                if part
            ]
            events.append(
                {
                    "type": "content_block_delta",
                    "index": i,
                    "delta": {"type": "signature_delta", "signature": block["signature"]},
                }
            )
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
            "delta": {
                "stop_reason": message["stop_reason"],
                "stop_sequence": None,
                "stop_details": message.get("stop_details"),
            },
            "usage": {"output_tokens": use["output_tokens"], "output_tokens_details": use.get("output_tokens_details")},
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
