"""state/transcripts/: one wake's words, bounded, scrubbed, pruned, rendered (records/transcript.py, views/logview.py).

The file-level rules need no engine; a whole wake's transcript read back after
kill -9 is in test_state.py's kill test (which already kills a wake mid-call).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from orchestrator.policy.ceiling import load_ceiling
from orchestrator.policy.load import parse_policy
from orchestrator.policy.schema import Policy, PolicyError
from orchestrator.records import transcript as tr
from orchestrator.views.logview import render_line, render_transcript

SECRET = "sk-ant-test-0123456789abcdef"


def lines_of(path):
    return list(tr.read_lines(path))


def test_lines_are_written_as_they_happen_scrubbed_and_a_torn_line_is_skipped(tmp_path):
    t = tr.Transcript(tmp_path, "run1", 1 << 20, (SECRET,))
    t.add("wake", wake=1, agent="a")
    t.system(f"you are a. key {SECRET}", "abc123")
    t.add("assistant", step=1, content=[{"type": "text", "text": f"the key is {SECRET}"}])
    assert [line["type"] for line in lines_of(t.path)] == ["wake", "system", "assistant"]  # before any end
    with open(t.path, "ab") as f:
        f.write(b'{"type": "tool_res')  # what kill -9 mid-write leaves
    assert [line["type"] for line in lines_of(t.path)] == ["wake", "system", "assistant"]
    everything = t.path.read_text() + tr.prompt_text(tmp_path, "abc123")
    assert SECRET not in everything and "[redacted]" in everything
    assert oct(t.path.stat().st_mode & 0o777) == "0o600"


def test_past_max_wake_bytes_lines_are_counted_and_the_end_line_still_lands(tmp_path):
    t = tr.Transcript(tmp_path, "big", tr.END_RESERVE + 2000, ())
    for step in range(50):
        t.add("tool_result", step=step, text="x" * 200)
    t.end(status="done", reason="end_turn")
    lines = lines_of(t.path)
    kinds = [line["type"] for line in lines]
    assert kinds.count("truncated") == 1 and kinds[-1] == "end"
    assert lines[-1]["dropped_lines"] == 50 - kinds.count("tool_result")
    assert t.path.stat().st_size <= tr.END_RESERVE + 2000


def test_prune_drops_old_then_oldest_over_the_cap_never_the_current_run_and_orphan_prompts(tmp_path):
    now = time.time()
    for i, age_days in enumerate([40, 3, 2, 1]):
        t = tr.Transcript(tmp_path, f"run{i}", 1 << 20, ())
        t.system("prompt", f"hash{i}")
        t.add("user", text="y" * 1000)
        os.utime(t.path, (now - age_days * 86400, now - age_days * 86400))
    current = tr.Transcript(tmp_path, "current", 1 << 20, ())
    current.system("prompt", "hash0")
    current.add("user", text="z" * 5000)
    os.utime(current.path, (now - 100 * 86400,) * 2)  # even an old-looking current run stays
    size = (tmp_path / "transcripts/run3.jsonl").stat().st_size
    pruned = tr.prune(
        tmp_path, max_agent_bytes=current.path.stat().st_size + size + 10, retention_days=30, keep="current", now=now
    )
    left = sorted(p.stem for p in tr.runs(tmp_path))
    assert left == ["current", "run3"] and pruned.files == 3
    assert sorted(p.stem for p in (tmp_path / "transcripts/prompts").iterdir()) == ["hash0", "hash3"]
    assert tr.find_run(tmp_path, "run3") is not None and tr.find_run(tmp_path, "run") is None  # whole ids only


def test_render_names_who_spoke_what_ran_exit_codes_and_cost(tmp_path):
    t = tr.Transcript(tmp_path, "r", 1 << 20, ())
    t.add("wake", run_id="r", wake=3, agent="demo", model="m", live=True)
    t.add(
        "assistant",
        step=1,
        content=[
            {"type": "text", "text": "Looking.\x1b[31m"},
            {"type": "tool_use", "name": "bash", "input": {"command": "ls"}},
        ],
        stop_reason="tool_use",
        usage={"input_tokens": 10, "output_tokens": 5},
        usd_so_far=0.0012,
    )
    t.add("tool_result", step=1, tool="bash", text="[exit 2]\nnope", exit_code=2, duration_ms=1500)
    t.end(status="done", reason="end_turn", steps=1, tokens=15, tool_calls=1, usd=0.0012, duration_ms=2000)
    text = "\n".join(render_transcript(lines_of(t.path), tmp_path))
    for expected in (
        "wake #3 of demo",
        "model > (tool_use, 15 tokens, $0.0012",
        '-> bash {"command": "ls"}',
        "bash <- exit 2, 1.5s",
        "== done: end_turn",
        "$0.0012",
    ):
        assert expected in text, text
    assert "\x1b" not in text
    assert render_line({"type": "odd", "x": 1}).startswith(" odd")


def test_transcript_policy_keys_have_defaults_are_checked_and_bounded_by_the_ceiling(tmp_path):
    assert Policy().transcript.retention_days == 30 and Policy().transcript.max_wake_bytes == 8 << 20
    policy = parse_policy("transcript: {max_wake_bytes: 64m, retention_days: 400}\n", "p.yaml")
    assert policy.transcript.max_wake_bytes == 64 << 20
    with pytest.raises(PolicyError, match="p.yaml:1: transcript.retention_days"):
        parse_policy("transcript: {retention_days: 0}\n", "p.yaml")
    ceiling = tmp_path / "ceiling.yaml"
    ceiling.write_text("max: {max_wake_bytes: 16m, retention_days: 90}\n")
    refusal = load_ceiling(ceiling).refusal(policy)
    assert "transcript.max_wake_bytes" in refusal and "ceiling" in refusal
    assert load_ceiling(ceiling).refusal(Policy()) is None


def test_follow_prints_a_running_wake_as_it_grows_and_stops_at_its_end(tmp_path):
    from orchestrator.views.logview import follow_transcript

    t = tr.Transcript(tmp_path, "live", 1 << 20, ())
    t.add("wake", run_id="live", wake=1, agent="a", model="m", live=False)
    shown, first = [], threading.Event()

    def out(line):
        shown.append(line)
        first.set()

    follower = threading.Thread(target=follow_transcript, args=(t.path, out), daemon=True)
    follower.start()
    assert first.wait(10), "the follower never printed the first line"
    t.add("tool_result", step=1, tool="bash", text="[exit 0]\nhi", exit_code=0, duration_ms=10)
    t.end(status="done", reason="end_turn", steps=1, tokens=0, tool_calls=1, usd=0, duration_ms=20)
    follower.join(10)
    assert not follower.is_alive(), "the follower did not stop at the end line"
    assert "wake #1 of a" in shown[0] and "bash <- exit 0" in shown[1] and "== done" in shown[2]


def test_log_root_follows_every_agent_a_line_per_event_prefixed_by_its_name(tmp_path):
    from orchestrator.policy.agent import init_agent
    from orchestrator.records.events import EVENTS_FILE, EventLog
    from orchestrator.views.logview import follow_root

    a, b = init_agent(tmp_path / "alpha"), init_agent(tmp_path / "beta")
    EventLog(a / "state" / EVENTS_FILE, "old").emit("wake_started", wake=1)  # before following: not shown
    shown, started = [], threading.Event()
    follower = threading.Thread(
        target=follow_root,
        kwargs=dict(root=tmp_path, out=shown.append, stop=lambda: started.set() or len(shown) >= 3),
        daemon=True,
    )
    follower.start()
    assert started.wait(10)
    EventLog(a / "state" / EVENTS_FILE, "r1").emit("wake_started", wake=2)
    EventLog(b / "state" / EVENTS_FILE, "r2").emit("dead_letter", reason="boom")
    gamma = init_agent(tmp_path / "gamma")  # added while following
    EventLog(gamma / "state" / EVENTS_FILE, "r3").emit("wake_finished", status="done")
    follower.join(20)
    assert not follower.is_alive()
    assert sorted(line.split()[0] for line in shown) == ["alpha", "beta", "gamma"]
    assert any("dead_letter" in line and "reason=boom" in line for line in shown)
