"""How a person reaches a running `serve` without restarting it, and how `status` knows it runs.

- The heartbeat: serve rewrites `ROOT/serve.json` ({"pid", "at"}) every
  HEARTBEAT_S; `status ROOT` says "scheduler not running" when it is older
  than STALE_S or its pid is gone, instead of next-wake times that will
  never come.
- run-now: `wakeloop run-now AGENT` leaves `state/run-now`; serve, running
  or next started, takes it (removes it) and queues one wake of that agent
  at once, paused or not: a person asked. pause and resume are the agent's
  health (records/health.py), which serve reads at every tick.

Files, not a socket: serve may be down, and the request must wait for it.

Not here: the ticks (scheduler.py), the pause flag (records/health.py).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.records.state import LockHolder
from orchestrator.safeio.atomic import atomic_write
from orchestrator.safeio.folder import state_folder

HEARTBEAT_FILE = "serve.json"  # in ROOT
HEARTBEAT_S = 10.0  # how often serve rewrites it
STALE_S = 3 * HEARTBEAT_S  # older than this: serve is not running
RUN_NOW_FILE = "run-now"  # in an agent's state/


@dataclass(frozen=True)
class Heartbeat:
    pid: int
    at: float  # epoch seconds

    def alive(self, now: float) -> bool:
        return now - self.at <= STALE_S and LockHolder(self.pid, "").alive  # state.py's liveness rule


def beat(root: Path, now: float | None = None, extra: dict | None = None) -> None:
    """`extra`: the scheduler's load (running, queued, lag percentiles), for a person or a bench."""
    atomic_write(
        Path(root) / HEARTBEAT_FILE,
        json.dumps({"pid": os.getpid(), "at": time.time() if now is None else now, **(extra or {})}),
    )


def read_heartbeat(root: Path) -> Heartbeat | None:
    try:
        raw = json.loads((Path(root) / HEARTBEAT_FILE).read_text(encoding="utf-8"))
        return Heartbeat(int(raw["pid"]), float(raw["at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def scheduler_note(root: Path, now: float | None = None) -> str | None:
    """None while serve runs under ROOT; else one line saying it does not."""
    now = time.time() if now is None else now
    hb = read_heartbeat(root)
    if hb is None:
        return f"scheduler not running: no `wakeloop serve {root}` has run here"
    if not hb.alive(now):
        last = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(hb.at))
        return f"scheduler not running: its last heartbeat was {last} (pid {hb.pid}); start `wakeloop serve {root}`"
    return None


def request_run(state_dir: Path) -> None:
    Path(state_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(Path(state_dir) / RUN_NOW_FILE, str(time.time()))


def take_run_request(state_dir: Path) -> bool:
    """True once per request: the file is removed by whoever takes it."""
    return state_folder(state_dir).unlink(RUN_NOW_FILE)  # a regular file, never through a link
