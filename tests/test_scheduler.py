"""`wakeloop serve`: real wakes (scripted model, real sandbox) on interval schedules of seconds.

Each test reads what happened from the agents' own event logs: when each wake
started and finished. Waiting is always a poll of a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import pytest

from orchestrator.fleet.schedule import first_due, save_tick
from orchestrator.fleet.scheduler import Scheduler, describe_receipt
from orchestrator.policy.agent import init_agent
from orchestrator.policy.schedule_line import ScheduleError, parse_schedule
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.receipt import Receipt, Usage
from orchestrator.records.state import WakeLock, lock_holder
from orchestrator.views.fleet_table import status_table
from orchestrator.wake.loop import wake
from tests.helpers import REPO, make_agent, scrubbed_env, wait_for
from tests.helpers.leftovers import our_containers
from tests.helpers.sync import read_until, release_fifo

WAIT_S = 90  # the longest any condition here may take on a busy engine
POLL_S = 0.1

QUICK = [
    {
        "text": "journal",
        "tool_calls": [
            {
                "name": "bash",
                "input": {"command": "mkdir -p memory/journal && echo 'wake {wake}' >> memory/journal/{today}.md"},
            }
        ],
    },
    {"text": "done"},
]
SLOW = [
    {
        "text": "slow",
        "tool_calls": [
            {
                "name": "bash",
                "input": {
                    "command": "sleep 3; mkdir -p memory/journal && echo 'wake {wake}' >> memory/journal/{today}.md"
                },
            }
        ],
    },
    {"text": "done"},
]


def script_file(tmp_path: Path, turns: list) -> Path:
    path = tmp_path / f"script-{len(list(tmp_path.glob('script-*')))}.json"
    path.write_text(json.dumps(turns))
    return path


def wakes(agent_dir: Path) -> list[tuple[datetime, datetime | None]]:
    """(started, finished) of every wake in the agent's event log, in order."""
    starts, ends = {}, {}
    for e in read_events(agent_dir / "state" / EVENTS_FILE):
        t = datetime.fromisoformat(e.timestamp.replace("Z", "+00:00"))
        if e.type == "wake_started":
            starts[e.run_id] = t
        elif e.type == "wake_finished":
            ends[e.run_id] = t
    return sorted((s, ends.get(r)) for r, s in starts.items())


def finished(agent_dir: Path) -> int:
    return sum(1 for _, end in wakes(agent_dir) if end)


@contextmanager
def serving(root: Path, script: Path, k: int = 4):
    lines: list[str] = []
    scheduler = Scheduler(root, k, wake_fn=partial(wake, script=script), out=lines.append, rescan_s=0.3)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        yield scheduler, lines
    finally:
        scheduler.request_stop()
        thread.join(timeout=WAIT_S)
        assert not thread.is_alive(), "the scheduler did not stop"


# -- schedules -------------------------------------------------------------------------


def test_schedules_are_cron_lines_or_intervals():
    assert parse_schedule("30s").interval_s == 30
    assert parse_schedule("5m").interval_s == 300
    assert parse_schedule("1d").interval_s == 86400
    berlin = parse_schedule("0 9 * * *", "Europe/Berlin")  # 09:00 in Berlin is 08:00Z in winter
    assert berlin.next_after(datetime(2026, 12, 1, 0, 0, tzinfo=UTC)) == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert berlin.next_after(datetime(2026, 7, 1, 0, 0, tzinfo=UTC)).hour == 7  # and 07:00Z in summer
    with pytest.raises(ScheduleError, match="not an IANA name"):
        parse_schedule("0 9 * * *", "Mars/Olympus")
    assert parse_schedule("*/30 * * * *").interval_s is None
    with pytest.raises(ScheduleError, match="neither a cron line"):
        parse_schedule("every tuesday")
    for fields in ("*/5 * * *", "0 0 * * * *", "0 0 * * * * 2027"):  # croniter's 6th field: seconds
        with pytest.raises(ScheduleError, match="neither a cron line of five fields"):
            parse_schedule(fields)
    assert parse_schedule("@daily").interval_s is None
    with pytest.raises(ScheduleError, match="under"):
        parse_schedule("0.1s")


