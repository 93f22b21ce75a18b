"""Prometheus metrics: what `serve --http` shows at GET /metrics, and `--metrics ADDR` alone.

Most metrics are read off the event log as it is written (records/events.py
`listen`): the same record `wakeloop log` and `status` read, so a wake, a
tool call or a notification is counted exactly when its event lands, and
there is no second account of what happened. What no event says is counted
where it happens: pool hits, misses and failed makes, and live containers
(sandbox/), and the scheduler's lag from a tick's due time to its wake's start
(fleet/).

Off until `install()`: every hook returns at once, and prometheus_client is
not even imported, so `wakeloop wake` and the broker pay nothing.

Every label value comes from a bounded set, whatever a model, an API reply
or an agent folder says (a model that invents tool names must not mint
series): `tool` is one of TOOLS (the registry's, wake/tools.py; a test keeps
the two equal) or `other`; `agent` is the folder name of an agent under a
ROOT that serve watches (`watch_root`), holding agent.yaml, at most
MAX_AGENTS of them, else `other`; `model` is the first MAX_MODELS model names
seen that look like one, else `other`; `status`, `kind`, `exit_class`,
`outcome` and `result` are fixed sets, anything else `other`; `decision`
(allow, deny) and `direction` (up, down) too: an egress decision's host and
path, which the box chooses, are never a label.

Under compose the sandbox runs in the broker, so the pool and container
metrics of the orchestrator's /metrics stay at zero there.

Not here: the console's HTTP listener (console/app.py; `serve_alone` is the
one for `--metrics`, with the Host rule console/hosts.py gives it), spans
(tracing.py).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from orchestrator.records import event_types as ev
from orchestrator.records.events import Event
from orchestrator.records.receipt import STATUSES, EgressSum, Usage

if TYPE_CHECKING:  # imported when installed, never before (see above)
    from wsgiref.simple_server import WSGIServer
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

    from prometheus_client import CollectorRegistry

NAMESPACE = "wakeloop"
# Sandbox calls run from ~30 ms (a warm pool) to the bash tool's timeout.
CALL_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
LAG_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 300)
# The `kind` label: each Usage count (records/receipt.py) by its name without `_tokens`.
TOKEN_KINDS = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_tokens",
    "cache_write": "cache_write_tokens",
    "thinking": "thinking_tokens",  # a part of output: not to be summed with it
}

TOOLS = (  # the registry's (wake/tools.py, wake/editor_tool.py, tasks)
    "bash",
    "write_file",
    "send_message",
    "complete_task",
    "str_replace_based_edit_tool",
    "memory",
)
WAKE_STATUSES = STATUSES  # a receipt's (records/receipt.py)
OTHER = "other"  # every value outside its label's set
MAX_AGENTS = 2000  # agent label values: a fleet far larger than serve is fitted for
MAX_MODELS = 16  # model label values: the handful of models a fleet uses
MODEL_NAME = re.compile(r"[A-Za-z0-9 ._:@/()+-]{1,80}")
AGENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")  # a folder name (console/pages.py's rule)

_m: _Metrics | None = None  # the metrics, once installed
_install_lock = threading.Lock()
_agents: dict[str, tuple[str, str]] = {}  # run_id -> (agent, model), from wake_started to wake_finished
_live: set[str] = set()  # container ids made and not yet removed (a set: a removal may be retried)
_roots: set[Path] = set()  # the ROOTs whose agents may be an `agent` label (watch_root)
_agent_labels: dict[str, str] = {}  # an event file's folder -> its agent label, decided once
_models: set[str] = set()  # model label values given out so far
_labels_lock = threading.Lock()


class _Every(TypedDict):
    """What every metric is made with."""

    namespace: str
    registry: CollectorRegistry


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        kw: _Every = {"namespace": NAMESPACE, "registry": registry}
        self.wakes = Counter("wakes", "Wakes finished, by agent and receipt status", ["agent", "status"], **kw)
        self.model_requests = Counter("model_requests", "Model requests made (one per step)", ["agent", "model"], **kw)
        self.tokens = Counter(
            "tokens",
            "Tokens used, by kind: input, output, cache_read, cache_write; thinking (a part of output)",
            ["agent", "kind"],
            **kw,
        )
        self.usd = Counter(
            "cost_usd", "Cost in US dollars at the ledger's prices, booked when a wake ends", ["agent", "model"], **kw
        )
        self.tool_calls = Counter(
            "tool_calls", "Tool calls, by tool and exit class: ok, error, timeout, denied", ["tool", "exit_class"], **kw
        )
        self.call_seconds = Histogram(
            "sandbox_call_duration_seconds",
            "Wall time of one sandbox call, container start to removal hand-off",
            ["tool"],
            buckets=CALL_BUCKETS,
            **kw,
        )
        self.pool = Counter(
            "sandbox_pool_takes", "Calls that found a warm container (hit) or not (miss)", ["result"], **kw
        )
        self.pool_make_failures = Counter(
            "sandbox_pool_make_failures",
            "Warm containers the engine failed to make (the call that wanted one went cold instead)",
            **kw,
        )
        self.containers = Gauge("sandbox_containers", "Sandbox containers this process holds now", **kw)
        self.containers.set_function(lambda: len(_live))
        self.notifications = Counter(
            "notifications",
            "Notifications: queued (per channel), sent, failed (an attempt; retried), gave_up",
            ["outcome"],
            **kw,
        )
        self.egress = Counter(
            "egress_decisions",
            "Egress proxy decisions (a connection, or an intercepted request), allow or deny, booked when a wake ends",
            ["agent", "decision"],
            **kw,
        )
        self.egress_bytes = Counter(
            "egress_bytes", "Bytes through the egress proxy, up (sent by the box) or down", ["agent", "direction"], **kw
        )
        self.lag = Histogram(
            "scheduler_lag_seconds",
            "From a tick's due time (or a run-now request) to its wake's start",
            buckets=LAG_BUCKETS,
            **kw,
        )


def install(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Turn the metrics on in this process (idempotent); returns the registry they live in."""
    global _m
    from prometheus_client import REGISTRY

    from orchestrator.records.events import listen

    with _install_lock:
        if _m is None:
            _m = _Metrics(registry or REGISTRY)
            listen(on_event)
    return registry or REGISTRY


