"""A few fresh containers, created and started ahead of the call that uses them.

Creating and starting a container is most of a sandbox call's cost; handing
a command to one that is already running costs about as much as an exec. So
each DockerSandbox keeps `pool` containers made from exactly the settings a
cold call would get, each idling in a tiny launcher that waits on stdin for
its one command, runs it as its child, reports its status in-band, and is
then removed. Single use: no container ever sees a second call, so nothing
in /tmp, no process and no state carries over.

No container made in vain: a warm container nobody takes is removed unused,
and on a busy host that is engine time another agent's call needed. So the
pool keeps one ahead (a model turn, 0.3 s or more, usually outlasts a
refill), waits for a container already being made rather than starting a
second, and stops making any once the wake says no more calls are coming
(wind_down: the model's turn ended without a tool call, or the step cap); a
make queued before that and not yet begun is then dropped if the one call
still to come (the journal's stub) has a container ready or coming. A
call that found nothing ready (it waited for a refill, or went cold) grows
the pool for the rest of its wake, one more ahead up to the policy's `pool`,
so the next refill is hidden behind a model turn. The wake's first call
counts too when it came a model turn (FIRST_TURN_S at least) after its
fill began: a make slower than that turn will not refill within one either
(under runsc, growing only at the second call's wait made calls two and
three wait as well: 3 of 30 calls, the p90's share); one that came sooner
came from no model (a dry run), and says nothing of the engine. A make that
takes longer than a model turn and a call (a runsc container on a small
host: 0.5-0.9 s against 0.3 s) is hidden only by two in flight; so the pool
grows when the last make took
less than one more ahead covers at the wake's pace (takes apart); a make
slower still is the engine's load, which two at once only make slower, and
the pool stays. Nor does it grow while another wake's pool on the same
engine wants containers (a fleet: there the one more ahead would be a
container another agent's call needs, and containers per call must stay
1.00). A grown pool may end its lone wake with one more idle than the
journal's stub takes: the price of hiding refills on an engine nobody else
is waiting for.

A refill whose make took well under the model's last turn (THINK_X) begins
when its call ends, not when it starts: still hidden behind the model's
turn, and the engine's work (dockerd, runc, the box's boot) no longer
competes with the call for the host's cores. A slower one begins beside the
call, as it must to be ready in time.

The engine's work that a call's end sets off (the used container's removal,
a refill put off until then) waits QUIET_S past that end; the refill less if
the next call comes first. Right after a call the harness has work of its own
(the call's records, the next request to the model), and a make or a removal
then takes the host's cores and this interpreter's lock from it; in the
model's turn that follows, nobody is waiting. Measured with runc at a 1 s
turn, alternated with the code before: from a call's end to the harness's
next request to the model, 7-11 ms median before, 2.2-2.9 after; a whole
call (bench.per_call's gap) 32-36 ms median before, 23-24 after, and 49-63
ms p90 against 34-41. Putting off the refill alone, or the removal alone,
took about half of that (docs/benchmarks.md).

Not here: the launcher's source (programs.py) or how output is read (engine.py). The
pool only makes, hands out, and disposes of containers, and it never hands
out one made under settings other than the current ones.
"""

from __future__ import annotations

import enum
import json
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from orchestrator import metrics

MAKERS = 2  # containers made at once: a runsc create and start takes 0.5-0.9 s
AHEAD = 1  # containers kept ahead at first: one per model turn is the usual pace
THINK_X = 0.8  # a refill that took under this share of the model's last turn waits for its call's end
QUIET_S = 0.05  # and then this long, as does the used container's removal: the harness's work comes first
# No model answers sooner: a wake's first call that came sooner after its first fill began came
# from no model (a dry run, a test), and its wait says nothing of the engine's pace against a turn.
FIRST_TURN_S = 0.25
WAIT_S = 60.0  # longest a call waits for a container being made (create + start, each capped at 30 s)
IDLE_CHECK_S = 30  # a container idle longer than this is checked before use (engine restarts)


class _Stop(enum.Enum):
    STOP = "stop"  # an enum's member, not object(): a sentinel a queue's type can name


_STOP: Final = _Stop.STOP  # ends a pool thread's job queue
_Job = TypeVar("_Job")


