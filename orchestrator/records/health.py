"""An agent's health: consecutive failed wakes, the backoff they earn, `failing` once, pause, `recovered`.

`state/health.json`, read-modify-written under a lock (atomic.locked):

- A failed wake (a dead letter, or a wake that could not start: a bad
  agent.yaml or policy, no engine, no broker, a missing price) adds one to
  `failures`. The scheduler then waits backoff_s(failures) after the last
  failure before the next tick it runs (1 min, 2, 4, ... capped at 1 h).
- At FAILING_AFTER failures in a row, `failing` is sent, once (not per tick).
- At the agent's pause_after_failures (default 5), the agent is paused:
  serve runs no tick of it until `wakeloop resume AGENT`. A refused API key
  (HTTP 401) pauses at once: no retry can fix it.
- The next wake that does not fail resets the count; if `failing` was sent,
  `recovered` is. A pause set by hand (`wakeloop pause`) stays until resumed.
- A blocked wake (the USD budget) is neither: it waits for money, not a fix.

Not here: what is sent (outcomes.py), the ticks (fleet/scheduler.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from orchestrator.safeio.atomic import atomic_write, locked
from orchestrator.safeio.folder import state_folder
from orchestrator.safeio.jsontext import loads

HEALTH_FILE = "health.json"
HEALTH_LOCK = "health.lock"
FAILING_AFTER = 2  # failures in a row before `failing` (one dead letter says so itself)
BACKOFF_BASE_S = 60.0  # wait after the first failure before the next tick runs
BACKOFF_CAP_S = 3600.0  # longest wait between failing wakes
BY_HAND = "paused by hand"
HEALTH_CAP = 1 * 2**20  # bytes of health.json read (a reason may be long; the cap it always had)


@dataclass(frozen=True)
class Health:
    failures: int = 0  # consecutive failed wakes
    failing_since: str = ""  # ISO time of the first of them
    last_failure_at: float = 0.0  # epoch seconds
    last_reason: str = ""
    failing_sent: bool = False  # `failing` queued for this run of failures
    paused: bool = False
    paused_reason: str = ""

    def backoff_until(self) -> float:
        """Epoch seconds before which serve runs no tick of this agent (0: none)."""
        return self.last_failure_at + backoff_s(self.failures) if self.failures else 0.0


def backoff_s(failures: int) -> float:
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** max(0, failures - 1))


def load(state_dir: Path) -> Health:
    try:
        raw = loads(state_folder(state_dir).read_text(HEALTH_FILE, HEALTH_CAP))  # no link, capped
        return Health(**{k: v for k, v in raw.items() if k in Health.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return Health()  # none yet, or unreadable: a healthy agent is the safe reading


def record(
    state_dir: Path, ok: bool, reason: str, *, at: float, at_iso: str, pause_after: int, fatal: bool = False
) -> tuple[Health, list[str]]:
    """Fold one wake's outcome in; returns the new health and the transitions to notify
    (failing, paused, recovered)."""
    with locked(state_dir, HEALTH_LOCK):
        old = load(state_dir)
        new, said = _next(old, ok, reason, at, at_iso, pause_after, fatal)
        if new != old:
            atomic_write(Path(state_dir) / HEALTH_FILE, json.dumps(asdict(new)))
    return new, said


def _next(
    h: Health, ok: bool, reason: str, at: float, at_iso: str, pause_after: int, fatal: bool
) -> tuple[Health, list[str]]:
    if ok:
        said = ["recovered"] if h.failing_sent else []
        keep = h.paused and h.paused_reason == BY_HAND
        return Health(paused=keep, paused_reason=h.paused_reason if keep else ""), said
    h = replace(
        h, failures=h.failures + 1, failing_since=h.failing_since or at_iso, last_failure_at=at, last_reason=reason
    )
    said = []
    if (h.failures >= FAILING_AFTER or fatal) and not h.failing_sent:
        h, said = replace(h, failing_sent=True), said + ["failing"]
    if (h.failures >= pause_after or fatal) and not h.paused:
        why = (
            f"the API refused the key: {reason}"
            if fatal
            else f"{h.failures} failed wakes in a row since {h.failing_since}; last: {reason}"
        )
        h, said = replace(h, paused=True, paused_reason=why), said + ["paused"]
    return h, said


def set_paused(state_dir: Path, paused: bool) -> Health:
    """`wakeloop pause` / `resume`: a resume also forgets the failures (a fresh start, no
    backoff) but not that `failing` was sent, so the next good wake still says `recovered`."""
    with locked(state_dir, HEALTH_LOCK):
        h = load(state_dir)
        h = replace(h, paused=True, paused_reason=BY_HAND) if paused else Health(failing_sent=h.failing_sent)
        atomic_write(Path(state_dir) / HEALTH_FILE, json.dumps(asdict(h)))
    return h
