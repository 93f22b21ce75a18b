"""The event log: its line format, secrets scrubbed, torn lines survived, concurrent appends whole."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.records.events import REDACTED, EventLog, read_events, secrets_from_env
from orchestrator.views.eventview import format_event
from tests.helpers import REPO

APPENDS = 300  # lines per writer in the concurrency test
WRITERS = 3
WRITER_TIMEOUT_S = 60


def test_one_line_per_event_with_the_design_keys(tmp_path):
    log = EventLog(tmp_path / "events.jsonl", "run1", secrets=())
    log.emit("wake_started", wake=1)
    log.emit("tool_result", exit_code=0, output_note="multi\nline")
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        event = json.loads(line)
        assert set(event) == {"run_id", "type", "timestamp", "data"}
        assert event["run_id"] == "run1" and event["timestamp"].endswith("Z")
    assert json.loads(lines[1])["data"] == {"exit_code": 0, "output_note": "multi\nline"}


def test_secret_values_are_scrubbed_wherever_they_hide(tmp_path):
    key = "sk-ant-api03-SECRETSECRETSECRET"
    log = EventLog(tmp_path / "events.jsonl", "run1", secrets=secrets_from_env({"ANTHROPIC_API_KEY": key}))
    log.emit("dead_letter", reason=f"bad key {key}", nested={"deep": [f"x{key}y"]})
    text = (tmp_path / "events.jsonl").read_text()
    assert key not in text and text.count(REDACTED) == 2
    json.loads(text)


def test_short_or_missing_secret_is_not_scrubbed():
    assert secrets_from_env({"ANTHROPIC_API_KEY": "abc"}) == ()
    assert secrets_from_env({}) == ()


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    EventLog(path, "run1", secrets=()).emit("wake_started", wake=1)
    with open(path, "a") as f:
        f.write('{"run_id": "run1", "type": "tool_ca')  # kill -9 mid-write
    assert [e.type for e in read_events(path)] == ["wake_started"]


def test_concurrent_writers_never_interleave_within_a_line(tmp_path):
    path = tmp_path / "events.jsonl"
    code = (
        "import sys; from orchestrator.records.events import EventLog; "
        f"log = EventLog(sys.argv[1], sys.argv[2], secrets=()); "
        f"[log.emit('tick', n=n, pad='x' * 3000) for n in range({APPENDS})]"
    )
    root = REPO
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), f"w{i}"], cwd=root) for i in range(WRITERS)]
    assert all(p.wait(timeout=WRITER_TIMEOUT_S) == 0 for p in procs)
    lines = path.read_text().splitlines()
    assert len(lines) == WRITERS * APPENDS
    by_writer = {}
    for line in lines:
        event = json.loads(line)
        by_writer.setdefault(event["run_id"], []).append(event["data"]["n"])
    assert all(ns == list(range(APPENDS)) for ns in by_writer.values())


def test_format_event_is_one_clean_line(tmp_path):
    path = tmp_path / "events.jsonl"
    EventLog(path, "abcdef123456", secrets=()).emit("tool_call", command="echo \x1b[2J\nhi")
    (event,) = read_events(path)
    line = format_event(event)
    assert "\n" not in line and "\x1b" not in line and "tool_call" in line and "abcdef12" in line
