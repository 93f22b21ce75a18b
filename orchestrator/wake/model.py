"""The model: the live Anthropic client, and the scripted model a dry run uses.

Both answer `call(system, tools, messages, max_tokens, tool_choice) -> Turn`
with plain dicts in and out, so the loop never knows which one it has.

LiveModel is the real `anthropic` SDK. It honours ANTHROPIC_BASE_URL (the SDK
reads it itself), streams by default (a long reply never meets the
non-streaming timeout), and lets the SDK retry 408/409/429/5xx with its own
backoff and `retry-after` handling. An `overloaded_error` or `api_error`
that arrives mid-stream, after the 200, is one the SDK does not retry: it is
retried here as a 529 is, with the same backoff, and the usage the failed
attempt had reported is kept (once) in the Turn's `attempts`. When the
retries are spent, or the request is refused for good (401, 400, 404, ...),
it raises ModelError, saying how many retries were made (a middleware counts
the attempts, and waits at the key's rate-limit gate, ratelimit.py): the loop
turns that into a dead letter. It adds the moving
cache breakpoint: the last block of the last user message, so step N reads
steps 1..N-1 from the cache. It asks for the agent's effort and thinking in
the forms the model accepts (records/models.py `request_fields`: adaptive
thinking by default, its summaries where the display defaults to omitted).
Every wake makes its own client (and closes it: no connection outlives the
wake), but all of them verify TLS with one context per process (`_tls`):
loading the CA store is ~0.4 s of CPU here, once per serve, not once per
wake; a changed CA store is read at serve's next start.

ScriptedModel makes no API call: it plays a list of turns (built in, or a
JSON script file) whose tool calls the loop runs for real in the real
sandbox, so a dry run shows the whole machine working without a key.

Not here: what to do with a stop reason (loop.py) or the tools (tools.py).
"""

from __future__ import annotations

import copy
import json
import random
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, Protocol, TypedDict

import anthropic
import httpx2  # the SDK's HTTP library (a dependency of anthropic's): its TLS defaults, once

from orchestrator import tracing
from orchestrator.policy.agent import AgentError
from orchestrator.records.models import Thinking, request_fields
from orchestrator.records.receipt import Usage
from orchestrator.wake.ratelimit import gate_for

MAX_RETRIES = 4  # SDK retries for 408/409/429/5xx, exponential backoff (≈0.5s..8s)
REQUEST_TIMEOUT_S = 600.0  # one request, the SDK's own default; a stream resets it per chunk
SCRIPT_CAP = 1 << 20  # bytes of a --script file
RETRY_DELAY_S = 0.5  # a mid-stream error's first backoff, doubled each retry up to MAX_RETRY_DELAY_S (the SDK's)
MAX_RETRY_DELAY_S = 8.0
MIDSTREAM_RETRIED = ("overloaded_error", "api_error")  # as a 529 or a 500 would be


# A content block as JSON, the API's shape for its "type" (text, thinking, tool_use, tool_result, ...).
Block = dict[str, Any]
CACHE = {"type": "ephemeral"}  # the breakpoint marker (5-minute cache)


class Message(TypedDict):
    """One message of the conversation, as the Messages API takes it."""

    role: Literal["user", "assistant"]
    content: str | list[Block]


# An object of the anthropic SDK: mypy does not follow its modules (pyproject.toml), so it reads
# as Any; read at this edge only (_turn, _block, _snapshot_usage), our own types past it.
SDKObject = Any


class ScriptCall(TypedDict):
    name: str
    input: NotRequired[object]  # the tool's arguments, as JSON; the registry checks them


class ScriptTurn(TypedDict, total=False):
    """One turn of a dry-run script (load_script checks a file's against it)."""

    text: str
    tool_calls: list[ScriptCall]
    stop_reason: str


class ModelError(RuntimeError):
    """The model could not be reached or refused for good: a dead letter. One line."""


@dataclass(frozen=True)
class Turn:
    content: list[Block]  # the assistant's blocks, ready to send back
    stop_reason: str
    usage: Usage = field(default_factory=Usage)  # this reply's, with the failed attempts' added
    model: str = ""
    attempts: tuple[Usage, ...] = ()  # one per billed request (failed mid-stream ones first); () = (usage,)
    inference_geo: str = ""  # usage.inference_geo: where it ran (a price multiplier)
    refusal_category: str = ""  # a refusal's stop_details.category (cyber, bio, ...), "" when none given
    refusal_explanation: str = ""  # ... and the API's explanation

    @property
    def requests(self) -> tuple[Usage, ...]:
        return self.attempts or (self.usage,)

    @property
    def tool_uses(self) -> list[Block]:
        return [b for b in self.content if b.get("type") == "tool_use"]

    @property
    def text(self) -> str:
        return "\n".join(b.get("text", "") for b in self.content if b.get("type") == "text").strip()

    @property
    def thinking(self) -> str:
        """The thinking blocks' text (a 5.x model's words between tool calls come back as these)."""
        return "\n".join(b.get("thinking", "") for b in self.content if b.get("type") == "thinking").strip()


