"""A call's deadline: killed at its time or at the stop switch, never once cancelled,
and no thread started per call (the watchdog's promise; the engine's probes,
kills_at_deadline and ends_call_with_ptrace_stopped_init, attack it with real boxes)."""

from __future__ import annotations

import socket
import threading
import time

from orchestrator.sandbox.containers.deadline import Deadline

WAIT_S = 30  # generous: a loaded host


class Engine:
    """Stands in for the Docker API's kill: the container's stream ends when it is killed."""

    def __init__(self):
        self.killed: dict[str, float] = {}
        self.kill_seen = threading.Condition()
        self.deadlines: dict[str, Deadline] = {}

    def kill(self, cid: str) -> None:
        with self.kill_seen:
            self.killed[cid] = time.monotonic()
            self.kill_seen.notify_all()
        self.deadlines[cid].cancel()  # the stream ended: the call's reader cancels, as engine.py does

    def wait_killed(self, *cids: str) -> bool:
        with self.kill_seen:
            return self.kill_seen.wait_for(lambda: all(c in self.killed for c in cids), WAIT_S)


def deadline(engine: Engine, cid: str, timeout_s: float, halted=lambda: False) -> Deadline:
    near, far = socket.socketpair()
    far.close()
    made = Deadline(engine, cid, near, timeout_s, halted)
    engine.deadlines[cid] = made
    return made


def test_each_call_is_killed_at_its_own_deadline_and_a_cancelled_one_never():
    engine = Engine()
    late, cancelled, soon = (
        deadline(engine, "late", 0.6),
        deadline(engine, "cancelled", 0.2),
        deadline(engine, "soon", 0.1),
    )
    started = time.monotonic()
    for each in (late, cancelled, soon):
        each.start()
    cancelled.cancel()  # its call ended in time
    assert engine.wait_killed("soon", "late")
    assert engine.killed["soon"] - started >= 0.1 and engine.killed["late"] - started >= 0.6
    assert "cancelled" not in engine.killed  # its time (0.2 s) passed before the late one's kill
    assert soon.fired and late.fired and not cancelled.fired and not soon.stopped


def test_a_call_due_before_the_watchdog_looks_next_wakes_it(monkeypatch):
    from orchestrator.records import stopswitch

    engine = Engine()
    with monkeypatch.context() as patch:
        patch.setattr(stopswitch, "POLL_S", 60)  # the watchdog looks once a minute, or at a deadline
        long = deadline(engine, "long", 120)
        long.start()  # the watchdog now waits a minute
        started = time.monotonic()
        short = deadline(engine, "short", 0.1)
        short.start()
        assert engine.wait_killed("short")
        assert engine.killed["short"] - started < WAIT_S  # not at the watchdog's next look, a minute on
        long.cancel()
    due = deadline(engine, "due", 0)  # wakes the watchdog, which looks every POLL_S again from here
    due.start()
    assert engine.wait_killed("due")


def test_the_stop_switch_kills_a_call_long_before_its_deadline():
    engine, switch = Engine(), threading.Event()
    call = deadline(engine, "call", 600, halted=switch.is_set)
    call.start()
    switch.set()
    assert engine.wait_killed("call")
    assert call.stopped and not call.fired


def test_a_hundred_calls_at_once_start_no_thread_of_their_own():
    engine = Engine()
    deadline(engine, "warm", 600).start()  # the process's watchdog is up from here
    engine.deadlines["warm"].cancel()
    before = set(threading.enumerate())
    calls = [deadline(engine, f"c{i}", 600) for i in range(100)]
    for call in calls:
        call.start()
    # By name: another test's leftover daemon thread may come or go meanwhile.
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("wakeloop-deadline")]
    for call in calls:
        call.cancel()
    assert not engine.killed
