"""The one switch (`wakeloop stop ROOT`, ROOT/STOP): nothing starts, calls in flight die, wakes end `stopped`.

The measured test holds twenty wakes in real containers (`sleep 600`), flips
the switch, and times how long until every wake has written its `stopped`
receipt. Waiting is always a poll of a condition with a deadline.
"""

from __future__ import annotations

import json
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from orchestrator.broker.server import Broker
from orchestrator.broker.wire import BrokerError
from orchestrator.fleet.scheduler import Scheduler
from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.records import stopswitch
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.receipt import Receipt
from orchestrator.records.state import load_state, lock_holder
from orchestrator.views.agent_status import agent_status, render_agent_status
from orchestrator.wake.loop import wake
from tests.helpers import make_agent, run_cli, support
from tests.helpers.leftovers import our_containers

FLEET = 20  # agents mid-wake when the switch is flipped (the number)
START_S = 240  # twenty containers made at once on a loaded 2-core engine
STOPPED_WITHIN_S = 20  # generous: measured 1.2-2.9 s, median 2.2 s (20 runs);
# the kill waits POLL_S at most
# One call that would hold its wake for ten minutes, then nothing.
BLOCK = [{"text": "waiting", "tool_calls": [{"name": "bash", "input": {"command": "sleep 600"}}]}, {"text": "done"}]
LIGHT = {"sandbox": {"disk": "none", "pool": 0}}  # a bind mount and no warm container: twenty at once stay cheap


def receipt_of(agent_dir: Path) -> dict | None:
    finished = [e for e in read_events(agent_dir / "state" / EVENTS_FILE) if e.type == "wake_finished"]
    return finished[-1].data["receipt"] if finished else None


def running_sleeps(client, base: Path) -> int:
    found = client.api.containers(filters={"label": "wakeloop.sandbox=1", "status": "running"})
    return sum(1 for c in found if (c.get("Labels") or {}).get("wakeloop.workspace", "").startswith(str(base)))


@pytest.mark.docker
def test_stop_ends_twenty_wakes_mid_call_with_stopped_receipts(tmp_path, docker_client):
    root = tmp_path / "agents"
    agents = [make_agent(root, f"agent{i:02d}", schedule="600s", policy=LIGHT) for i in range(FLEET)]
    script = tmp_path / "block.json"
    script.write_text(json.dumps(BLOCK))
    lines: list[str] = []
    scheduler = Scheduler(root, FLEET, wake_fn=partial(wake, script=script), out=lines.append, rescan_s=0.3)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        support.wait_for(
            lambda: running_sleeps(docker_client, tmp_path) == FLEET, f"{FLEET} sleeps running in their boxes", START_S
        )
        flipped = time.monotonic()
        stopswitch.stop(root, why="the test flips the switch", who="tests")
        support.wait_for(lambda: all(receipt_of(a) for a in agents), "every wake's receipt", STOPPED_WITHIN_S * 3)
        took = time.monotonic() - flipped
        support.wait_for(lambda: any("STOPPED: " in line for line in lines), "serve saying so", STOPPED_WITHIN_S)
    finally:
        scheduler.request_stop()
        thread.join(timeout=START_S)
    assert not thread.is_alive(), "the scheduler did not stop"
    print(f"\n{FLEET} wakes mid-call: every `stopped` receipt {took:.2f}s after the switch")
    receipts = [receipt_of(a) for a in agents]
    assert {r["status"] for r in receipts} == {"stopped"}, receipts
    assert all("tests" in r["reason"] and "the test flips the switch" in r["reason"] for r in receipts)
    assert took < STOPPED_WITHIN_S, f"the fleet took {took:.1f}s to stop"
    for agent_dir in agents:
        results = [e for e in read_events(agent_dir / "state" / EVENTS_FILE) if e.type == "tool_result"]
        assert len(results) == 1 and results[0].data.get("exit_code") == 137, results  # killed, not finished
        assert lock_holder(agent_dir / "state") is None
        assert load_state(agent_dir / "state")[0].last_receipt.status == "stopped"
    assert our_containers(docker_client, tmp_path) == []


def test_no_wake_starts_while_stopped_and_start_lets_it(tmp_path):
    root = tmp_path / "agents"
    agent_dir = init_agent(root / "mine")
    stopswitch.stop(root, why="maintenance", who="ops")
    receipt = wake(load_agent(agent_dir))  # a dry run: no sandbox is reached before the check
    assert receipt.status == "stopped" and receipt.reason.startswith("not started:")
    assert "ops" in receipt.reason and "maintenance" in receipt.reason and f"wakeloop start {root}" in receipt.reason
    assert load_state(agent_dir / "state")[0].wake == 0  # nothing ran, nothing counted
    assert render_agent_status(agent_status(load_agent(agent_dir))).startswith("STOPPED: the fleet under ")
    assert stopswitch.start(root).who == "ops"
    assert stopswitch.read(root) is None and stopswitch.start(root) is None


def test_an_unreadable_switch_still_stops_and_a_linked_one_is_not_removed(tmp_path):
    root = tmp_path / "agents"
    root.mkdir()
    (root / stopswitch.STOP_FILE).write_bytes(b"\xff not json")
    assert "unreadable" in stopswitch.read(root).why  # present is what counts: fails closed
    (root / stopswitch.STOP_FILE).unlink()
    (root / stopswitch.STOP_FILE).symlink_to(tmp_path / "elsewhere")
    assert stopswitch.read(root) is not None  # a dangling link is still a stop
    with pytest.raises(stopswitch.StopSwitchError, match="not a regular file"):
        stopswitch.start(root)
    assert stopswitch.is_stopped(root)