class Model(Protocol):
    name: str
    live: bool

    def call(
        self,
        *,
        system: list[Block],
        tools: list[Block],
        messages: list[Message],
        max_tokens: int,
        tool_choice: Block | None = None,
    ) -> Turn: ...


# -- live ----------------------------------------------------------------------------

_tls_context: ssl.SSLContext | None = None
_tls_lock = threading.Lock()


def _tls() -> ssl.SSLContext:
    """The process's one verifying TLS context, made by the SDK's HTTP library as its every client
    would make its own (the same trust store: the OS's where it has one, SSL_CERT_FILE /
    SSL_CERT_DIR honoured); an SSLContext is safe to share between threads."""
    global _tls_context
    with _tls_lock:
        if _tls_context is None:
            _tls_context = httpx2.create_ssl_context()
        return _tls_context


class LiveModel:
    live = True

    def __init__(
        self,
        name: str,
        api_key: str,
        *,
        stream: bool = True,
        max_retries: int = MAX_RETRIES,
        timeout_s: float = REQUEST_TIMEOUT_S,
        effort: str | None = None,
        thinking: Thinking | None = None,
        retry_delay_s: float = RETRY_DELAY_S,
    ):
        self.name = name
        self.stream = stream
        # output_config and thinking, in the forms the model takes
        self.options = request_fields(name, effort, thinking or Thinking())
        self.retry_delay_s = retry_delay_s
        self.sent = 0  # HTTP attempts of the call in flight (the SDK's retries included)
        self.gate = gate_for(api_key)  # the key's limits, shared by every wake of this process
        traced = tracing.sdk_option()  # only when content is asked for: an SDK without the option still works
        options: dict[str, Any] = {"open_telemetry": traced} if traced else {}
        # The SDK's own client settings (limits, keep-alive, redirects, proxies from the
        # environment), with the shared TLS context instead of a CA store loaded anew.
        http = anthropic.DefaultHttpxClient(verify=_tls())
        self.client = anthropic.Anthropic(
            api_key=api_key,
            max_retries=max_retries,
            timeout=timeout_s,
            http_client=http,
            middleware=[self._count],
            **options,
        )

    def _count(
        self, request: httpx2.Request, call_next: Callable[[httpx2.Request], httpx2.Response]
    ) -> httpx2.Response:
        """Runs once per HTTP attempt, inside the SDK's retry loop: how many retries a call took;
        and the key's rate-limit gate, waited at before and told what the response said after."""
        self.sent += 1
        self.gate.wait()
        response = call_next(request)
        self.gate.observe(response.status_code, response.headers)
        return response

    def _retries(self) -> str:
        retries = max(0, self.sent - 1)
        return f" after {retries} retr{'y' if retries == 1 else 'ies'}" if retries else ""

    def close(self) -> None:
        """Its HTTP connections, now rather than when the collector finds them."""
        self.client.close()

    def call(
        self,
        *,
        system: list[Block],
        tools: list[Block],
        messages: list[Message],
        max_tokens: int,
        tool_choice: Block | None = None,
    ) -> Turn:
        kwargs: dict[str, Any] = dict(
            model=self.name,
            max_tokens=max_tokens,
            system=system,
            messages=with_cache_breakpoint(messages),
            **self.options,
        )
        if tools:
            kwargs["tools"] = tools
        if tool_choice:
            kwargs["tool_choice"] = tool_choice
        self.sent = 0
        failed: list[Usage] = []
        while True:
            try:
                message = self._once(kwargs)
            except _MidStream as exc:
                failed.append(exc.usage)
                if len(failed) > self.client.max_retries:
                    raise ModelError(
                        f"the API broke off its answer ({exc.detail}) mid-stream{self._retries()}"
                    ) from None
                delay = min(self.retry_delay_s * 2 ** (len(failed) - 1), MAX_RETRY_DELAY_S)
                time.sleep(delay * (1 - 0.25 * random.random()))  # a backoff, as the SDK's own
                continue
            return _turn(message, failed)

    def _once(self, kwargs: dict[str, Any]) -> SDKObject:
        """One request and the SDK's own retries: the final message, or ModelError; _MidStream when
        the stream broke off with an error the API would answer a retry of."""
        try:
            if not self.stream:
                return self.client.messages.create(**kwargs)
            with self.client.messages.stream(**kwargs) as stream:
                try:
                    return stream.get_final_message()
                except anthropic.APIStatusError as exc:
                    if exc.status_code == 200 and _error_type(exc) in MIDSTREAM_RETRIED:
                        raise _MidStream(_api_error(exc), _snapshot_usage(stream)) from None
                    raise
        except anthropic.APIStatusError as exc:
            raise ModelError(f"the API answered HTTP {exc.status_code} ({_api_error(exc)}){self._retries()}") from None
        except anthropic.APITimeoutError:
            raise ModelError(f"the API did not answer within {self.client.timeout}s{self._retries()}") from None
        except anthropic.APIConnectionError as exc:
            raise ModelError(
                f"cannot reach the API at {self.client.base_url} "
                f"({type(exc.__cause__ or exc).__name__}){self._retries()}"
            ) from None
        except anthropic.AnthropicError as exc:
            raise ModelError(f"the API call failed: {type(exc).__name__}: {str(exc)[:200]}") from None


