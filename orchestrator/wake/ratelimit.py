"""The API's rate limits, shared by every wake of a process that uses the same key.

The limits are the account's, not an agent's: under `serve` a hundred wakes run as threads of one
process, and one 429 (or a response saying a bucket is empty) means every other request with that
key would meet the same wall. So each key has one Gate, and every request of every wake with that
key passes it before it is sent (LiveModel's middleware runs once per HTTP attempt, the SDK's own
retries included):

- a 429's `retry-after`, or an `anthropic-ratelimit-*-remaining: 0` with its `-reset` time, closes
  the gate until then;
- the requests bucket is mirrored: once a response has said `anthropic-ratelimit-requests-limit`
  (a minute's worth, refilled continuously) and `-remaining`, each request takes one slot of the
  mirror, and one that finds none waits its turn at the refill rate. So a fleet released at once
  goes out at the pace the API allows instead of as a burst of 429s, each of which would spend one
  of the SDK's four retries. The mirror never believes more than the last response said remained.

Not here: the retries (the SDK's, and wake/model.py's for a mid-stream error).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime

MAX_HOLD_S = 60.0  # a reset or retry-after further off than this is not trusted whole
KINDS = ("requests", "tokens", "input-tokens", "output-tokens")


class Gate:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._lock = threading.Lock()
        self._until = 0.0  # monotonic time before which no request is sent
        self._clock, self._sleep = clock, sleep
        self._rate = 0.0  # requests a second the bucket refills at (0: not known yet)
        self._capacity = 0.0
        self._slots = 0.0  # the mirror: requests that may go now (negative: reserved ahead)
        self._seen = 0.0  # when _slots was last refilled
        self.waited_s = 0.0  # summed over every request that waited (for benches and tests)

    def wait(self) -> float:
        """Block until this request may go: the gate open, and a slot of the mirrored bucket taken
        (reserved in turn, so waiters leave one by one at the refill rate); the seconds waited."""
        waited = 0.0
        while True:
            with self._lock:
                now = self._clock()
                left = self._until - now
                if left <= 0:
                    turn = self._take(now)
                    break
            self._sleep(left)
            waited += left
        if turn > 0:
            self._sleep(turn)
            waited += turn
        if waited:
            with self._lock:
                self.waited_s += waited
        return waited

    def _take(self, now: float) -> float:
        """One slot of the mirror (under the lock): how long until it is there (0: now)."""
        if not self._rate:
            return 0.0
        self._slots = min(self._capacity, self._slots + (now - self._seen) * self._rate)
        self._seen = now
        self._slots -= 1
        return -self._slots / self._rate if self._slots < 0 else 0.0

    def hold(self, seconds: float) -> None:
        """Close the gate for `seconds` from now (never shortening a longer hold)."""
        seconds = min(max(seconds, 0.0), MAX_HOLD_S)
        with self._lock:
            self._until = max(self._until, self._clock() + seconds)

    def observe(self, status: int, headers: Mapping[str, str]) -> None:
        """A response's word on the limits: a 429's retry-after, or an empty bucket's reset."""
        if status == 429:
            self.hold(retry_after_s(headers) or 1.0)
            return
        self._mirror(headers)
        for kind in KINDS:
            if headers.get(f"anthropic-ratelimit-{kind}-remaining") == "0":
                reset = _seconds_until(headers.get(f"anthropic-ratelimit-{kind}-reset"))
                if reset:
                    self.hold(reset)

    def _mirror(self, headers: Mapping[str, str]) -> None:
        """Learn the requests bucket's refill rate, and never believe more slots than it has left."""
        limit = _number(headers.get("anthropic-ratelimit-requests-limit"))
        remaining = _number(headers.get("anthropic-ratelimit-requests-remaining"))
        if limit is None or remaining is None or limit <= 0:
            return
        with self._lock:
            now = self._clock()
            if not self._rate:
                self._slots, self._seen = remaining, now
            self._rate, self._capacity = limit / 60.0, limit
            self._slots = min(self._slots + (now - self._seen) * self._rate, remaining)
            self._seen = now


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        seconds = _number(headers.get(name))
        if seconds is not None:
            return seconds / scale
    return None


def _number(text: str | None) -> float | None:
    """A header's number, or None when it is absent or not one."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _seconds_until(stamp: str | None) -> float | None:
    """An RFC 3339 reset time as seconds from now (None when absent or unreadable)."""
    if not stamp:
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, when.timestamp() - time.time())


_gates: dict[str, Gate] = {}
_gates_lock = threading.Lock()


def gate_for(api_key: str) -> Gate:
    """The process's one gate for this key (found by the key's hash: the key itself is kept nowhere)."""
    name = hashlib.sha256(api_key.encode()).hexdigest()[:16]
    with _gates_lock:
        return _gates.setdefault(name, Gate())
