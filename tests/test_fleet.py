"""Many agents on one host: no container made in vain, K fitted to the host, queued wakes in order.

The efficiency test is a real fleet: live wakes through the real SDK against
the fake Messages API (answering at a model's pace), real containers; what
the engine created is read back from its own event stream afterwards.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.fleet import capacity
from orchestrator.fleet.scheduler import Scheduler, fitted
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.receipt import Receipt
from orchestrator.sandbox.engine import LABEL
from tests.helpers import make_agent, support

WAIT_S = 120  # six live wakes of five turns on a busy engine
PACE_S = 0.3  # the fake model's answer time: the pace the pool is built for
CALLS = 4  # tool calls per wake; then end_turn, and the harness's journal stub
MAX_CONTAINERS_PER_CALL = 1.05  # issue 14: containers created / calls served, across the fleet
GiB, MiB = 2**30, 2**20


def paced(rec):
    """CALLS bash calls, one a turn, then end_turn; each answer after PACE_S, as a model's."""
    from orchestrator.testing.fakeapi import text, tool_use, turn

    step = sum(1 for m in rec.body.get("messages", []) if m.get("role") == "assistant")
    time.sleep(PACE_S)
    if step >= CALLS:
        return turn(text("Done for this wake."))
    return turn(tool_use("bash", {"command": f"echo step {step} >> notes.txt"}))


def run_fleet(root: Path, k: int, count: int):
    scheduler = Scheduler(root, k, out=lambda line: None, rescan_s=0.3)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        support.wait_for(lambda: scheduler.completed >= count, f"{count} wakes", WAIT_S)
    finally:
        scheduler.request_stop()
        thread.join(timeout=WAIT_S)
    return scheduler