def watch_root(root: Path | str) -> None:
    """The agents under ROOT may be `agent` label values (serve and its console call this)."""
    with _labels_lock:
        _roots.add(Path(root).resolve())
        _agent_labels.clear()


def agent_label(events_path: Path | str) -> str:
    """The agent folder's name when it is an agent under a watched ROOT (and the labels given out
    are fewer than MAX_AGENTS), else `other`. Decided once per folder: a stat or two."""
    state = str(Path(events_path).parent)
    label = _agent_labels.get(state)
    if label is not None:
        return label
    folder = Path(state).parent
    try:
        resolved = folder.resolve()
        ours = (
            resolved.parent in _roots
            and AGENT_NAME.fullmatch(folder.name) is not None
            and (resolved / "agent.yaml").is_file()
        )
    except OSError:
        ours = False
    with _labels_lock:
        known = set(_agent_labels.values())
        label = folder.name if ours and (folder.name in known or len(known) < MAX_AGENTS) else OTHER
        if len(_agent_labels) < 4 * MAX_AGENTS:
            _agent_labels[state] = label
    return label


def model_label(name: str | None) -> str:
    name = str(name or "")
    with _labels_lock:
        if name in _models:
            return name
        if len(_models) < MAX_MODELS and MODEL_NAME.fullmatch(name):
            _models.add(name)
            return name
    return OTHER


def tool_label(name: str) -> str:
    return name if name in TOOLS else OTHER


def enabled() -> bool:
    return _m is not None


