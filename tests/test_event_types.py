"""Each event type declared once (records/event_types.py), written and read through that one
declaration; one name per token count (records/receipt.py); old lines still read and sum right."""

from __future__ import annotations

import ast
import json
import re
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from orchestrator import metrics
from orchestrator.console.pages import turns
from orchestrator.fleet.scheduler import describe_receipt
from orchestrator.records import event_types as ev
from orchestrator.records.events import EVENTS_FILE, EventLog, parse_event, read_events
from orchestrator.records.receipt import STATUSES, Receipt, Usage
from orchestrator.records.state import load_state, rebuild_state
from orchestrator.views.agent_status import render_agent_status
from orchestrator.views.logview import render_line
from tests.helpers import REPO, make_agent, run_cli

DESIGN_TYPES = (
    "wake_started",
    "model_request",
    "model_response",
    "tool_call",
    "tool_result",
    "policy_denied",
    "budget_stop",
    "journal_stub",
    "wake_finished",
    "dead_letter",
)  # the design's (docs/architecture.md)

# Lines as wakeloop wrote them before the quantities had one name each: the API's names in a
# model_response's usage, `cache_creation_tokens` in a receipt.
OLD_LINES = [
    {
        "run_id": "old1",
        "type": "model_response",
        "timestamp": "2026-01-01T00:00:01.000Z",
        "data": {
            "step": 1,
            "stop_reason": "tool_use",
            "model": "claude-sonnet-4-6",
            "tokens_this_wake": 1500,
            "tool_names": ["bash"],
            "usage": {
                "input_tokens": 100,
                "output_tokens": 50,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 1350,
            },
        },
    },
    {
        "run_id": "old1",
        "type": "model_response",
        "timestamp": "2026-01-01T00:00:02.000Z",
        "data": {
            "step": 2,
            "stop_reason": "end_turn",
            "model": "claude-sonnet-4-6",
            "tokens_this_wake": 3060,
            "tool_names": [],
            "usage": {
                "input_tokens": 10,
                "output_tokens": 200,
                "cache_read_input_tokens": 1350,
                "cache_creation_input_tokens": 0,
            },
        },
    },
    {
        "run_id": "old1",
        "type": "wake_finished",
        "timestamp": "2026-01-01T00:00:03.000Z",
        "data": {
            "status": "done",
            "reason": "end_turn",
            "tokens": 3060,
            "steps": 2,
            "receipt": {
                "run_id": "old1",
                "agent": "a",
                "wake": 7,
                "status": "done",
                "reason": "end_turn",
                "steps": 2,
                "tokens": 3060,
                "input_tokens": 110,
                "output_tokens": 250,
                "cache_read_tokens": 1350,
                "cache_creation_tokens": 1350,
                "tool_calls": 1,
                "duration_ms": 4200,
                "model": "claude-sonnet-4-6",
                "live": True,
                "journal": "agent",
                "started_at": "2026-01-01T00:00:00.000Z",
                "usd": 0.0123,
                "task": "",
                "messages_waiting": 0,
                "no_room": "",
            },
        },
    },
]


# -- every type the code writes has its record ---------------------------------------------------


def written_records() -> dict[str, set[str]]:
    """Every `X.write(ev.Record(...))`, `_event(..., ev.Record(...))` or `ev.tool_result(...)` in
    orchestrator/, by record class name, and every `.emit("type", ...)` (which no harness code may use)."""
    found: dict[str, set[str]] = {"records": set(), "emits": set()}
    for path in (REPO / "orchestrator").rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        if path.name == "event_types.py" or not re.search(r"\bev\.|event_types|\.emit\(", source):
            continue
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "emit" and node.args and isinstance(node.args[0], ast.Constant):
                found["emits"].add(f"{path.relative_to(REPO)}: {node.args[0].value}")
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "ev":
                found["records"].add(func.attr)
            if isinstance(func, ast.Name) and _is_record(vars(ev).get(func.id)):
                found["records"].add(func.id)
    return found


def _is_record(thing) -> bool:
    return isinstance(thing, type) and issubclass(thing, ev.EventRecord)