def test_stop_and_start_from_the_cli_and_status_says_so(tmp_path):
    root = tmp_path / "agents"
    init_agent(root / "mine")
    done = run_cli("stop", str(root), "--reason", "budget review")
    assert done.returncode == 0, done.stderr
    assert "STOPPED" in done.stdout and "budget review" in done.stdout
    status = run_cli("status", str(root))
    assert status.returncode == 0 and status.stdout.startswith("STOPPED: ") and "budget review" in status.stdout
    assert "fleet stopped" in status.stdout  # the agent's next wake
    assert json.loads(run_cli("status", str(root), "--json").stdout)[0]["next_wake"] == "fleet stopped"
    wrong = run_cli("stop", str(root / "mine"))
    assert wrong.returncode == 2 and "is an agent" in wrong.stderr and "Traceback" not in wrong.stderr
    started = run_cli("start", str(root))
    assert started.returncode == 0 and "runs again" in started.stdout
    assert not (root / stopswitch.STOP_FILE).exists()


@pytest.mark.docker
def test_the_broker_refuses_every_call_while_stopped(tmp_path, docker_client):
    root = tmp_path / "agents"
    support.set_policy(init_agent(root / "alpha"), LIGHT)
    broker = Broker(root, client=docker_client, log=lambda line: None)
    try:
        stopswitch.stop(root, why="incident", who="ops")
        for op in (
            {"op": "check", "agent": "alpha"},
            {"op": "run", "agent": "alpha", "command": "true"},
            {"op": "write", "agent": "alpha", "path": "x", "content": ""},
        ):
            with pytest.raises(BrokerError, match="refused: the fleet under .* is stopped .*incident"):
                broker.handle(op)
        stopswitch.start(root)
        assert broker.handle({"op": "run", "agent": "alpha", "command": "echo ran"})["result"]["output"] == "ran\n"
    finally:
        broker.close()
    assert our_containers(docker_client, tmp_path) == []


def test_the_console_stops_and_starts_the_fleet_only_signed_in_with_the_forms_csrf(tmp_path):
    from orchestrator.console.app import Console, start
    from orchestrator.console.auth import Access
    from tests.helpers.console import TOKEN, Client

    root = tmp_path / "agents"
    init_agent(root / "one")
    listening = start(Console(root, Access(TOKEN, True)), "127.0.0.1", 0)
    try:
        client = Client(listening.url)
        assert client.post("/fleet/stop", {})[0] == 403 and not stopswitch.is_stopped(root)  # not signed in
        client.sign_in()
        assert client.post("/fleet/stop", {"csrf": "forged"})[0] == 403 and not stopswitch.is_stopped(root)
        csrf = Access(TOKEN, True).csrf
        assert client.post("/fleet/stop", {"csrf": csrf}, Origin="http://evil.example")[0] == 403
        status, headers, _ = client.post("/fleet/stop", {"csrf": csrf, "reason": "a runaway agent"})
        assert status == 303 and headers["location"] == "/?said=stop"
        halted = stopswitch.read(root)
        assert halted.why == "a runaway agent" and halted.who.startswith("the console")
        html = client.get("/?said=stop")[2]
        assert 'id="stopped"' in html and "a runaway agent" in html and 'id="fleet-start"' in html
        assert "fleet spend: $0.0000 today (no cap)" in html
        assert client.post("/fleet/start", {"csrf": csrf})[0] == 303 and not stopswitch.is_stopped(root)
        assert 'id="fleet-stop"' in client.get("/")[2]
    finally:
        listening.stop()


def test_serve_started_while_stopped_dispatches_nothing_until_start(tmp_path):
    """The switch outlives serve: a scheduler made after `stop` holds its ticks and run-now
    requests; after `start` the waiting run-now is taken. One pass at a time, no thread timing."""
    from orchestrator.fleet.control import RUN_NOW_FILE, request_run
    from orchestrator.fleet.schedule import utcnow

    root = tmp_path / "agents"
    agent_dir = make_agent(root, "mine", schedule="600s", policy=LIGHT)
    stopswitch.stop(root, why="overnight", who="ops")
    woken: list[str] = []
    lines: list[str] = []
    scheduler = Scheduler(
        root,
        4,
        wake_fn=lambda agent, stop: (
            woken.append(agent.name) or Receipt(run_id="r", agent=agent.name, wake=1, status="done", reason="end_turn")
        ),
        out=lines.append,
    )

    def one_pass():
        scheduler._reap()
        scheduler._watch_switch()
        scheduler._tick(utcnow())
        scheduler._dispatch()
        for thread in list(scheduler._threads.values()):
            thread.join(timeout=30)

    scheduler._scan(startup=True)
    request_run(agent_dir / "state")
    one_pass()  # due at once, and a run-now waiting: both held
    assert woken == [] and not scheduler._threads and scheduler.load()["stopped"]
    assert (agent_dir / "state" / RUN_NOW_FILE).exists()  # the person's request waits for `start`
    assert any("STOPPED: " in line and "overnight" in line for line in lines)
    stopswitch.start(root)
    one_pass()
    assert woken == ["mine"] and any("started: the fleet's switch is off" in line for line in lines)
    assert not (agent_dir / "state" / RUN_NOW_FILE).exists()