class Creates:
    """Counts, from the engine's live event stream, the sandbox containers created for
    workspaces under `root`. (A query afterwards would not do: the engine keeps only
    its last 256 events, and other work on it pushes ours out.)"""

    def __init__(self, docker_client, root: Path):
        self.client, self.root, self.count, self.marker_seen = docker_client, str(root), 0, False
        self.marker = f"{root}/.marker"
        self._stream = docker_client.events(
            decode=True, filters={"type": "container", "event": "create", "label": f"{LABEL}=1"}
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for event in self._stream:
            where = event["Actor"]["Attributes"].get("wakeloop.workspace", "")
            if where == self.marker:
                self.marker_seen = True
                return
            self.count += where.startswith(self.root + "/")

    def total(self) -> int:
        """Every create so far: the stream is in order, so once a marker made now is
        seen, so is every create before it."""
        image = self.client.images.list()[0].id
        cid = self.client.api.create_container(image, labels={LABEL: "1", "wakeloop.workspace": self.marker})["Id"]
        self.client.api.remove_container(cid, force=True)
        support.wait_for(lambda: self.marker_seen, "the engine's event for the marker", WAIT_S)
        self._stream.close()
        return self.count


def calls_served(agent_dir: Path) -> int:
    """Tool calls that reached a box, and journal stubs appended (a call each)."""
    events = list(read_events(agent_dir / "state" / EVENTS_FILE))
    return sum(1 for e in events if e.type == "tool_result" and e.data.get("container_id")) + sum(
        1 for e in events if e.type == "journal_stub" and e.data.get("written")
    )


@pytest.mark.docker
def test_a_fleet_makes_no_container_in_vain(tmp_path, fake_api, docker_client):
    root = tmp_path / "agents"
    agents = [make_agent(root, f"agent{i}", schedule="600s", live=True) for i in range(6)]
    fake_api(then=paced)
    creates = Creates(docker_client, root.resolve())
    scheduler = run_fleet(root, k=3, count=len(agents))
    created = creates.total()
    calls = sum(calls_served(a) for a in agents)
    assert scheduler.completed == len(agents)
    assert calls == len(agents) * (CALLS + 1), f"{calls} calls served"
    assert created / calls <= MAX_CONTAINERS_PER_CALL, f"{created} containers for {calls} calls"


def test_the_chosen_concurrency_is_the_tightest_limit_and_says_all_three():
    engine = capacity.choose(capacity.Host(2, 24 * GiB, 6.0, ", 8 cold calls in 1.3 s,", 0.6), 512 * MiB)
    assert engine.wakes == 15 and "set by engine" in engine.why  # 6/s x (1 s + 0.6 s) x 1.5 = 14.4
    for what in (
        "cores 16 (2 cores x 8)",
        "memory 48 (24.0 GiB available / 512 MiB per call)",
        "engine 15 (6.0 containers/s, 8 cold calls in 1.3 s, x (1 s turn + 0.6 s a call) x 1.5)",
        "--max-concurrent",
    ):
        assert what in engine.why
    assert "\n" not in engine.why
    memory = capacity.choose(capacity.Host(2, 3 * GiB, 6.0, "", 0.6), 1 * GiB)
    assert memory.wakes == 3 and "set by memory" in memory.why
    brokered = capacity.choose(capacity.Host(2, 24 * GiB, None, ": the broker holds it"), 512 * MiB)
    assert brokered.wakes == 16 and "engine not measured: the broker holds it" in brokered.why
    assert capacity.choose(capacity.Host(1, 100 * MiB, 0.1), 512 * MiB).wakes == 1  # never 0


def test_a_fleet_within_the_cores_and_memory_limits_runs_whole_past_the_engines_limit():
    host = dict(cores=2, memory_available=24 * GiB, engine_rate=1.5, engine_latency_s=1.7)  # engine: 7
    small = capacity.choose(capacity.Host(**host, agents=10), 512 * MiB)
    assert small.wakes == 10 and "set by agents" in small.why and "engine 7 " in small.why
    big = capacity.choose(capacity.Host(**host, agents=200), 512 * MiB)
    assert big.wakes == 7 and "set by engine" in big.why
    tight = capacity.choose(capacity.Host(**host | {"memory_available": 4 * GiB}, agents=10), 512 * MiB)
    assert tight.wakes == 7 and "set by engine" in tight.why  # 10 agents would pass memory's 8


@pytest.mark.docker
def test_serve_measures_the_engine_and_says_its_choice_in_its_first_line(tmp_path):
    root = tmp_path / "agents"
    make_agent(root, "solo", schedule="600s", live=False)
    choice = fitted(root)
    assert choice.wakes >= 1 and "containers/s" in choice.why and "cold calls in" in choice.why
    lines: list[str] = []
    scheduler = Scheduler(root, choice.wakes, out=lines.append, why=choice.why)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    support.wait_for(lambda: lines, "serve's first line", WAIT_S)
    scheduler.request_stop()
    thread.join(timeout=WAIT_S)
    assert choice.why in lines[0]


def test_wakes_past_k_wait_in_the_order_they_fell_due_and_none_is_starved(tmp_path):
    # K=1; one agent ticks every second, six others are due once. Queued ticks
    # of the fast one coalesce behind the others: it can never jump the queue.
    root = tmp_path / "agents"
    make_agent(root, "a-fast", schedule="1s", live=False)
    slow = [make_agent(root, f"slow{i}", schedule="600s", live=False).name for i in range(6)]
    starts: list[tuple[str, float]] = []
    running, peak = [0], [0]
    lock = threading.Lock()

    def stand_in(agent, stop):
        with lock:
            starts.append((agent.name, time.monotonic()))
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        stop.wait(0.2)  # the wake's own work, not a synchronisation
        with lock:
            running[0] -= 1
        return Receipt(
            run_id="standin",
            agent=agent.name,
            wake=1,
            status="done",
            reason="end_turn",
            started_at=datetime.now(UTC).isoformat(),
        )

    lines: list[str] = []
    scheduler = Scheduler(root, 1, wake_fn=stand_in, out=lines.append, rescan_s=60)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        support.wait_for(
            lambda: sum(1 for name, _ in starts if name == "a-fast") >= 2, "the fast agent's second wake", WAIT_S
        )
    finally:
        scheduler.request_stop()
        thread.join(timeout=WAIT_S)
    names = [name for name, _ in starts]
    assert names[:7] == ["a-fast", *slow], names  # due at once: in name order
    assert names[7] == "a-fast"  # its next tick waited its turn
    assert peak[0] == 1
    p50, p99 = scheduler.lag_percentiles()
    assert p50 is not None and 0 <= p50 <= p99 and len(scheduler.lags) >= 8
    assert any(line.split(" ", 2)[2].startswith("queue drained:") and "p99" in line for line in lines)
