"""state/: the wake lock under real concurrency and kill -9, state.json recovery, the inbox.

The race and crash tests use real `wakeloop wake` processes; the sandbox
calls inside them are real containers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from orchestrator.records.events import EVENTS_FILE, EventLog, read_events
from orchestrator.records.state import (
    LOCK_FILE,
    STATE_FILE,
    State,
    WakeLock,
    commit_inbox,
    drain_inbox,
    load_state,
    lock_holder,
    peek_inbox,
    restore_inbox,
    save_state,
    send_message_to_agent,
)
from orchestrator.records.transcript import read_lines, transcript_path
from tests.helpers import REPO, scrubbed_env, support, wait_for
from tests.helpers.sync import read_until, release_fifo

WAKE_TIMEOUT_S = 120  # one CLI wake with a few sandbox calls on a busy engine
EVENT_DEADLINE_S = 60  # until a started wake reaches its sandbox call


def start_wake(agent_dir: Path, script: Path) -> subprocess.Popen:
    env = scrubbed_env()
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "wake", str(agent_dir), "--script", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def script_file(tmp_path: Path, command: str) -> Path:
    path = tmp_path / f"script-{abs(hash(command))}.json"
    path.write_text(json.dumps([{"tool_calls": [{"name": "bash", "input": {"command": command}}]}, {"text": "done"}]))
    return path


def receipt_of(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


# -- the lock ------------------------------------------------------------------------


def test_two_wakes_started_together_exactly_one_runs(agent_dir, tmp_path):
    script = script_file(tmp_path, "sleep 3; echo slept")
    procs = [start_wake(agent_dir, script) for _ in range(2)]
    outs = [p.communicate(timeout=WAKE_TIMEOUT_S) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    statuses = sorted(receipt_of(out)["status"] for out, _ in outs)
    assert statuses == ["done", "skipped_locked"]
    skipped = next(out for out, _ in outs if receipt_of(out)["status"] == "skipped_locked")
    assert "another wake" in skipped
    assert json.loads((agent_dir / "state" / STATE_FILE).read_text())["wake"] == 1
    assert not (agent_dir / "state" / LOCK_FILE).exists()


def test_kill_9_mid_run_next_wake_takes_over_and_state_parses(agent_dir, tmp_path, docker_client):
    send_message_to_agent(agent_dir / "state", "survive the crash")
    proc = start_wake(agent_dir, script_file(tmp_path, "sleep 60"))
    events = agent_dir / "state" / EVENTS_FILE
    wait_for(
        lambda: any(e.type == "tool_call" for e in read_events(events)),
        "the first wake to reach its sandbox call",
        EVENT_DEADLINE_S,
    )
    holder = lock_holder(agent_dir / "state")
    assert holder is not None and holder.pid == proc.pid
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert (agent_dir / "state" / LOCK_FILE).exists()  # left behind, holding a dead pid
    # Its transcript is a readable prefix: up to the call it was killed in, no end line.
    killed = next(e.run_id for e in read_events(events) if e.type == "wake_started")
    lines = list(read_lines(transcript_path(agent_dir / "state", killed)))
    assert [line["type"] for line in lines] == ["wake", "system", "user", "assistant"]
    assert lines[-1]["content"][0]["input"] == {"command": "sleep 60"}
    shown = support.run_cli("log", str(agent_dir), "--run", killed[:6])
    assert shown.returncode == 0 and '-> bash {"command": "sleep 60"}' in shown.stdout
    assert "no end line" in shown.stdout

    second = start_wake(agent_dir, script_file(tmp_path, "echo second"))
    out, err = second.communicate(timeout=WAKE_TIMEOUT_S)
    assert second.returncode == 0, err
    receipt = receipt_of(out)
    assert receipt["status"] == "done" and receipt["wake"] == 2
    assert f"took over the lock of pid {proc.pid}" in err  # progress is on stderr
    # progress, on stderr: the killed wake's `sleep 60` box, removed
    assert "left by an earlier, interrupted wake" in err
    workspace = str((agent_dir / "workspace").resolve())
    assert not docker_client.api.containers(all=True, filters={"label": f"wakeloop.workspace={workspace}"})
    state = json.loads((agent_dir / "state" / STATE_FILE).read_text())
    assert state["wake"] == 2
    for line in events.read_text().splitlines():
        json.loads(line)  # every line whole
    assert not (agent_dir / "state" / LOCK_FILE).exists()


def test_sigterm_ends_the_wake_cleanly(agent_dir, tmp_path):
    # The call reads a FIFO, released once the wake has said it took the SIGTERM:
    # the stop lands mid-call every time, never after the script's last turn.
    hold = agent_dir / "workspace/hold"
    os.mkfifo(hold, 0o666)
    proc = start_wake(agent_dir, script_file(tmp_path, "head -c 1 hold; echo ok"))
    events = agent_dir / "state" / EVENTS_FILE
    wait_for(
        lambda: any(e.type == "tool_call" for e in read_events(events)),
        "the wake to reach its sandbox call",
        EVENT_DEADLINE_S,
    )
    proc.send_signal(signal.SIGTERM)
    said = read_until(proc, proc.stderr, "SIGTERM: the wake ends at its next step boundary", WAKE_TIMEOUT_S)
    release_fifo(hold, WAKE_TIMEOUT_S)
    out, err = proc.communicate(timeout=WAKE_TIMEOUT_S)
    assert proc.returncode == 0, said + err
    receipt = receipt_of(out)
    assert (receipt["status"], receipt["reason"]) == ("done", "stopped")
    assert not (agent_dir / "state" / LOCK_FILE).exists()


def test_lock_in_process_second_holder_sees_the_first(tmp_path):
    first, second = WakeLock(tmp_path), WakeLock(tmp_path)
    assert first.acquire() is None
    holder = second.acquire()
    assert holder is not None and holder.pid == os.getpid() and holder.alive
    first.release()
    assert not (tmp_path / LOCK_FILE).exists()
    assert second.acquire() is None and second.stale is None
    second.release()


def test_lock_of_a_dead_pid_is_taken_over_at_once(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / LOCK_FILE).write_text(f"{dead.pid} 2026-01-01T00:00:00Z\n")
    lock = WakeLock(tmp_path)
    assert lock.acquire() is None
    assert lock.stale is not None and lock.stale.pid == dead.pid
    assert (tmp_path / LOCK_FILE).read_text().split()[0] == str(os.getpid())
    lock.release()


# -- state.json -----------------------------------------------------------------------


def test_state_round_trip_is_atomic(tmp_path):
    save_state(tmp_path, State(wake=3, tokens_lifetime=1200))
    assert load_state(tmp_path) == (State(wake=3, tokens_lifetime=1200), None)
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]  # no temp file left


def test_corrupt_state_is_rebuilt_from_events_with_a_warning(tmp_path):
    log = EventLog(tmp_path / EVENTS_FILE, "r1")
    log.emit("wake_started", wake=4)
    log.emit("wake_finished", tokens=500, receipt={"status": "done"})
    log.emit("wake_started", wake=5)  # killed: no wake_finished
    (tmp_path / STATE_FILE).write_text('{"wake": 2, "tokens_li')
    state, warning = load_state(tmp_path)
    assert (state.wake, state.tokens_lifetime) == (5, 500)
    assert warning and "rebuilt" in warning


def test_missing_state_and_no_events_is_a_fresh_start_without_warning(tmp_path):
    assert load_state(tmp_path) == (State(), None)


def test_corrupt_state_does_not_stop_a_wake(agent_dir, tmp_path):
    (agent_dir / "state" / STATE_FILE).write_text("not json at all")
    proc = start_wake(agent_dir, script_file(tmp_path, "true"))
    out, err = proc.communicate(timeout=WAKE_TIMEOUT_S)
    assert proc.returncode == 0, err
    assert "rebuilt" in err
    assert json.loads((agent_dir / "state" / STATE_FILE).read_text())["wake"] == 1


# -- the inbox -------------------------------------------------------------------------


def test_inbox_drain_commit_and_restore(tmp_path):
    send_message_to_agent(tmp_path, "one")
    assert "one" in drain_inbox(tmp_path)
    send_message_to_agent(tmp_path, "two")  # arrives while the wake runs
    restore_inbox(tmp_path)  # the wake died before its first model call
    text = peek_inbox(tmp_path)
    assert text.index("one") < text.index("two")  # put back at the head of the queue
    assert "one" in drain_inbox(tmp_path) and "two" in peek_inbox(tmp_path)
    commit_inbox(tmp_path)
    assert peek_inbox(tmp_path) == ""


def test_inbox_taken_by_a_killed_wake_is_drained_next_time(tmp_path):
    send_message_to_agent(tmp_path, "old")
    drain_inbox(tmp_path)  # ...and then the wake was killed -9
    send_message_to_agent(tmp_path, "new")
    text = drain_inbox(tmp_path)
    assert text.index("old") < text.index("new")
