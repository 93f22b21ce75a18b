"""`wakeloop serve ROOT`: wake every agent under ROOT on its schedule.

An agent is a folder directly under ROOT holding agent.yaml. Its schedule is a
cron line (read by croniter, not by us) or a plain interval (`every: 30s`).
The rules, each kept in one place below:

- One wake per agent at a time: a tick that comes while the agent's wake is
  running or queued is skipped and logged (the wake lock in state.py also
  keeps out a manual `wakeloop wake`).
- A tick missed while the scheduler was down runs once, not once per missed
  tick: state/schedule.json keeps the last tick handled; on start, if a tick
  fell between it and now, one wake runs at once, unless that tick is late
  by more than the agent's interval: then it is skipped aloud (said, and
  `tick_skipped` in its events) and the next regular tick runs.
- A paused agent's ticks, and those inside its failure backoff, are skipped
  aloud (records/health.py); `wakeloop run-now` queues one wake at once
  (control.py); a wake that cannot start is recorded as that agent's failure.
- At most K wakes at once across agents (`serve` fits K to the host unless
  told: capacity.py); due wakes queue in the order they fell due (ties by
  name), first in, first out, so none is starved: an agent ticking again
  while queued is coalesced, never put ahead of one already waiting. The
  lag from due to started is kept (the last LAG_SAMPLES), said once the
  queue drains after a backlog, and written to ROOT/serve.json.
- ROOT is listed again every RESCAN_S: agents added, changed (agent.yaml
  edited) or removed are picked up without a restart.
- The fleet's switch (ROOT/STOP, `wakeloop stop ROOT`: records/stopswitch.py),
  looked at on every pass of the loop (at most RESCAN_S apart): while it is
  there no wake is dispatched, the queue is dropped, ticks are skipped (said
  once, not per tick) and run-now requests wait; running wakes end on their
  own with `stopped` receipts (loop.py), their calls killed by the sandbox.
  When `wakeloop start ROOT` removes it, the next regular ticks run.
- SIGTERM (or Ctrl-C): no new wakes; queued ones are dropped; running wakes
  get `stop` set, so each ends at its next step boundary, writes its journal
  stub, releases its lock and leaves no container; then exit 0, within
  SHUTDOWN_GRACE_S.

Wakes run as threads in this process, each calling loop.wake(). A wake spends
its time waiting on HTTP and on Docker, so the GIL costs nothing. Measured
here: serving 20 agents (K=4, all due at once) peaks at 94 MB RSS with 3.9 s of
CPU in all, while one `wakeloop wake` process alone peaks at 88 MB, so a
subprocess per wake would cost ~K x 88 MB plus the imports of every wake. The
shared `stop` event is also how SIGTERM reaches a step boundary. A wake that
raises is logged and never takes the scheduler down.

Not here: what a wake does (loop.py) or how it is billed (ledger.py).
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from orchestrator import metrics
from orchestrator.broker.client import broker_socket
from orchestrator.errors import WakeloopError
from orchestrator.fleet import capacity, control
from orchestrator.fleet.schedule import agent_dirs, first_due, last_tick, misfired, save_tick, stamp, utcnow
from orchestrator.notify import outcomes
from orchestrator.notify.sender import SenderThread
from orchestrator.policy.agent import PAUSE_AFTER_FAILURES, Agent, AgentError, load_agent, root_channels
from orchestrator.policy.schedule_line import Schedule, ScheduleError, parse_schedule
from orchestrator.policy.schema import PolicyError
from orchestrator.records import event_types as ev
from orchestrator.records import health, stopswitch
from orchestrator.records.events import EVENTS_FILE, EventLog
from orchestrator.records.receipt import Receipt

RESCAN_S = 2.0  # how often ROOT is listed for added, changed or removed agents
SHUTDOWN_GRACE_S = 60.0  # after SIGTERM, how long running wakes get to reach a step boundary
LAG_SAMPLES = 10_000  # due-to-started lags kept for the percentiles (a deque: bounded memory)
BACKLOG_SAID = 2  # a queue at least this long is said when it drains, with its lag
MAX_CONCURRENT = 4  # K when a Scheduler is made without one; `serve` fits K to the host
# -- the scheduler -------------------------------------------------------------


@dataclass
class _Entry:
    """What the scheduler knows about one agent (mutable; main thread only)."""

    dir: Path
    key: tuple  # agent.yaml's (mtime_ns, size): a change means reload
    name: str = ""
    schedule: Schedule | None = None
    due: datetime | None = None  # None: not schedulable (the error was logged)
    queued: bool = False
    queued_due: datetime | None = None  # when the queued wake fell due (its tick, or the run-now)
    running: datetime | None = None  # when the running wake started
    said_paused: bool = False  # "paused" is said once, not per tick


@dataclass
class _Finished:
    dir: Path
    line: str


WakeFn = Callable[..., Receipt]  # loop.wake(agent, *, stop=...)


@dataclass
class Scheduler:
    root: Path
    max_concurrent: int = MAX_CONCURRENT
    wake_fn: WakeFn | None = None  # default: loop.wake, imported late
    out: Callable[[str], None] = field(default=lambda line: print(line, flush=True))
    rescan_s: float = RESCAN_S
    grace_s: float = SHUTDOWN_GRACE_S
    why: str = ""  # how max_concurrent was chosen (capacity.py), said at start

    def __post_init__(self):
        self.root = Path(self.root).resolve()
        self.stop = threading.Event()  # set on SIGTERM: every running wake sees it
        self._wakeup = threading.Event()  # a wake finished, or stop: look again now
        self._entries: dict[Path, _Entry] = {}
        self._queue: deque[Path] = deque()
        self._threads: dict[Path, threading.Thread] = {}
        self._finished: deque[_Finished] = deque()
        self._print_lock = threading.Lock()
        self.completed = 0
        self.lags: deque[float] = deque(maxlen=LAG_SAMPLES)  # seconds from due to started
        self._backlog = 0  # the longest the queue got since it was last empty
        self.halted: stopswitch.Stop | None = None  # the fleet's switch, as last looked at

    # -- public --------------------------------------------------------------

    def poke(self) -> None:
        """Look at the agents now (the console queued a run-now): no waiting for the next tick."""
        self._wakeup.set()

    def request_stop(self, *_args) -> None:
        """No new wakes; running ones end at their next step boundary."""
        self.stop.set()
        self._wakeup.set()

    def run(self) -> int:
        self._scan(startup=True)
        broker = broker_socket()
        self.say(
            f"wakeloop serve: {len(self._entries)} agent(s) under {self.root}, "
            f"{self.why or f'at most {self.max_concurrent} wake(s) at once'}, sandboxes via "
            f"{'the broker at ' + broker if broker else 'the local Docker engine'}; "
            + (
                "; ".join(self._plan(e) for e in self._entries.values())
                or f"add one with `wakeloop init {self.root}/NAME`"
            )
        )
        next_scan = time.monotonic() + self.rescan_s
        SenderThread(self._queues, self.say, self.stop).start()  # notifications: off the wakes' path
        next_beat = 0.0
        while not self.stop.is_set():
            if time.monotonic() >= next_beat:  # `status` tells a running serve from a dead one by this
                control.beat(self.root, extra=self.load())
                next_beat = time.monotonic() + control.HEARTBEAT_S
            self._reap()
            self._watch_switch()
            if time.monotonic() >= next_scan:
                self._scan()
                next_scan = time.monotonic() + self.rescan_s
            self._tick(utcnow())
            self._dispatch()
            self._wakeup.wait(self._sleep_s(next_scan))
            self._wakeup.clear()
        return self._shutdown()

    def say(self, line: str) -> None:
        with self._print_lock:
            self.out(f"{stamp(utcnow())} {line}")

    # -- agents under ROOT ---------------------------------------------------

    def _scan(self, startup: bool = False) -> None:
        seen = set()
        for path in agent_dirs(self.root):
            seen.add(path)
            try:
                st = (path / "agent.yaml").stat()
            except OSError:
                continue
            key = (st.st_mtime_ns, st.st_size)
            entry = self._entries.get(path)
            if entry is not None and entry.key == key:
                continue
            fresh = _Entry(path, key) if entry is None else entry
            fresh.key = key
            self._load(fresh)
            self._entries[path] = fresh
            if not startup:
                self.say(f"{'added' if entry is None else 'changed'} {self._plan(fresh)}")
        for path in set(self._entries) - seen:
            entry = self._entries.pop(path)
            if path in self._queue:
                self._queue.remove(path)
            self.say(
                f"removed {entry.name or path.name}: no agent.yaml any more"
                + ("; its running wake finishes" if entry.running else "")
            )

    def _load(self, entry: _Entry) -> None:
        try:
            agent = load_agent(entry.dir)
            _check_prices(agent)
            entry.name, entry.schedule = agent.name, parse_schedule(agent.schedule, agent.timezone)
        except (AgentError, PolicyError, ScheduleError, ValueError) as exc:
            entry.name, entry.schedule, entry.due = entry.name or entry.dir.name, None, None
            self.say(f"{entry.dir.name}: not scheduled: {exc}")
            self._not_started(entry.dir, entry.name, f"not scheduled: {exc}")
            return
        now, last = utcnow(), last_tick(entry.dir / "state")
        entry.due = first_due(entry.schedule, last, now)
        missed = entry.schedule.next_after(last) if last else None
        if missed and misfired(entry.schedule, missed, now):  # said, and in its events: not silent
            why = (
                f"tick {stamp(missed)} missed by {_ago(now - missed)}, more than its interval: skipped, "
                f"not run late; next {stamp(entry.due)}"
            )
            self.say(f"{entry.name}: {why}")
            EventLog(entry.dir / "state" / EVENTS_FILE, "schedule").write(
                ev.TickSkipped(tick=missed.isoformat(), reason=why)
            )

    def _plan(self, e: _Entry) -> str:
        if e.schedule is None or e.due is None:
            return f"{e.name} (not scheduled)"
        return f"{e.name}: {e.schedule.describe()}, next {stamp(e.due)}"

    # -- ticks, the queue, the threads ----------------------------------------

    def _watch_switch(self) -> None:
        """ROOT/STOP appeared (drop the queue, say it) or went (say it); else nothing."""
        halted = stopswitch.read(self.root)
        if (halted is None) == (self.halted is None):
            self.halted = halted
            return
        self.halted = halted
        if halted is None:
            self.say("started: the fleet's switch is off; the next ticks run")
            return
        dropped = len(self._queue)
        for path in self._queue:
            if path in self._entries:
                self._entries[path].queued = False
        self._queue.clear()
        running = sum(1 for e in self._entries.values() if e.running)
        self.say(
            f"STOPPED: {halted.describe()}. No wake starts"
            + (f", {dropped} queued dropped" if dropped else "")
            + (f"; {running} running end at their next step, their calls killed" if running else "")
        )

    def _tick(self, now: datetime) -> None:
        due: list[tuple[datetime, str, _Entry]] = []
        for entry in self._entries.values():
            # `wakeloop run-now`: a person asked; while the fleet is stopped, the request waits
            if self.halted is None and control.take_run_request(entry.dir / "state"):
                self.say(
                    f"{entry.name}: run-now requested"
                    + (": already running or queued" if entry.running or entry.queued else "")
                )
                if not (entry.running or entry.queued):
                    due.append((now, entry.name, entry))
            tick = self._due_tick(entry, now)
            if tick is not None:
                due.append((tick, entry.name, entry))
        for tick, _name, entry in sorted(due, key=lambda d: (d[0], d[1])):
            if not entry.queued:  # a run-now and a tick at once: one wake
                entry.queued, entry.queued_due = True, tick
                self._queue.append(entry.dir)
        self._backlog = max(self._backlog, len(self._queue))

    def _due_tick(self, entry: _Entry, now: datetime) -> datetime | None:
        """The tick of `entry` that falls due now and should queue a wake, or None."""
        if entry.due is None or entry.schedule is None or entry.due > now:
            return None
        tick = entry.due
        entry.due = entry.schedule.next_after(tick)
        if entry.due <= now:  # behind (a slow queue, a suspended host): coalesce
            entry.due = entry.schedule.next_after(now)
        save_tick(entry.dir / "state", tick)
        if self._held(entry, tick):
            return None
        if entry.running or entry.queued:
            why = (
                f"its wake started {stamp(entry.running)} is still running"
                if entry.running
                else "its previous tick is still queued"
            )
            self.say(f"{entry.name}: tick {stamp(tick)} skipped: {why}")
            return None
        return tick

    def _held(self, entry: _Entry, tick: datetime) -> bool:
        """A paused agent's ticks, and those inside its failure backoff, are skipped aloud (records/health.py)."""
        if self.halted is not None:  # said once when the switch went on
            return True
        h = health.load(entry.dir / "state")
        if h.paused:
            if not entry.said_paused:
                self.say(f"{entry.name}: paused ({h.paused_reason}); `wakeloop resume {entry.dir}` lets it wake")
            entry.said_paused = True
            return True
        entry.said_paused = False
        until = h.backoff_until()
        if until > time.time():
            self.say(
                f"{entry.name}: tick {stamp(tick)} skipped: backing off after {h.failures} failed wake(s), "
                f"until {stamp(datetime.fromtimestamp(until, UTC))}"
            )
            return True
        return False

    def _queues(self) -> list:
        """(state_dir, channels) of every agent with notifications waiting, for the sender thread.
        An agent whose agent.yaml does not load now keeps its queue until it does."""
        found = []
        for path in agent_dirs(self.root):
            if any((path / "state/notify/queue").glob("*.json")):
                try:
                    found.append((path / "state", load_agent(path).notify))
                except (WakeloopError, ValueError):
                    continue
        return found

    def _not_started(self, agent_dir: Path, name: str, reason: str) -> None:
        """A wake that could not start is that agent's failure too: events, health, notifications."""
        try:
            agent = load_agent(agent_dir)
            channels, pause_after = agent.notify, agent.pause_after_failures
        except (WakeloopError, ValueError):
            try:
                channels = root_channels(self.root)
            except (WakeloopError, ValueError):  # notify.yaml's own error, or the ceiling's
                channels = ()
            pause_after = PAUSE_AFTER_FAILURES
        try:
            outcomes.not_started(agent_dir, name, channels, pause_after, reason)
        except OSError as exc:
            self.say(f"{name}: could not record the failure in its state/: {exc}")

    def _dispatch(self) -> None:
        while (
            self._queue and len(self._threads) < self.max_concurrent and not self.stop.is_set() and self.halted is None
        ):
            path = self._queue.popleft()
            entry = self._entries.get(path)
            if entry is None:
                continue
            entry.queued, entry.running = False, utcnow()
            if entry.queued_due is not None:
                lag = max(0.0, (entry.running - entry.queued_due).total_seconds())
                self.lags.append(lag)
                metrics.scheduler_lag(lag)
            thread = threading.Thread(
                target=self._wake, args=(entry.dir, entry.name), name=f"wake-{entry.name}", daemon=True
            )
            self._threads[path] = thread
            thread.start()
        if not self._queue and self._backlog >= BACKLOG_SAID:
            self.say(
                f"queue drained: the longest it got was {self._backlog} wake(s), "
                f"{self.max_concurrent} at once; {self.lag_line()}"
            )
            self._backlog = 0

    def load(self) -> dict:
        """Running, queued, K and the lag percentiles, for serve.json and the bench."""
        p50, p99 = self.lag_percentiles()
        return {
            "running": len(self._threads),
            "queued": len(self._queue),
            "stopped": self.halted is not None,
            "max_concurrent": self.max_concurrent,
            "lag_p50_s": p50,
            "lag_p99_s": p99,
            "started": len(self.lags),
        }

    def lag_percentiles(self) -> tuple[float | None, float | None]:
        lags = sorted(self.lags)
        if not lags:
            return None, None
        at = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))]
        return at(0.50), at(0.99)

    def lag_line(self) -> str:
        p50, p99 = self.lag_percentiles()
        if p50 is None:
            return "no wake started yet"
        return f"lag from due to started over the last {len(self.lags)} wake(s): p50 {p50:.1f} s, p99 {p99:.1f} s"

    def _wake(self, agent_dir: Path, name: str) -> None:
        started = time.monotonic()
        try:
            agent = load_agent(agent_dir)  # fresh: policy edits apply from the next wake
            wake = self.wake_fn or _loop_wake()
            receipt = wake(agent, stop=self.stop)
            line = describe_receipt(agent.name, receipt)
        except (WakeloopError, ValueError) as exc:
            line = f"{name}: wake not started: {exc}"
            self._not_started(agent_dir, name, str(exc))
        except Exception as exc:  # a bug in one wake must not stop the others
            line = f"{name}: wake crashed after {time.monotonic() - started:.1f}s: {type(exc).__name__}: {exc}"
            self._not_started(agent_dir, name, f"the wake crashed: {type(exc).__name__}: {exc}")
        self._finished.append(_Finished(agent_dir, line))
        self._wakeup.set()

    def _reap(self) -> None:
        while self._finished:
            done = self._finished.popleft()
            thread = self._threads.pop(done.dir, None)
            if thread is not None:
                thread.join(timeout=1)
            entry = self._entries.get(done.dir)
            if entry is not None:
                entry.running = None
            self.completed += 1
            self.say(done.line)

    def _sleep_s(self, next_scan: float) -> float:
        now = utcnow()
        dues = [(e.due - now).total_seconds() for e in self._entries.values() if e.due]
        return max(0.05, min([next_scan - time.monotonic(), *dues]))

    def _shutdown(self) -> int:
        dropped = len(self._queue)
        self._queue.clear()
        running = [e.name for e in self._entries.values() if e.running]
        self.say(
            f"stopping: no new wakes{f', {dropped} queued dropped' if dropped else ''}; "
            + (
                f"waiting up to {self.grace_s:g}s for {', '.join(running)} to reach a step boundary"
                if running
                else "nothing running"
            )
        )
        deadline = time.monotonic() + self.grace_s
        for thread in list(self._threads.values()):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._reap()
        left = [t.name for t in self._threads.values() if t.is_alive()]
        if left:
            self.say(f"stopped with {len(left)} wake(s) still running after {self.grace_s:g}s: {', '.join(left)}")
        else:
            self.say("stopped: every wake ended cleanly")
        return 0