def exposition(registry: CollectorRegistry | None = None) -> tuple[bytes, str]:
    """The text format Prometheus scrapes, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(registry or REGISTRY), CONTENT_TYPE_LATEST


def serve_alone(addr: str, host_check: Callable[[int], Callable[[str | None], bool]]) -> WSGIServer:
    """`serve --metrics HOST:PORT` without the console: prometheus_client's exposition in a threaded
    WSGI server that answers only the Host names `host_check(bound port)` accepts (421 otherwise:
    a rebound name must not read it any more than the console). Returns the server (its
    server_port; shutdown() and server_close() to stop it)."""
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    host, port = split_addr(addr)
    install()
    exposition_app: WSGIApplication = make_wsgi_app()

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    answers: list[Callable[[str | None], bool]] = []

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if not answers or not answers[0](environ.get("HTTP_HOST")):
            start_response("421 Misdirected Request", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"421: these metrics do not answer to that Host\n"]
        return exposition_app(environ, start_response)

    server = make_server(host, port, guarded, Server, handler_class=Quiet)
    answers.append(host_check(server.server_port))
    threading.Thread(target=server.serve_forever, name="wakeloop-metrics", daemon=True).start()
    return server


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"{addr!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    return host.strip("[]"), int(port)


# -- hooks where no event says it ---------------------------------------------------------


def pool_take(hit: bool) -> None:
    if _m:
        _m.pool.labels("hit" if hit else "miss").inc()


def pool_make_failed() -> None:
    if _m:
        _m.pool_make_failures.inc()


def container_made(cid: str) -> None:
    if _m:
        _live.add(cid)


def container_removed(cid: str) -> None:
    _live.discard(cid)


def scheduler_lag(seconds: float) -> None:
    if _m:
        _m.lag.observe(max(0.0, seconds))


# -- from the event log -------------------------------------------------------------------


def on_event(path: Path, event: Event) -> None:
    """Called by EventLog after each line lands (on the writing thread), with the line's record."""
    record, run = event.record, event.run_id
    fallback = (agent_label(path), OTHER)
    if isinstance(record, ev.WakeStarted):
        _agents[run] = (fallback[0], model_label(record.model))
    agent, model = _agents.get(run, fallback)
    if _m is not None:  # (always so: on_event is listened to once _m is made)
        _count(_m, agent, model, record)
    if isinstance(record, ev.WakeFinished):
        _agents.pop(run, None)


def _count(m: _Metrics, agent: str, model: str, record: ev.EventRecord) -> None:
    if isinstance(record, ev.ModelResponse):
        m.model_requests.labels(agent, model_label(record.model) if record.model else model).inc()
        _tokens(m, agent, record.usage)
    elif isinstance(record, ev.ToolResult):
        tool = tool_label(record.tool)
        m.tool_calls.labels(tool, exit_class(record)).inc()
        if record.container_id and record.duration_ms is not None:
            m.call_seconds.labels(tool).observe(record.duration_ms / 1000)
    elif isinstance(record, ev.WakeFinished):
        _wake_finished(m, agent, model, record)
    elif isinstance(record, ev.NotifyQueued):
        m.notifications.labels("queued").inc(max(record.channels, 0))
    elif isinstance(record, (ev.NotifySent, ev.NotifyFailed, ev.NotifyGaveUp)):
        m.notifications.labels(_NOTIFY_OUTCOMES[type(record)]).inc()


_NOTIFY_OUTCOMES = {ev.NotifySent: "sent", ev.NotifyFailed: "failed", ev.NotifyGaveUp: "gave_up"}


def _tokens(m: _Metrics, agent: str, usage: Usage) -> None:
    for kind, name in TOKEN_KINDS.items():
        value = getattr(usage, name)
        if value > 0:
            m.tokens.labels(agent, kind).inc(value)


def exit_class(result: ev.ToolResult) -> str:
    if result.denied:
        return "denied"
    if result.timed_out:
        return "timeout"
    if result.is_error or result.exit_code not in (None, 0):
        return "error"
    return "ok"


def _wake_finished(m: _Metrics, agent: str, model: str, finished: ev.WakeFinished) -> None:
    receipt = finished.receipt
    status = finished.status or (receipt.status if receipt else "")
    m.wakes.labels(agent, status if status in WAKE_STATUSES else OTHER).inc()
    if receipt and receipt.usd and receipt.usd > 0:
        m.usd.labels(agent, model_label(receipt.model) if receipt.model else model).inc(receipt.usd)
    if receipt:
        _egress(m, agent, receipt.egress)


def _egress(m: _Metrics, agent: str, total: EgressSum) -> None:
    """The wake's egress sum (receipt.py; summed from state/egress.jsonl by records/egress.py): no host
    or path label, whatever the box asked for; counts already held to MAX_COUNT by the receipt."""
    for decision, count in (("allow", total.allowed), ("deny", total.denied)):
        if count > 0:
            m.egress.labels(agent, decision).inc(count)
    for direction, count in (("up", total.bytes_up), ("down", total.bytes_down)):
        if count > 0:
            m.egress_bytes.labels(agent, direction).inc(count)
