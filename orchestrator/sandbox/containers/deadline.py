"""A sandbox call's deadline: its container killed at the call's timeout, or within
POLL_S of the fleet being stopped (ROOT/STOP), and its reader unblocked if the
engine lags.

The host keeps the deadline, never the box: a command that ptrace-stops its init,
or ignores every signal, never exits on its own. One thread per process watches
every deadline of its calls (the watchdog). It wakes at the nearest deadline (a new
one that comes sooner wakes it early) and every POLL_S for one lstat per call in
flight. A thread per call,
as before, made every call wait for that thread to start (Thread.start waits until
it runs: in a paced runsc wake a median of 0.6 ms and a p90 of 4-6 ms, since the
engine's make of the next box holds the cores).

A kill runs on a thread of its own: it waits up to KILL_GRACE_S for the engine to
close the stream, and the watchdog must not wait with it.

Not here: the call itself (engine.py), the switch (records/stopswitch.py).
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable

import docker
import docker.errors

from orchestrator.records import stopswitch

KILL_GRACE_S = 5  # after a kill, how long the engine gets to close the stream


class Deadline:
    """One call's: start() when its container starts, cancel() when its output has ended.
    `fired`: killed at the deadline; `stopped`: killed because the fleet was stopped."""

    def __init__(
        self,
        api: docker.APIClient,
        cid: str,
        raw_socket: socket.socket,
        timeout_s: float,
        halted: Callable[[], bool] = lambda: False,
    ) -> None:
        self.api, self.cid, self.raw = api, cid, raw_socket
        self.fired = False
        self.stopped = False
        self._halted = halted
        self._halt = False  # why expire runs: the switch (True) or the deadline
        self._timeout_s = timeout_s
        self.end = 0.0
        self._done = threading.Event()

    def start(self) -> None:
        self.end = time.monotonic() + self._timeout_s  # counted from the container's start
        _WATCHDOG.watch(self)

    def cancel(self) -> None:
        self._done.set()
        _WATCHDOG.forget(self)

    def due(self, now: float) -> bool:
        """The watchdog's question, outside its lock (an lstat): kill it now?"""
        if self._done.is_set():
            return False
        try:
            self._halt = self._halted()
        except Exception:  # the switch unreadable for once: the deadline still holds, and the watchdog lives
            self._halt = False
        return self._halt or now >= self.end

    def expire(self) -> None:
        if self._done.is_set():
            return
        if self._halt:
            self.stopped = True
        else:
            self.fired = True
        try:
            self.api.kill(self.cid)
        except docker.errors.APIError:
            pass  # it exited on its own in the meantime
        if not self._done.wait(KILL_GRACE_S):
            try:
                self.raw.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Watchdog:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._watched: set[Deadline] = set()
        self._thread: threading.Thread | None = None
        self._wakes_at = math.inf  # when the watchdog looks next (inf: it is not waiting for a time)

    def watch(self, deadline: Deadline) -> None:
        with self._changed:
            self._watched.add(deadline)
            if deadline.end < self._wakes_at:  # sooner than it looks next; else no wake-up on the call's path
                self._changed.notify()
            if self._thread is None or not self._thread.is_alive():  # the first, or a forked child
                self._thread = threading.Thread(target=self._run, name="wakeloop-deadlines", daemon=True)
                self._thread.start()

    def forget(self, deadline: Deadline) -> None:
        with self._changed:
            self._watched.discard(deadline)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._watched)
                self._wakes_at = min(time.monotonic() + stopswitch.POLL_S, *(d.end for d in self._watched))
                self._changed.wait(max(0.0, self._wakes_at - time.monotonic()))
                self._wakes_at = math.inf
                watched = list(self._watched)
            now = time.monotonic()
            for deadline in watched:
                if deadline.due(now):
                    self.forget(deadline)
                    threading.Thread(target=deadline.expire, name="wakeloop-deadline", daemon=True).start()


_WATCHDOG = _Watchdog()