def test_ticks_missed_while_down_come_due_once():
    now = datetime(2026, 11, 29, 12, 0, 30, tzinfo=UTC)
    cron = parse_schedule("* * * * *")
    due = first_due(cron, now - timedelta(seconds=60), now)
    assert due <= now  # a tick missed by 30 s: due at once...
    assert cron.next_after(now) > now  # ...and after it, the next real tick
    # Ten ticks missed: the first is 9.5 minutes late, more than the interval: not run late.
    assert first_due(cron, now - timedelta(minutes=10), now) == datetime(2026, 11, 29, 12, 1, tzinfo=UTC)
    assert first_due(cron, None, now) == datetime(2026, 11, 29, 12, 1, tzinfo=UTC)
    assert first_due(parse_schedule("60s"), None, now) == now  # a new interval agent starts now


def test_a_tick_missed_by_more_than_its_interval_is_skipped_aloud_not_run_late(tmp_path):
    root = tmp_path / "agents"
    agent_dir = make_agent(root, "late", schedule="60s")
    save_tick(agent_dir / "state", datetime.now(UTC) - timedelta(hours=5))
    lines: list[str] = []
    scheduler = Scheduler(root, out=lines.append)
    scheduler._scan(startup=True)  # what serve does first: no wake is run here
    [entry] = scheduler._entries.values()
    assert entry.due > datetime.now(UTC)  # the next regular tick, not now
    assert any("late: tick" in line and "more than its interval: skipped" in line for line in lines), lines
    skipped = [e for e in read_events(agent_dir / "state" / EVENTS_FILE) if e.type == "tick_skipped"]
    assert len(skipped) == 1 and "4h 59m" in skipped[0].data["reason"]


@pytest.mark.docker
def test_a_missed_tick_runs_once_not_once_per_missed_tick(tmp_path):
    root = tmp_path / "agents"
    agent_dir = make_agent(root, "late", schedule="60s")
    save_tick(agent_dir / "state", datetime.now(UTC) - timedelta(seconds=90))  # 1 missed, 30 s late
    with serving(root, script_file(tmp_path, QUICK)):
        wait_for(lambda: finished(agent_dir) == 1, "the catch-up wake", WAIT_S)
        # The next tick is 60s away: no second catch-up wake may start meanwhile.
        end = time.monotonic() + 3
        while time.monotonic() < end:
            assert len(wakes(agent_dir)) == 1
            time.sleep(POLL_S)


# -- serving ---------------------------------------------------------------------------------


