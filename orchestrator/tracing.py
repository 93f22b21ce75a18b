"""OpenTelemetry traces: each wake a trace, when OTEL_EXPORTER_OTLP_ENDPOINT is set.

`pip install 'wakeloop[otel]'` brings the SDK and the OTLP/HTTP exporter;
without them, or without the variable, every function here is a no-op that
costs one `is None` test. The tree of one wake:

    invoke_agent                        the wake (wake/loop.py)
      anthropic.messages.create         each model request: the anthropic SDK's own span (it
                                        emits GenAI spans once a tracer provider is set);
      chat                              ours, same attributes, for a dry run's scripted model
      execute_tool                      each tool call
        sandbox                         the container that ran it, timed by the sandbox

Span names are these fixed strings: an agent's, a model's or a tool's name
(which a model may invent) and every id are attributes, capped at NAME_CAP
characters, so a trace backend's span-name index stays bounded.

Attribute names are the GenAI semantic conventions' where they exist
(gen_ai.operation.name, gen_ai.agent.name, gen_ai.request.model,
gen_ai.usage.*, gen_ai.tool.name, gen_ai.tool.call.id), `wakeloop.*`
otherwise. No prompt, reply, tool input or output goes into a span unless
WAKELOOP_TRACE_CONTENT=true (which also turns on the SDK's content mode).
The exporter reads the standard OTEL_* variables itself (endpoint, headers,
service name).

Not here: metrics (metrics.py), the event log (records/events.py).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from orchestrator.records.receipt import FAILED

if TYPE_CHECKING:  # the otel extra: imported by setup(), when tracing is on
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
CONTENT_ENV = "WAKELOOP_TRACE_CONTENT"
SCOPE = "wakeloop"
CONTENT_CAP = 4000  # chars of tool input/output in a span, when content is asked for
NAME_CAP = 128  # chars of a name or id in an attribute (a model may invent a tool name)

_tracer: Tracer | None = None  # set by setup() when tracing is on
_provider: TracerProvider | None = None


def setup(environ: Mapping[str, str] = os.environ, exporter: SpanExporter | None = None) -> bool:
    """Turn tracing on when the endpoint is set (or an exporter is given: tests, the bench).
    Says so in one line when the variable is set but the extra is missing."""
    global _tracer, _provider
    if _tracer is not None:
        return True
    if exporter is None and not environ.get(ENDPOINT_ENV):
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
    except ImportError as exc:
        print(
            f"wakeloop: {ENDPOINT_ENV} is set but tracing needs the otel extra "
            f"(pip install 'wakeloop[otel]'): {exc}; no traces are sent",
            file=sys.stderr,
        )
        return False
    from orchestrator import __version__

    _provider = TracerProvider(resource=Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "wakeloop")}))
    _provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(_provider)  # the anthropic SDK's spans go to the same place
    _tracer = trace.get_tracer(SCOPE, __version__)
    return True


def enabled() -> bool:
    return _tracer is not None


def content(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")


def sdk_option() -> dict[str, dict[str, str]] | None:
    """The anthropic client's `open_telemetry` option: content only when asked for."""
    return {"traces": {"content_mode": "content"}} if _tracer is not None and content() else None


def flush() -> None:
    if _provider is not None:
        _provider.force_flush()


@contextmanager
def wake_span(agent: str, run_id: str, model: str, live: bool) -> Iterator[Span | None]:
    """The wake's span, current on this thread for its length (the SDK's spans nest under it)."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(
        "invoke_agent",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent[:NAME_CAP],
            "gen_ai.conversation.id": run_id,
            "gen_ai.request.model": model,
            "wakeloop.run_id": run_id,
            "wakeloop.live": live,
        },
    ) as span:
        yield span


def wake_result(span: Span | None, status: str, steps: int, tokens: int, reason: str) -> None:
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attributes({"wakeloop.status": status, "wakeloop.steps": steps, "wakeloop.tokens": tokens})
    if status in FAILED:
        span.set_status(Status(StatusCode.ERROR, reason[:200]))


def scripted_chat(model: str, max_tokens: int, usage: Mapping[str, int], stop_reason: str, started_ns: int) -> None:
    """A dry run's model turn: no SDK call, so our own span with the SDK's names."""
    if _tracer is None:
        return
    span = _tracer.start_span(
        "chat",
        start_time=started_ns,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "wakeloop-scripted",
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": max_tokens,
            "gen_ai.response.finish_reasons": [stop_reason or ""],
            "gen_ai.usage.input_tokens": int(usage.get("input_tokens", 0)),
            "gen_ai.usage.output_tokens": int(usage.get("output_tokens", 0)),
        },
    )
    span.end()


@contextmanager
def tool_span(tool: str, call_id: str, args: object) -> Iterator[ToolSpan | None]:
    if _tracer is None:
        yield None
        return
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": str(tool)[:NAME_CAP],
        "gen_ai.tool.call.id": str(call_id)[:NAME_CAP],
        "gen_ai.tool.type": "function",
    }
    if content():
        attributes["gen_ai.tool.call.arguments"] = str(args)[:CONTENT_CAP]
    with _tracer.start_as_current_span("execute_tool", attributes=attributes) as span:
        yield ToolSpan(span)


class ToolSpan:
    def __init__(self, span: Span) -> None:
        self.span = span

    def result(self, text: str, is_error: bool, detail: Mapping[str, object]) -> None:
        """The call's outcome, and its container as a child span timed by the sandbox."""
        from opentelemetry.trace import Status, StatusCode

        attrs = {f"wakeloop.{k}": v for k, v in detail.items() if isinstance(v, (bool, int, float, str))}
        self.span.set_attributes(attrs)
        if content():
            self.span.set_attribute("gen_ai.tool.call.result", text[:CONTENT_CAP])
        if is_error:
            self.span.set_status(Status(StatusCode.ERROR, text.splitlines()[0][:200] if text else "error"))
        cid, ms = detail.get("container_id"), detail.get("duration_ms")
        if cid and isinstance(ms, (int, float)) and _tracer is not None:  # (a ToolSpan means it is)
            end = time.time_ns()
            box = _tracer.start_span(
                "sandbox", start_time=end - int(ms * 1e6), attributes={"wakeloop.container.id": str(cid), **attrs}
            )
            box.end(end_time=end)