def handoff(argv: list[str], cwd: str, stdin: bool, end: str, env: dict[str, str] | None = None) -> bytes:
    """The bytes that hand a pooled container its command; `end` is the call's nonce,
    `env` the command's whole environment (None: argv is one of ours, which keeps ours)."""
    spec = json.dumps({"argv": argv, "cwd": cwd, "stdin": stdin, "env": env, "end": end}).encode()
    return len(spec).to_bytes(8, "big") + spec


class EndLine:
    """Finds the launcher's status line in the output stream and keeps it out of the output.

    feed() returns the bytes that are surely output. It holds back a short tail,
    since the line may arrive split across reads; flush() returns that tail when
    the stream ends without the line (the launcher was killed: the engine then
    tells the status). Bytes after the line (a background process still
    printing) are dropped, as a cold call's end drops them; they are kept in
    `rest` for a reader that goes on (a cold call's guard's line, which the
    command may have printed itself: engine.py).
    """

    _TAIL = len(":000:?\n")

    def __init__(self, nonce: str):
        self.needle = b"\0wakeloop:" + nonce.encode() + b":"
        self.exit_code: int | None = None
        self.oom: str | None = None  # "1", "0", or "?" (unknown)
        self.rest = b""  # what came after the line in the same read
        self._held = b""

    @property
    def found(self) -> bool:
        return self.exit_code is not None

    def feed(self, data: bytes) -> bytes:
        buf, out, self._held = self._held + data, b"", b""
        while True:
            at = buf.find(self.needle)
            if at < 0:
                keep = min(len(buf), len(self.needle) + self._TAIL)
                self._held = buf[len(buf) - keep :]
                return out + buf[: len(buf) - keep]
            line = buf[at + len(self.needle) :]
            nl = line.find(b"\n", 0, self._TAIL)
            if nl < 0 and len(line) < self._TAIL:  # the line may yet arrive whole
                self._held = buf[at:]
                return out + buf[:at]
            fields = line[:nl].split(b":") if nl >= 0 else []
            if len(fields) == 2 and fields[0].isdigit():
                self.exit_code, self.oom = int(fields[0]), fields[1].decode("ascii", "replace")
                self.rest = line[nl + 1 :]
                return out + buf[:at]
            # Not a status line (too long, or malformed): output, and look on past it.
            # Never held back whole: a reader with no secret in its needle would
            # otherwise keep all a command prints after the needle in memory.
            out += buf[: at + len(self.needle)]
            buf = line

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held


class MakePace:
    """The pools of this process open on one engine and runtime (engine.py shares one
    per engine and runtime), so a wake can tell it is one of a fleet."""

    def __init__(self) -> None:
        self._pools: weakref.WeakSet[WarmPool] = weakref.WeakSet()  # the open pools sharing this engine
        self._lock = threading.Lock()

    def joined(self, pool: WarmPool) -> None:
        with self._lock:
            self._pools.add(pool)

    def left(self, pool: WarmPool) -> None:
        with self._lock:
            self._pools.discard(pool)

    def shared(self, pool: WarmPool) -> bool:
        """Whether another wake's pool on this engine wants containers (a fleet): one
        more ahead here would compete with their calls, and a surplus is a call of theirs."""
        with self._lock:
            others = [p for p in self._pools if p is not pool]
        return any(other.want > 0 for other in others)


@dataclass(frozen=True)
class _Warm:
    cid: str
    key: str  # the settings it was made under
    made: float  # time.monotonic() when it was started