class _MidStream(Exception):
    """An error event after the 200: retried like a 529, its attempt's usage kept."""

    def __init__(self, detail: str, usage: Usage):
        super().__init__(detail)
        self.detail, self.usage = detail, usage


def _snapshot_usage(stream: SDKObject) -> Usage:
    """What the broken stream had reported (message_start's input and cache counts, any delta's output)."""
    try:
        return Usage.from_api(stream.current_message_snapshot.usage)
    except (AssertionError, AttributeError):
        return Usage()  # broken before message_start: nothing was reported


def _error_type(exc: anthropic.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    err = body.get("error")
    return str(err.get("type", "")) if isinstance(err, dict) else ""


def _api_error(exc: anthropic.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    err = body.get("error")
    err = err if isinstance(err, dict) else {}
    kind, msg = err.get("type"), err.get("message")
    return f"{kind}: {str(msg)[:200]}" if kind else str(exc)[:200]


def _turn(message: SDKObject, failed: list[Usage]) -> Turn:
    usage = Usage.from_api(message.usage)
    content = [b for b in (_block(b) for b in message.content) if b]
    details = getattr(message, "stop_details", None)  # the SDK's RefusalStopDetails, or None
    return Turn(
        content=content,
        stop_reason=str(message.stop_reason or "unknown"),
        usage=sum(failed, usage),
        model=message.model,
        attempts=(*failed, usage) if failed else (),
        inference_geo=str(getattr(message.usage, "inference_geo", None) or ""),
        refusal_category=str(getattr(details, "category", None) or ""),
        refusal_explanation=str(getattr(details, "explanation", None) or ""),
    )


def _block(block: SDKObject) -> Block | None:
    """An SDK content block as the dict we send back next turn (no empty text)."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return {"type": "text", "text": block.text} if block.text else None
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    data: Block = block.model_dump(mode="json", exclude_none=True)
    data.pop("parsed_output", None)
    return data


LOOKBACK_BLOCKS = 20  # how far before a breakpoint the API looks for a cached prefix
LOOKBACK_MARGIN = 2  # a step that adds more blocks than the look-back less this gets a second breakpoint


def with_cache_breakpoint(messages: list[Message]) -> list[Message]:
    """A copy with cache_control on the last block of the last user message, and, when the turn
    since the previous user message added more blocks than the API looks back over (many parallel
    tool calls and their results, thinking blocks), on the previous user message's last block too:
    else the prefix the previous request wrote is out of reach and the whole conversation is written
    again. Only the request carries them (history stays clean): at most three breakpoints, the
    system block's included (the API allows four)."""
    if not messages or messages[-1].get("role") != "user":
        return messages
    out = list(messages)
    out[-1] = _marked(messages[-1])
    users = [i for i, m in enumerate(messages[:-1]) if m.get("role") == "user"]
    if users:
        added = sum(_blocks(m) for m in messages[users[-1] + 1 :])
        if added > LOOKBACK_BLOCKS - LOOKBACK_MARGIN:
            out[users[-1]] = _marked(messages[users[-1]])
    return out


def _blocks(message: Message) -> int:
    content = message.get("content")
    return 1 if isinstance(content, str) else len(content or [])


def _marked(message: Message) -> Message:
    marked = copy.deepcopy(message)
    content = marked["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    content[-1] = {**content[-1], "cache_control": dict(CACHE)}
    marked["content"] = content
    return marked


# -- scripted (dry run) -------------------------------------------------------------

# The built-in dry run: look around, update core memory (keeping what is
# there), write a note with write_file, append a journal entry, end.
# {wake} and {today} are filled in; everything else runs as written.
DRY_RUN_SCRIPT: list[ScriptTurn] = [
    {
        "text": "Dry run: looking around the workspace first.",
        "tool_calls": [
            {
                "name": "bash",
                "input": {
                    "command": "pwd; ls -la; echo; find . -maxdepth 3 -type f | sort | head -40; echo; "
                    "echo '== memory/core.md =='; head -c 2000 memory/core.md 2>&1"
                },
            }
        ],
    },
    {
        "text": "Updating core memory: one line, replaced each dry run, the rest kept.",
        "tool_calls": [
            {
                "name": "bash",
                "input": {
                    "command": "mkdir -p memory && touch memory/core.md && "
                    "{ grep -v '^- Last dry run: ' memory/core.md; "
                    "echo '- Last dry run: wake #{wake} on {today} (scripted model, no API call).'; } "
                    "> /tmp/core.md && "
                    "cat /tmp/core.md > memory/core.md && tail -n 3 memory/core.md"
                },
            }
        ],
    },
    {
        "text": "Leaving a note with write_file.",
        "tool_calls": [
            {
                "name": "write_file",
                "input": {
                    "path": "memory/dry-run.md",
                    "content": "# Dry run\n\nWake #{wake} on {today} was a dry run: a scripted model drove the real "
                    "tools in a fresh sandbox container per call, and no API call was made.\n"
                    "To go live, set `dry_run: false` in agent.yaml (or pass --live) and export "
                    "ANTHROPIC_API_KEY.\n",
                },
            }
        ],
    },
    {
        "text": "Writing today's journal entry.",
        "tool_calls": [
            {
                "name": "bash",
                "input": {
                    "command": "mkdir -p memory/journal && printf '\\n## Wake #{wake} (dry run)\\n"
                    "Looked around, updated memory/core.md, wrote memory/dry-run.md. "
                    "Next: a live wake when the human enables it.\\n' >> memory/journal/{today}.md && "
                    "tail -n 3 memory/journal/{today}.md"
                },
            }
        ],
    },
    {"text": "Dry run complete: looked around, updated memory, journaled. Nothing else to do."},
]


class ScriptedModel:
    live = False

    def __init__(self, turns: list[ScriptTurn], *, name: str = "scripted", variables: dict[str, object] | None = None):
        self.name = name
        self.turns = list(turns)
        self.variables = {f"{{{k}}}": str(v) for k, v in (variables or {}).items()}
        self.step = 0

    def call(
        self,
        *,
        system: list[Block],
        tools: list[Block],
        messages: list[Message],
        max_tokens: int,
        tool_choice: Block | None = None,
    ) -> Turn:
        turn: ScriptTurn = self.turns[self.step] if self.step < len(self.turns) else {"text": "(end of script)"}
        self.step += 1
        offered = {t["name"] for t in tools} if (tool_choice or {}).get("type") != "none" else set()
        content: list[Block] = [{"type": "text", "text": self._fill(turn["text"])}] if turn.get("text") else []
        for i, call in enumerate(turn.get("tool_calls", []) if offered else []):
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_dry_{self.step:02d}_{i}",
                    "name": call["name"],
                    "input": self._fill(call.get("input", {})),
                }
            )
        stop = turn.get("stop_reason") or ("tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn")
        return Turn(content=content, stop_reason=stop, usage=Usage(), model=self.name)

    def _fill(self, value: object) -> object:
        if isinstance(value, str):
            for key, sub in self.variables.items():
                value = value.replace(key, sub)
            return value
        if isinstance(value, dict):
            return {k: self._fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._fill(v) for v in value]
        return value


def load_script(path: Path) -> list[ScriptTurn]:
    """A dry-run script file: a JSON list of turns (or {"turns": [...]}), each
    {"text": str?, "tool_calls": [{"name": str, "input": {...}}]?, "stop_reason": str?}."""
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read(SCRIPT_CAP))
    except OSError as exc:
        raise AgentError(f"{path}: cannot read the script: {exc.strerror}") from None
    except ValueError as exc:
        raise AgentError(f"{path}: not valid JSON: {exc}") from None
    turns = raw.get("turns") if isinstance(raw, dict) else raw
    if not isinstance(turns, list) or not turns:
        raise AgentError(f'{path}: expected a non-empty JSON list of turns (or {{"turns": [...]}})')
    for n, turn in enumerate(turns, 1):
        problem = _check_turn(turn)
        if problem:
            raise AgentError(f"{path}: turn {n}: {problem}")
    return turns


def _check_turn(turn: object) -> str | None:
    if not isinstance(turn, dict):
        return "expected an object"
    unknown = set(turn) - {"text", "tool_calls", "stop_reason"}
    if unknown:
        return f"unknown key {sorted(unknown)[0]!r} (known: text, tool_calls, stop_reason)"
    if not isinstance(turn.get("text", ""), str) or not isinstance(turn.get("stop_reason", ""), str):
        return "text and stop_reason must be strings"
    calls = turn.get("tool_calls", [])
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
        return 'tool_calls must be a list of {"name": str, "input": {...}}'
    return None
