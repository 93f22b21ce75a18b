"""Prometheus metrics: what `serve --http` shows at GET /metrics, and `--metrics ADDR` alone.

Most metrics are read off the event log as it is written (records/events.py
`listen`): the same record `wakeloop log` and `status` read, so a wake, a
tool call or a notification is counted exactly when its event lands, and
there is no second account of what happened. What no event says is counted
where it happens: pool hits and misses and live containers (sandbox/), and
the scheduler's lag from a tick's due time to its wake's start (fleet/).

Off until `install()`: every hook returns at once, and prometheus_client is
not even imported, so `wakeloop wake` and the broker pay nothing.

Labels: `agent` is the only unbounded one (one series per agent). `model`
is the handful of models in use, `tool` the registry's tools, `status`,
`kind`, `exit_class`, `outcome` and `result` small fixed sets.

Under compose the sandbox runs in the broker, so the pool and container
metrics of the orchestrator's /metrics stay at zero there.

Not here: the HTTP listener (console/app.py, or prometheus_client's own
server for `--metrics`), spans (tracing.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

NAMESPACE = "wakeloop"
# Sandbox calls run from ~30 ms (a warm pool) to the bash tool's timeout.
CALL_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
LAG_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 300)
TOKEN_KINDS = {"input_tokens": "input", "output_tokens": "output", "cache_read_input_tokens": "cache_read",
               "cache_creation_input_tokens": "cache_write"}

_m = None                           # the metrics, once installed
_install_lock = threading.Lock()
_agents: dict[str, tuple[str, str]] = {}   # run_id -> (agent, model), from wake_started to wake_finished
_live: set[str] = set()             # container ids made and not yet removed (a set: a removal may be retried)


class _Metrics:
    def __init__(self, registry):
        from prometheus_client import Counter, Gauge, Histogram
        kw = {"namespace": NAMESPACE, "registry": registry}
        self.wakes = Counter("wakes", "Wakes finished, by agent and receipt status",
                             ["agent", "status"], **kw)
        self.model_requests = Counter("model_requests", "Model requests made (one per step)",
                                      ["agent", "model"], **kw)
        self.tokens = Counter("tokens", "Tokens used, by kind: input, output, cache_read, cache_write",
                              ["agent", "kind"], **kw)
        self.usd = Counter("cost_usd", "Cost in US dollars at the ledger's prices, booked when a wake ends",
                           ["agent", "model"], **kw)
        self.tool_calls = Counter("tool_calls", "Tool calls, by tool and exit class: ok, error, timeout, denied",
                                  ["tool", "exit_class"], **kw)
        self.call_seconds = Histogram("sandbox_call_duration_seconds",
                                      "Wall time of one sandbox call, container start to removal hand-off",
                                      ["tool"], buckets=CALL_BUCKETS, **kw)
        self.pool = Counter("sandbox_pool_takes", "Calls that found a warm container (hit) or not (miss)",
                            ["result"], **kw)
        self.containers = Gauge("sandbox_containers", "Sandbox containers this process holds now", **kw)
        self.containers.set_function(lambda: len(_live))
        self.notifications = Counter("notifications", "Notifications: queued (per channel), sent, "
                                     "failed (an attempt; retried), gave_up", ["outcome"], **kw)
        self.lag = Histogram("scheduler_lag_seconds", "From a tick's due time (or a run-now request) "
                             "to its wake's start", buckets=LAG_BUCKETS, **kw)


def install(registry=None):
    """Turn the metrics on in this process (idempotent); returns the registry they live in."""
    global _m
    from prometheus_client import REGISTRY
    from orchestrator.records.events import listen
    with _install_lock:
        if _m is None:
            _m = _Metrics(registry or REGISTRY)
            listen(on_event)
    return registry or REGISTRY


def enabled() -> bool:
    return _m is not None


def exposition(registry=None) -> tuple[bytes, str]:
    """The text format Prometheus scrapes, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
    return generate_latest(registry or REGISTRY), CONTENT_TYPE_LATEST


def serve_alone(addr: str) -> None:
    """`serve --metrics HOST:PORT` without the console: prometheus_client's own server."""
    from prometheus_client import start_http_server
    host, port = split_addr(addr)
    install()
    start_http_server(port, addr=host)


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"{addr!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    return host.strip("[]"), int(port)


# -- hooks where no event says it ---------------------------------------------------------

def pool_take(hit: bool) -> None:
    if _m:
        _m.pool.labels("hit" if hit else "miss").inc()


def container_made(cid: str) -> None:
    if _m:
        _live.add(cid)


def container_removed(cid: str) -> None:
    _live.discard(cid)


def scheduler_lag(seconds: float) -> None:
    if _m:
        _m.lag.observe(max(0.0, seconds))


# -- from the event log -------------------------------------------------------------------

def on_event(path: Path, event: dict) -> None:
    """Called by EventLog.emit after each line lands (on the emitting thread)."""
    kind, data, run = event["type"], event["data"], event["run_id"]
    fallback = (Path(path).parent.parent.name, "")
    if kind == "wake_started":
        _agents[run] = (str(data.get("agent") or fallback[0]), str(data.get("model") or ""))
    agent, model = _agents.get(run, fallback)
    handler = _HANDLERS.get(kind)
    if handler:
        handler(agent, model, data)
    if kind == "wake_finished":
        _agents.pop(run, None)


def _model_response(agent: str, model: str, data: dict) -> None:
    _m.model_requests.labels(agent, data.get("model") or model).inc()
    for key, value in (data.get("usage") or {}).items():
        if key in TOKEN_KINDS and isinstance(value, int) and value > 0:
            _m.tokens.labels(agent, TOKEN_KINDS[key]).inc(value)


def _tool_result(agent: str, model: str, data: dict) -> None:
    tool = str(data.get("tool") or "?")
    _m.tool_calls.labels(tool, exit_class(data)).inc()
    if data.get("container_id") and isinstance(data.get("duration_ms"), (int, float)):
        _m.call_seconds.labels(tool).observe(data["duration_ms"] / 1000)


def exit_class(data: dict) -> str:
    if data.get("denied"):
        return "denied"
    if data.get("timed_out"):
        return "timeout"
    if data.get("is_error") or data.get("exit_code") not in (None, 0):
        return "error"
    return "ok"


def _wake_finished(agent: str, model: str, data: dict) -> None:
    receipt = data.get("receipt") or {}
    _m.wakes.labels(agent, str(data.get("status") or receipt.get("status") or "?")).inc()
    usd = receipt.get("usd")
    if isinstance(usd, (int, float)) and usd > 0:
        _m.usd.labels(agent, str(receipt.get("model") or model)).inc(usd)


def _notify(outcome: str):
    def count(agent: str, model: str, data: dict) -> None:
        n = data.get("channels", 1) if outcome == "queued" else 1
        _m.notifications.labels(outcome).inc(n if isinstance(n, int) else 1)
    return count


_HANDLERS = {"model_response": _model_response, "tool_result": _tool_result, "wake_finished": _wake_finished,
             "notify_queued": _notify("queued"), "notify_sent": _notify("sent"),
             "notify_failed": _notify("failed"), "notify_gave_up": _notify("gave_up")}