class WarmPool:
    """Keeps up to `size` started containers for the settings named by `key()`;
    `want` of them at a time (AHEAD at first, up to `size` as calls demand).

    `make(key)` creates and starts one container and returns its id;
    `remove(cid)` removes one. They run on threads of their own (MAKERS
    makers, one remover), so a call never waits for a removal, and a burst of
    calls (several tool_use blocks in one turn) is not refilled behind its
    own removals.
    """

    def __init__(
        self,
        size: int,
        key: Callable[[], str],
        make: Callable[[], str],
        remove: Callable[[str], None],
        alive: Callable[[str], bool],
        pace: MakePace | None = None,
        ahead: int = AHEAD,
    ):
        """`ahead`: how many to make now; 0 waits for rearm (a box whose calls start with a wake)."""
        self.pace = pace or MakePace()
        self.size, self._key, self._make, self._remove, self._alive = size, key, make, remove, alive
        self.want = min(ahead, size)
        self._ready: list[_Warm] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._makes: queue.Queue[None | _Stop] = queue.Queue()
        self._trash: queue.Queue[tuple[str, float] | _Stop] = queue.Queue()  # (cid, quiet_until)
        self._closed = False
        self._making = 0  # makes queued or begun
        self._begun = 0  # of which begun (a queued one may yet be dropped)
        self._waiting = 0  # takes waiting for a make
        self.waits = 0  # takes that found nothing ready (waited, or went cold)
        self._made_s: float | None = None  # how long the latest make took
        self._think_s: float | None = None  # from the latest call's end to the next take (the model's turn)
        self._ended: float | None = None  # when the latest call ended
        self._took: float | None = None  # when the latest take came (None: the wake's first is to come)
        self._armed = time.monotonic()  # when the wake's first fill began (rearm)
        self._cycle_s: float | None = None  # from one take to the next: the wake's pace
        self._owed = False  # a refill put off until its call ends
        self._quiet_until = 0.0  # time.monotonic() before which that refill waits (QUIET_S), unless a call comes
        self.pace.joined(self)
        self._makers = [
            threading.Thread(
                target=self._serve, args=(self._makes, self._make_one), name="wakeloop-pool-make", daemon=True
            )
            for _ in range(MAKERS)
        ]
        self._threads = [
            *self._makers,
            threading.Thread(
                target=self._serve, args=(self._trash, self._dispose), name="wakeloop-pool-remove", daemon=True
            ),
        ]
        for thread in self._threads:
            thread.start()
        self._refill()

    def take(self) -> str | None:
        """A started container no call has used, made under the current settings; or
        None (the call goes cold). Waits for one already being made rather than
        have the engine make a second."""
        key = self._key()
        while True:
            warm = self._next()
            if warm is None:
                self._refill()
                metrics.pool_take(hit=False)
                return None
            if warm.key != key or (time.monotonic() - warm.made > IDLE_CHECK_S and not self._alive(warm.cid)):
                self.discard(warm.cid)
                continue
            self._refill_or_owe()
            metrics.pool_take(hit=True)
            return warm.cid

    def _next(self) -> _Warm | None:
        with self._changed:
            now = time.monotonic()
            first = self._took is None  # the wake's first call
            if self._quiet_until:  # a call comes: a refill still waiting out the quiet begins now
                self._quiet_until = 0.0
                self._changed.notify_all()
            if self._ended is not None:
                self._think_s, self._ended = now - self._ended, None
            if self._took is not None:
                self._cycle_s = now - self._took
            self._took = now
            if not self._ready and self._owed:  # a call came before the last one ended
                self._owed = False
                self._queue_missing()
            if not self._ready:
                self.waits += 1
                if not first or now - self._armed >= FIRST_TURN_S:
                    self._grow()
            self._waiting += 1
            try:
                self._changed.wait_for(lambda: self._ready or not self._making or self._closed, WAIT_S)
            finally:
                self._waiting -= 1
            return self._ready.pop(0) if self._ready else None

    def _refill_or_owe(self) -> None:
        """At a take: the refill begins now, beside the call; or, when the last make
        fitted well within the model's last turn, at the call's end (done), so that
        the engine's work does not compete with the call for the host's cores."""
        with self._lock:
            if self._made_s is not None and self._think_s is not None and self._made_s < THINK_X * self._think_s:
                self._owed = True
            else:
                self._queue_missing()

    def done(self, cid: str) -> None:
        """A call is over: its container goes, and a refill put off until now begins, each
        once the harness's own work after the call is done (QUIET_S)."""
        quiet_until = time.monotonic() + QUIET_S
        self._trash.put((cid, quiet_until))
        self.ended(quiet_until)

    def ended(self, quiet_until: float = 0.0) -> None:
        """A call is over, its container gone already (a call that raised): a refill put off
        until now begins (at `quiet_until`), or the next call would find nothing ready."""
        with self._lock:
            self._ended = time.monotonic()
            if self._owed:
                self._owed = False
                self._quiet_until = quiet_until
                self._queue_missing()

    def _grow(self) -> None:
        """Lock held, at a take that found nothing ready: this call waits for a refill
        (or goes cold), so one more ahead would have hidden it; not in a fleet, and not
        when even one more could not (the last make outlasted that many takes at this
        pace: the engine is what is slow, and two makes at once only slow each other)."""
        hides = self._made_s is None or self._cycle_s is None or self._made_s < (self.want + 1) * self._cycle_s
        if self.want and hides and not self.pace.shared(self):
            self.want = min(self.size, self.want + 1)
            self._queue_missing()  # the one more begins now, beside the one this call waits for

    def wind_down(self) -> None:
        """No more calls are expected but perhaps one (the journal's stub): make no more.
        What is idle stays for that call; close() removes the rest."""
        with self._lock:
            self.want = 0

    def rearm(self) -> None:
        """A wake starts on a pool kept from the last (the broker's): one ahead again."""
        with self._lock:
            self.want = max(self.want, min(AHEAD, self.size))
            self._ended = self._took = None  # the time since the last wake's calls is no model turn
            self._armed = time.monotonic()
        self._refill()

    def discard(self, cid: str) -> None:
        """Remove a container on the pool's remover thread (used or stale)."""
        self._trash.put((cid, 0.0))

    def drain(self) -> None:
        """Drop every idle container (the settings changed) and refill."""
        with self._lock:
            stale, self._ready = self._ready, []
        for warm in stale:
            self.discard(warm.cid)
        self._refill()

    def close(self) -> None:
        """Remove every container the pool made or was given; returns when done."""
        with self._lock:
            self._closed = True
            stale, self._ready = self._ready, []
            self._changed.notify_all()
        for warm in stale:
            self.discard(warm.cid)
        for _ in self._makers:
            self._makes.put(_STOP)
        self._trash.put(_STOP)  # after the removals queued above: they run first
        for thread in self._threads:
            thread.join()
        self.pace.left(self)

    def idle(self) -> list[str]:
        with self._lock:
            return [w.cid for w in self._ready]

    def wait_ready(self, count: int, timeout_s: float) -> bool:
        """Block until `count` containers are idle (benchmarks and tests), or the timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._ready) >= count, timeout_s)

    def _refill(self) -> None:
        with self._lock:
            self._queue_missing()

    def _queue_missing(self) -> None:
        """Lock held: queue the makes that bring what is ready or coming up to `want`."""
        missing = 0 if self._closed else self.want - len(self._ready) - self._making
        for _ in range(missing):
            self._making += 1
            self._makes.put(None)

    @staticmethod
    def _serve(jobs: queue.Queue[_Job | _Stop], handle: Callable[[_Job], None]) -> None:
        while (job := jobs.get()) is not _STOP:
            handle(job)

    def _wait_until(self, until: Callable[[], float]) -> None:
        """Until time.monotonic() reaches until() (a call may move it) or the pool closes."""
        with self._changed:
            while not self._closed and (left := until() - time.monotonic()) > 0:
                self._changed.wait(left)

    def _dispose(self, job: tuple[str, float]) -> None:
        cid, quiet_until = job
        self._wait_until(lambda: quiet_until)
        self._remove_quietly(cid)

    def _remove_quietly(self, cid: str) -> None:
        # The remover must outlive any one failure, or every later removal is lost.
        try:
            self._remove(cid)
        except Exception:
            pass  # the container is labelled: the next wake's cleanup_leftovers finds it

    def _wanted(self) -> bool:
        """Lock held, as a queued make is about to begin: whether a call would take it.
        The wake may have wound down since it was queued; one call (its journal's
        stub) may still come, and takes already waiting will."""
        return not self._closed and len(self._ready) + self._begun < max(self.want, self._waiting, 1)

    def _make_one(self, _job: None = None) -> None:
        self._wait_until(lambda: self._quiet_until)
        with self._changed:
            if not self._wanted():
                self._making -= 1
                self._changed.notify_all()  # a waiting take: none coming
                return
            self._begun += 1
        key, started = self._key(), time.monotonic()
        try:
            cid = None if self._closed else self._make()
        except Exception:
            cid = None  # the next call goes cold and says why if the engine is really gone
            metrics.pool_make_failed()  # counted: a pool that keeps failing is seen, not only slow
        with self._lock:
            self._making -= 1
            self._begun -= 1
            if cid is not None:
                self._made_s = time.monotonic() - started
            keep = cid is not None and not self._closed and key == self._key()
            if keep and cid is not None:  # (keep says cid is not None; mypy cannot see it)
                self._ready.append(_Warm(cid, key, time.monotonic()))
            elif cid is not None:
                # Made under settings that changed meanwhile (a wake's begin or finish): the
                # drain then counted it as coming, so it is replaced here, or nothing would be.
                self._queue_missing()
            self._changed.notify_all()  # a waiting take: a container, or none coming
        if cid is not None and not keep:
            self._remove_quietly(cid)
