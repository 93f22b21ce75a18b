"""Traces: a live wake (the real SDK against the fake API, a real sandbox) exported over OTLP/HTTP
to a real receiver on 127.0.0.1 that this test runs and whose protobuf it decodes.

The tree of one wake: invoke_agent at the root; under it the SDK's own
spans (`anthropic.messages.create`, gen_ai.operation.name chat; one per model
request) and an `execute_tool` span per tool call, with the container that ran it beneath. No prompt, mandate or tool
output is in any span unless WAKELOOP_TRACE_CONTENT asks.
"""

from __future__ import annotations

import pytest

from orchestrator.testing.fakeapi import FAKE_KEY, FakeAPI, text, tool_use, turn
from tests.helpers import run_cli, wait_for
from tests.helpers.receivers import Collector

pytestmark = pytest.mark.docker

MANDATE_MARK = "MANDATE-MARK-6e1d"
OUTPUT_MARK = "BOX-OUTPUT-93ac"


class Receiver:
    """OTLP/HTTP traces sent to a Collector (tests/helpers/receivers.py): every span decoded
    (opentelemetry-proto), and the raw bytes."""

    def __init__(self):
        self.spans: list[dict] = []
        self.raw = b""
        collector = Collector(self.take)
        self.url, self.close = collector.url, collector.close

    def take(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.raw += body
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.spans += [_span(s, scope.scope.name) for s in scope.spans]


def _span(s, scope: str) -> dict:
    def value(v):
        kind = v.WhichOneof("value")
        return list(value(x) for x in v.array_value.values) if kind == "array_value" else getattr(v, kind)

    return {
        "name": s.name,
        "id": s.span_id.hex(),
        "parent": s.parent_span_id.hex() or None,
        "trace": s.trace_id.hex(),
        "scope": scope,
        "attrs": {a.key: value(a.value) for a in s.attributes},
        "error": s.status.code == 2,
    }


def test_a_live_wake_is_one_trace_wake_model_requests_tool_calls_and_containers(agent_dir):
    (agent_dir / "mandate.md").write_text(f"Keep notes. {MANDATE_MARK}\n")
    receiver = Receiver()
    replies = [turn(text("Checking."), tool_use("bash", {"command": f"echo {OUTPUT_MARK}"})), turn(text("Done."))]
    try:
        with FakeAPI(replies) as api:
            done = run_cli(
                "wake",
                str(agent_dir),
                "--live",
                env={
                    "ANTHROPIC_BASE_URL": api.url,
                    "ANTHROPIC_API_KEY": FAKE_KEY,
                    "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                    "OTEL_BSP_SCHEDULE_DELAY": "200",
                },
            )
        assert done.returncode == 0, done.stderr
        spans = wait_for(lambda: receiver.spans if len(receiver.spans) >= 5 else None, "the wake's spans", 30)
    finally:
        receiver.close()
    assert len({s["trace"] for s in spans}) == 1, "one wake, one trace"
    ours = {s["name"] for s in spans if s["scope"] == "wakeloop"}
    assert ours == {"invoke_agent", "execute_tool", "sandbox"}, "span names are fixed; names and ids are attributes"
    by_name = {}
    for s in spans:
        by_name.setdefault(s["name"].split(" ")[0], []).append(s)
    [wake] = by_name["invoke_agent"]
    assert wake["parent"] is None and wake["attrs"]["gen_ai.agent.name"] == "agent"
    assert wake["attrs"]["gen_ai.operation.name"] == "invoke_agent" and wake["attrs"]["wakeloop.status"] == "done"
    chats = [s for s in spans if s["scope"] == "com.anthropic.sdk.python"]  # the SDK's own spans, not ours
    assert len(chats) == 2 and all(c["parent"] == wake["id"] for c in chats)
    assert all(c["attrs"]["gen_ai.operation.name"] == "chat" for c in chats)
    assert all(c["attrs"]["gen_ai.request.model"] == "claude-sonnet-5-5" for c in chats)
    assert all("gen_ai.usage.output_tokens" in c["attrs"] for c in chats)
    [tool] = by_name["execute_tool"]
    assert tool["parent"] == wake["id"] and tool["attrs"]["gen_ai.tool.name"] == "bash"
    assert tool["attrs"]["wakeloop.exit_code"] == 0 and tool["attrs"]["gen_ai.tool.call.id"]
    [box] = by_name["sandbox"]
    assert box["parent"] == tool["id"] and box["attrs"]["wakeloop.container.id"]
    for mark in (MANDATE_MARK, OUTPUT_MARK, FAKE_KEY):
        assert mark.encode() not in receiver.raw, f"{mark} reached a span"