def test_the_harness_writes_only_declared_records_and_every_record_is_registered():
    found = written_records()
    assert found["emits"] == set(), "the harness writes records (EventLog.write), not free keywords"
    declared = {cls.__name__ for cls in ev.RECORDS.values()}
    written = {n for n in found["records"] if _is_record(getattr(ev, n, None))}
    assert found["records"] - written <= {"tool_result"}
    assert written - declared == set(), "written but not in event_types.RECORDS"
    assert written | {"ToolResult", "ApprovalApproved", "ApprovalDenied"} >= declared, "declared, never written"
    assert all(name == cls.TYPE for name, cls in ev.RECORDS.items())
    subclasses = {c for c in vars(ev).values() if isinstance(c, type) and issubclass(c, ev.EventRecord) and c.TYPE}
    assert subclasses == set(ev.RECORDS.values())
    assert set(DESIGN_TYPES) <= set(ev.RECORDS)


def test_every_status_a_wake_ends_with_is_a_receipt_status():
    loop = (REPO / "orchestrator" / "wake" / "loop.py").read_text()
    said = set(re.findall(r'return "(\w+)", ', loop)) | set(re.findall(r'status="(\w+)"', loop))
    said |= set(re.findall(r'_unstarted\(agent, run_id, "(\w+)"', loop))
    assert said and said <= set(STATUSES), said - set(STATUSES)
    statuses = {
        "done",
        "budget_stop",
        "dead_letter",
        "blocked",
        "skipped_locked",
        "stopped",
        "skipped_node",
        "not_committed",
    }
    assert statuses == set(STATUSES)


# -- round trip ----------------------------------------------------------------------------------

SAMPLES = {
    int: 7,
    str: "x",
    bool: True,
    float: 1.5,
    Usage: Usage(100, 20, 30, 0, 40),
    typing.Any: {"command": "ls"},
    Receipt: Receipt(
        run_id="r1",
        agent="a",
        wake=3,
        status="blocked",
        reason="why",
        steps=2,
        usage=Usage(1, 2, 3, 0, 4),
        usd=None,
        no_room="full",
    ),
}


def sample(hint):
    """A value of this field's type that is not its default."""
    if hint in SAMPLES:
        return SAMPLES[hint]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is tuple:
        return (1, 2) if args[0] is int else ("a", "b")
    if typing.get_origin(hint) in (typing.Union, __import__("types").UnionType):
        return sample(args[0])
    return {"bytes": 5, "truncated": False}  # a Mapping: the tool's own detail


@pytest.mark.parametrize("cls", list(ev.RECORDS.values()), ids=list(ev.RECORDS))
def test_each_record_reads_back_as_written(tmp_path, cls):
    hints = typing.get_type_hints(cls)
    record = cls(**{f.name: sample(hints[f.name]) for f in fields(cls)})
    log = EventLog(tmp_path / EVENTS_FILE, "run1", secrets=())
    log.write(record)
    log.write(cls())  # every field at its default
    [full, empty] = list(read_events(tmp_path / EVENTS_FILE))
    assert (full.type, full.record) == (cls.TYPE, record)
    assert (empty.type, empty.record) == (cls.TYPE, cls())
    line = json.loads((tmp_path / EVENTS_FILE).read_text().splitlines()[0])
    assert set(line) == {"run_id", "type", "timestamp", "data"} and line["data"] == record.to_data()


def test_a_tool_result_keeps_the_keys_it_always_had():
    detail = {
        "exit_code": 0,
        "duration_ms": 31,
        "bytes": 3,
        "truncated": False,
        "timed_out": False,
        "oom_killed": False,
        "container_id": "c0ffee",
    }
    record = ev.tool_result(step=1, id="t1", tool="bash", is_error=False, result_chars=3, detail=detail)
    assert record.to_data() == {"step": 1, "id": "t1", "tool": "bash", "is_error": False, "result_chars": 3, **detail}
    assert (record.exit_code, record.duration_ms, record.container_id, record.detail) == (
        0,
        31,
        "c0ffee",
        {"bytes": 3, "truncated": False, "oom_killed": False},
    )