@pytest.mark.serial  # a wall-clock bound: alone, not beside another worker
@pytest.mark.docker
def test_two_agents_wake_on_time(tmp_path):
    root = tmp_path / "agents"
    a, b = make_agent(root, "a", schedule="4s"), make_agent(root, "b", schedule="4s")
    with serving(root, script_file(tmp_path, QUICK)) as (_, lines):
        wait_for(lambda: finished(a) >= 3 and finished(b) >= 3, "three wakes of each agent", WAIT_S)
    for agent_dir in (a, b):
        starts = [s for s, _ in wakes(agent_dir)]
        gaps = [(later - earlier).total_seconds() for earlier, later in zip(starts, starts[1:], strict=False)]
        # A start trails its tick by the box's set-up, which a loaded engine stretches;
        # a tick that finds the last wake still running is skipped, and says so.
        skipped = any(f" {agent_dir.name}: tick" in line and "skipped" in line for line in lines)
        assert all(g >= 2.0 for g in gaps), f"{agent_dir.name} woke twice for one tick: {gaps}"
        assert skipped or all(g <= 6.0 for g in gaps), f"{agent_dir.name} missed a tick: {gaps}"
        assert 3.0 <= sorted(gaps)[len(gaps) // 2] <= 5.0, f"{agent_dir.name} not every 4 s: {gaps}"
    assert lines[0].split(" ", 2)[2].startswith("wakeloop serve: 2 agent(s)")
    assert sum(" a: wake " in line for line in lines) >= 3


@pytest.mark.docker
def test_a_wake_that_outlasts_its_interval_is_never_doubled(tmp_path):
    root = tmp_path / "agents"
    agent_dir = make_agent(root, "slow", schedule="1s")
    with serving(root, script_file(tmp_path, SLOW)) as (_, lines):
        wait_for(lambda: finished(agent_dir) >= 2, "two slow wakes", WAIT_S)
    runs = wakes(agent_dir)
    for (_, e1), (s2, _) in zip(runs, runs[1:], strict=False):
        assert e1 is not None and s2 >= e1, f"wakes overlapped: {runs}"
    assert any("slow: tick" in line and "skipped" in line for line in lines)
    types = [e.type for e in read_events(agent_dir / "state" / EVENTS_FILE)]
    assert "wake_skipped" not in types  # the scheduler skipped the tick, not the lock


@pytest.mark.docker
def test_agents_added_changed_and_removed_are_picked_up_without_a_restart(tmp_path):
    root = tmp_path / "agents"
    root.mkdir()
    with serving(root, script_file(tmp_path, QUICK)) as (_, lines):
        # An agent made before serve's first listing is a starting agent, not an added one.
        wait_for(lambda: lines, "serve's startup line", WAIT_S)
        assert "0 agent(s)" in lines[0]
        first = make_agent(root, "first", schedule="300s")
        wait_for(lambda: finished(first) == 1, "the added agent's first wake", WAIT_S)
        config = first / "agent.yaml"
        config.write_text(config.read_text().replace("every: 300s", "every: 2s"))
        wait_for(lambda: finished(first) >= 2, "a wake on the changed schedule", WAIT_S)
        config.unlink()
        wait_for(lambda: any("removed first" in line for line in lines), "the removal", WAIT_S)
    assert any("added first: every 300s" in line for line in lines)
    assert any("changed first: every 2s" in line for line in lines)


@pytest.mark.docker
def test_twenty_agents_due_at_once_all_complete_at_most_k_at_a_time(tmp_path):
    root = tmp_path / "agents"
    agents = [make_agent(root, f"agent{i:02d}", schedule="600s") for i in range(20)]
    with serving(root, script_file(tmp_path, QUICK), k=4) as (scheduler, _):
        wait_for(lambda: all(finished(a) == 1 for a in agents), "20 wakes", 240)
    edges = []
    for agent_dir in agents:
        ((start, end),) = wakes(agent_dir)
        edges += [(start, 1), (end, -1)]
    running = peak = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start at a tie
        running += step
        peak = max(peak, running)
    assert 2 <= peak <= 4, f"peak concurrency {peak}"
    assert scheduler.completed == 20


@pytest.mark.docker
def test_sigterm_mid_wake_ends_cleanly(tmp_path, docker_client, disk_view):
    root = tmp_path / "agents"
    agent_dir = make_agent(root, "busy", schedule="60s")  # the built-in dry run: four tool calls
    # Its first call ends with `head memory/core.md`: a FIFO there holds the call
    # open until the test has seen serve take the SIGTERM, so the stop surely
    # lands mid-wake (the harness's own reader skips FIFOs, as tested elsewhere).
    core = agent_dir / "workspace/memory/core.md"
    core.unlink()
    os.mkfifo(core, 0o666)
    env = scrubbed_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "serve", str(root)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        events = agent_dir / "state" / EVENTS_FILE
        wait_for(lambda: any(e.type == "tool_call" for e in read_events(events)), "the first tool call", WAIT_S)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        seen = read_until(proc, proc.stdout, "stopping: no new wakes", WAIT_S)
        release_fifo(core, WAIT_S)
        out, _ = proc.communicate(timeout=WAIT_S)
        out = seen + out
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert took < 30, f"took {took:.1f}s to stop"
    assert "stopped: every wake ended cleanly" in out
    finish = [e for e in read_events(events) if e.type == "wake_finished"]
    assert len(finish) == 1 and finish[0].data["reason"] == "stopped"
    assert lock_holder(agent_dir / "state") is None
    lock = WakeLock(agent_dir / "state")
    assert lock.acquire() is None  # free: we can take it
    lock.release()
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    assert "harness stub" in (disk_view(agent_dir) / f"memory/journal/{day}.md").read_text()
    assert our_containers(docker_client, tmp_path) == []


# -- what a person reads -------------------------------------------------------------------


def test_a_receipt_becomes_one_readable_line_with_the_receipt_after_it():
    receipt = Receipt(
        run_id="abc",
        agent="demo",
        wake=3,
        status="done",
        reason="end_turn",
        steps=5,
        tool_calls=4,
        usage=Usage(input_tokens=1000, output_tokens=234),
        duration_ms=4200,
        live=False,
    )
    line = describe_receipt("demo", receipt)
    assert line.startswith("demo: wake 3 done (dry run) in 4.2s: 5 steps, 4 tool calls, 1,234 tokens")
    assert "\n" not in line
    assert Receipt.from_json(json.loads(line.split(" | receipt ", 1)[1])) == receipt


def test_status_root_is_one_table_of_every_agent(tmp_path):
    root = tmp_path / "agents"
    a = make_agent(root, "alpha", schedule="60s")
    make_agent(root, "beta", schedule="* * * * *")
    from orchestrator.records.tasks import add_task

    add_task(a / "state", "one")
    add_task(a / "state", "two")
    (a / "state" / "outbox.txt").write_text("--- 2026-11-29T00:00:00Z wake 1\nhello\n")
    from orchestrator.records.ledger import record

    record(a / "state", 0.12, 3000)
    note, *table = status_table(root).splitlines()
    assert note.startswith("scheduler not running")  # no serve under this root
    assert table[0].split() == [
        "AGENT",
        "MODE",
        "LAST",
        "WAKE",
        "RESULT",
        "NEXT",
        "WAKE",
        "HEALTH",
        "TOKENS",
        "TODAY",
        "TOKENS",
        "TOTAL",
        "USD",
        "TODAY",
        "USD",
        "TOTAL",
        "OPEN",
        "TASKS",
        "UNREAD",
        "OUTBOX",
    ]
    alpha = next(line for line in table if line.startswith("alpha"))
    assert alpha.split()[-2:] == ["2", "1"] and "never" in alpha
    assert alpha.split()[-6:-2] == ["3,000", "0", "$0.1200", "$0.1200"]  # tokens today/total, usd
    assert any(line.startswith("beta") for line in table)
    (a / "state" / "ledger.json").write_text("{broken")
    alpha = next(line for line in status_table(root).splitlines() if line.startswith("alpha"))
    assert "? (ledger unreadable)" in alpha


@pytest.mark.docker
def test_an_agent_with_a_usd_cap_on_an_unpriced_model_is_not_scheduled(tmp_path):
    root = tmp_path / "agents"
    agent_dir = make_agent(
        root, "pricey", schedule="60s", live=True, policy={"budget": {"max_usd_per_day": 5}}, model="claude-imaginary-9"
    )
    with serving(root, script_file(tmp_path, QUICK)) as (_, lines):
        wait_for(lambda: any(line.startswith("wakeloop serve:", 21) for line in lines), "startup", WAIT_S)
    refusal = [line for line in lines if "pricey: not scheduled:" in line]
    assert len(refusal) == 1 and "has no known price" in refusal[0]
    assert wakes(agent_dir) == []


def test_a_linked_agent_folder_or_agent_yaml_is_no_agent(tmp_path):
    from orchestrator.fleet.schedule import agent_dirs

    root = tmp_path / "agents"
    real = init_agent(root / "real")
    elsewhere = init_agent(tmp_path / "elsewhere")
    (root / "linked").symlink_to(elsewhere)  # a folder that is a link
    odd = init_agent(root / "odd")
    (odd / "agent.yaml").unlink()
    (odd / "agent.yaml").symlink_to(elsewhere / "agent.yaml")  # an agent.yaml that is a link
    assert agent_dirs(root) == [real]
