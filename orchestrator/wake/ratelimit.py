"""The API's rate limits, shared by every wake of a process that uses the same key.

The limits are the account's, not an agent's: under `serve` a hundred wakes run as threads of one
process, and one 429 (or a response saying a bucket is empty) means every other request with that
key would meet the same wall. So each key has one Gate: a response's `retry-after` on a 429, or an
`anthropic-ratelimit-*-remaining: 0` with its `-reset` time, closes the gate until then, and every
request of every wake with that key waits at it before it is sent (LiveModel's middleware runs once
per HTTP attempt, the SDK's own retries included). The SDK still retries the 429 itself; the gate
only keeps the others from piling on.

Not here: the retries (the SDK's, and wake/model.py's for a mid-stream error).
"""

from __future__ import annotations

import hashlib
import threading
import time
from datetime import datetime

MAX_HOLD_S = 60.0  # a reset or retry-after further off than this is not trusted whole
KINDS = ("requests", "tokens", "input-tokens", "output-tokens")


class Gate:
    def __init__(self, clock=time.monotonic, sleep=time.sleep):
        self._lock = threading.Lock()
        self._until = 0.0  # monotonic time before which no request is sent
        self._clock, self._sleep = clock, sleep
        self.waited_s = 0.0  # summed over every request that waited (for benches and tests)

    def wait(self) -> float:
        """Block until the gate is open; the seconds waited."""
        waited = 0.0
        while True:
            with self._lock:
                left = self._until - self._clock()
            if left <= 0:
                break
            self._sleep(left)
            waited += left
        if waited:
            with self._lock:
                self.waited_s += waited
        return waited

    def hold(self, seconds: float) -> None:
        """Close the gate for `seconds` from now (never shortening a longer hold)."""
        seconds = min(max(seconds, 0.0), MAX_HOLD_S)
        with self._lock:
            self._until = max(self._until, self._clock() + seconds)

    def observe(self, status: int, headers) -> None:
        """A response's word on the limits: a 429's retry-after, or an empty bucket's reset."""
        if status == 429:
            self.hold(retry_after_s(headers) or 1.0)
            return
        for kind in KINDS:
            if headers.get(f"anthropic-ratelimit-{kind}-remaining") == "0":
                reset = _seconds_until(headers.get(f"anthropic-ratelimit-{kind}-reset"))
                if reset:
                    self.hold(reset)


def retry_after_s(headers) -> float | None:
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            return float(headers.get(name)) / scale
        except (TypeError, ValueError):
            continue
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