def test_an_unknown_type_or_a_field_of_the_wrong_type_is_kept_as_other_never_raised():
    for line in (
        {"run_id": "r", "type": "from_the_future", "timestamp": "t", "data": {"x": 1}},
        {"run_id": "r", "type": "tool_result", "timestamp": "t", "data": {"step": "one"}},
        {"run_id": "r", "type": "model_response", "timestamp": "t", "data": {"usage": [1, 2]}},
        {"run_id": "r", "type": "health", "timestamp": "t", "data": {"said": [1]}},
    ):
        event = parse_event(json.dumps(line))
        assert isinstance(event.record, ev.Other) and event.record.type == line["type"]
        assert event.record.to_data() == line["data"]
    # a field that may be unknown is unknown when it does not fit; a missing one is its default
    event = parse_event(
        json.dumps(
            {
                "run_id": "r",
                "type": "wake_finished",
                "timestamp": "t",
                "data": {"tokens": 5, "receipt": {"status": "from_nowhere"}},
            }
        )
    )
    assert event.record == ev.WakeFinished(tokens=5, receipt=None)


# -- one name per quantity; old names still read -----------------------------------------------


def old_log(tmp_path: Path) -> Path:
    (tmp_path / EVENTS_FILE).write_text("".join(json.dumps(line) + "\n" for line in OLD_LINES))
    return tmp_path


def test_an_old_log_reads_with_the_old_cache_names_and_sums_to_its_receipt(tmp_path):
    events = list(read_events(old_log(tmp_path) / EVENTS_FILE))
    used = sum(e.record.usage for e in events if isinstance(e.record, ev.ModelResponse))
    assert used == Usage(input_tokens=110, output_tokens=250, cache_write_5m_tokens=1350, cache_read_tokens=1350)
    [finished] = [e.record for e in events if isinstance(e.record, ev.WakeFinished)]
    assert finished.receipt is not None and finished.receipt.usage == used
    assert finished.receipt.tokens == used.tokens == finished.tokens == 3060
    assert (
        finished.receipt.to_dict()["cache_write_tokens"] == 1350
        and "cache_creation_tokens" not in finished.receipt.to_dict()
    )
    state = rebuild_state(tmp_path)
    assert state.tokens_lifetime == 3060 and state.last_receipt == finished.receipt


def test_an_old_state_json_receipt_reads_and_is_shown_as_before(tmp_path):
    old = OLD_LINES[2]["data"]["receipt"]
    (tmp_path / "state.json").write_text(json.dumps({"wake": 7, "tokens_lifetime": 3060, "last_receipt": old}))
    state, warning = load_state(tmp_path)
    assert warning is None and state.last_receipt == Receipt.from_json(old)
    assert state.last_receipt.usage.cache_write_tokens == 1350 and state.last_receipt.usd == 0.0123
    shown = describe_receipt("a", state.last_receipt)
    assert shown.startswith("a: wake 7 done in 4.2s: 2 steps, 1 tool calls, 3,060 tokens, $0.0123; end_turn")
    status = {
        "name": "a",
        "dir": "/a",
        "model": "m",
        "dry_run": False,
        "schedule": "1h",
        "wakes": 7,
        "tokens_lifetime": 3060,
        "last_receipt": old,
        "usd": {"error": "-"},
        "open_tasks": 0,
        "disk": {"limit_bytes": None},
        "state": {"bytes": 0, "rotate_bytes": 1, "rotate_days": 1, "keep_days": 1, "keep_bytes": 1},
        "lock": None,
        "inbox_waiting": 0,
        "outbox_messages": 0,
        "warning": None,
        "health": {"paused": False, "failures": 0},
        "notify": {"sent": 0, "waiting": 0, "gave_up": [], "retrying": []},
        "fleet_stopped": None,
    }
    text = render_agent_status(status)
    assert (
        "last wake    #7 done: end_turn (2 steps, 3,060 tokens, 1,350 cache reads, 1 tool calls, 4.2s) "
        "at 2026-01-01T00:00:00.000Z"
    ) in text