def fitted(root: Path) -> capacity.Choice:
    """K for this host and the agents under ROOT, with the line that says why."""
    host, box_memory = capacity.measure_host(root, broker_socket())
    return capacity.choose(host, box_memory)


def _ago(delta) -> str:
    s = int(delta.total_seconds())
    return f"{s // 3600}h {s % 3600 // 60}m" if s >= 3600 else f"{s // 60}m {s % 60}s"


def _loop_wake() -> WakeFn:
    from orchestrator.wake.loop import wake

    return wake


def _check_prices(agent: Agent) -> None:
    """A USD cap on a model without a price refuses to schedule, with one line."""
    if agent.dry_run:
        return
    from orchestrator.records.ledger import check_caps, load_prices

    check_caps(agent.model, agent.policy.budget, load_prices(), agent.policy.source)


def serve(
    root: Path, max_concurrent: int | None = None, beside: Callable[[Scheduler], Callable[[], object]] | None = None
) -> int:
    """The CLI's entry: install signal handlers and run until SIGTERM/SIGINT.
    Without `max_concurrent`, it is fitted to the host (capacity.py).
    `beside(scheduler)` starts what runs next to it (the console, metrics) and
    returns how to stop that."""
    import signal

    if not Path(root).is_dir():
        raise AgentError(
            f"{root} is not a folder; give the folder that holds your agents (each a folder with agent.yaml)"
        )
    if max_concurrent is not None and max_concurrent < 1:
        raise AgentError(f"--max-concurrent must be at least 1, not {max_concurrent}")
    if max_concurrent is None:
        choice = fitted(Path(root))
    else:
        choice = capacity.Choice(max_concurrent, f"at most {max_concurrent} wake(s) at once (--max-concurrent)")
    # The wake loop (and the SDK under it: seconds of imports on a loaded host) is imported
    # now, not by the first due wakes, which would each wait for it on the import lock.
    try:
        wake_fn = _loop_wake()
    except ImportError as exc:  # a broken install: one line now, not a crash in every wake
        raise AgentError(f"cannot load the wake loop ({exc}); reinstall wakeloop") from None
    scheduler = Scheduler(Path(root), choice.wakes, why=choice.why, wake_fn=wake_fn)
    # What is loaded by now (the modules, the SDK) lives as long as serve: frozen, the collector
    # stops counting it, so a full collection comes once the wakes' own cyclic garbage asks for
    # one, not once it has grown to a quarter of all of that (+10-15 % of RSS: bench/soak.py).
    gc.collect()
    gc.freeze()
    # And once more, over what is left (nothing): the collector sets the oldest generation's size at
    # its last full collection, and the one above counted all that was just frozen. Left so, the next
    # full collection waits for a quarter of it (40,000+ objects, thousands of wakes' garbage).
    gc.collect()
    # From a thread: a handler that took an Event's lock itself could interrupt
    # the main thread inside that same lock and deadlock.
    stop_soon = lambda *_: threading.Thread(target=scheduler.request_stop, daemon=True).start()
    signal.signal(signal.SIGTERM, stop_soon)
    signal.signal(signal.SIGINT, stop_soon)
    stop_beside = beside(scheduler) if beside else None
    try:
        return scheduler.run()
    finally:
        gc.unfreeze()  # serve may be called in a process that goes on (tests, the soak)
        if stop_beside:
            stop_beside()
        sys.stdout.flush()


def describe_receipt(name: str, receipt: Receipt) -> str:
    """serve's line for a finished wake: one line a person can follow, then the receipt itself as
    compact JSON. Here, not in views/: views/ sits above fleet/ and reads it."""
    line = (
        f"{name}: wake {receipt.wake} {receipt.status}{'' if receipt.live else ' (dry run)'} "
        f"in {receipt.duration_ms / 1000:.1f}s: {receipt.steps} steps, {receipt.tool_calls} tool calls, "
        f"{receipt.tokens:,} tokens"
    )
    if receipt.usd is not None:
        line += f", ${receipt.usd:.4f}"
    if receipt.task:
        line += f", task {receipt.task}"
    if receipt.reason:
        line += f"; {receipt.reason}"
    return f"{line} | receipt {json.dumps(receipt.to_dict(), separators=(',', ':'), default=str)}"