def test_metrics_count_an_old_line_and_a_new_one_the_same(tmp_path):
    from prometheus_client import CollectorRegistry

    old = parse_event(json.dumps(OLD_LINES[0]))
    new = parse_event(json.dumps({**OLD_LINES[0], "data": old.record.to_data()}))
    assert new.record.to_data()["usage"] == {
        "input_tokens": 100,
        "output_tokens": 50,
        "cache_read_tokens": 0,
        "cache_write_tokens": 1350,
        "thinking_tokens": 0,
    }
    counted = []
    for event in (old, new, parse_event(json.dumps(OLD_LINES[2]))):
        registry = CollectorRegistry()
        metrics._count(metrics._Metrics(registry), "a", "m", event.record)
        counted.append(
            {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in registry.collect()
                for s in family.samples
                if s.name.endswith("_total")
            }
        )
    assert counted[0] == counted[1]
    tokens = {labels: v for (name, labels), v in counted[0].items() if name == "wakeloop_tokens_total"}
    assert tokens == {
        (("agent", "a"), ("kind", "input")): 100,
        (("agent", "a"), ("kind", "output")): 50,
        (("agent", "a"), ("kind", "cache_write")): 1350,
    }
    assert counted[2][("wakeloop_wakes_total", (("agent", "a"), ("status", "done")))] == 1
    assert counted[2][("wakeloop_cost_usd_total", (("agent", "a"), ("model", "claude-sonnet-4-6")))] == 0.0123


def test_the_console_and_log_show_a_turns_tokens_from_old_and_new_transcripts():
    for usage in (OLD_LINES[0]["data"]["usage"], Usage.from_json(OLD_LINES[0]["data"]["usage"]).to_json()):
        line = {
            "type": "assistant",
            "t": "2026-01-01T00:00:01.000Z",
            "step": 1,
            "stop_reason": "tool_use",
            "usage": usage,
            "usd_so_far": 0.01,
            "content": [],
        }
        assert turns([line])[0]["tokens"] == 1500
        assert "(tool_use, 1,500 tokens, $0.0100 so far)" in render_line(line)


def test_usage_sums():
    parts = [Usage(1, 2, 3, 4, 5), Usage(10, 20, 30, 40, 50)]
    assert sum(parts) == parts[0] + parts[1] == Usage(11, 22, 33, 44, 55)
    assert sum(parts).tokens == 165 and sum(parts).cache_write_tokens == 77


def test_a_receipt_reads_whatever_it_lacks_as_its_default_and_refuses_an_unknown_status():
    assert Receipt.from_json({"status": "done"}) == Receipt(run_id="", agent="", wake=0, status="done", reason="")
    assert Receipt.from_json({"status": "done", "usd": None, "wake": -3, "live": 1}) == Receipt(
        run_id="", agent="", wake=0, status="done", reason="", usd=None, live=False
    )
    assert Receipt.from_json({"status": "finished"}) is None and Receipt.from_json(["done"]) is None


def test_a_planted_number_too_big_for_a_float_is_read_as_unknown_not_raised(tmp_path):
    # state.json and the event log are files anyone with the folder can write: a 400-digit
    # integer overflows float(), and every reader (status, log, the state rebuilt, metrics) must
    # still answer in its own words.
    huge = int("9" * 400)
    receipt = {
        "status": "done",
        "wake": 3,
        "usd": huge,
        "tokens": huge,
        "input_tokens": huge,
        "duration_ms": huge,
        "steps": 2,
    }
    agent = make_agent(tmp_path / "agents", "big")
    state_dir = agent / "state"
    state_dir.mkdir(exist_ok=True)
    lines = [
        {
            "run_id": "r",
            "type": "wake_finished",
            "timestamp": "2026-01-01T00:00:00.000Z",
            "data": {"tokens": huge, "receipt": receipt},
        },
        {
            "run_id": "r",
            "type": "notify_failed",
            "timestamp": "2026-01-01T00:00:01.000Z",
            "data": {"channel": "c", "retry_in_s": huge},
        },
    ]
    (state_dir / EVENTS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    parsed = Receipt.from_json(receipt)
    assert parsed is not None and parsed.usd is None and parsed.usage.input_tokens == parsed.duration_ms == 0
    assert [type(e.record) for e in read_events(state_dir / EVENTS_FILE)] == [ev.Other, ev.Other]
    rebuild_state(state_dir)
    (state_dir / "state.json").write_text(json.dumps({"wake": 3, "last_receipt": receipt}))
    for args in (("status", str(agent)), ("status", str(agent.parent)), ("log", str(agent))):
        done = run_cli(*args)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr[-2000:])
