"""The one switch: ROOT/STOP present means nothing under ROOT starts.

`wakeloop stop ROOT` (or the console's button) writes ROOT/STOP atomically,
with who, when and why; `wakeloop start ROOT` removes it. While it exists:

- serve dispatches no wake and drops what was queued (fleet/scheduler.py);
- a wake that starts anyway (`wakeloop wake`, a race) ends at once, and a
  running one ends at its next step boundary, with a `stopped` receipt
  (wake/loop.py);
- no sandbox call starts, and a call in flight is killed within POLL_S of
  the file appearing (sandbox/engine.py watches it beside each call's
  deadline), in serve's process and in the broker's alike;
- the broker refuses every call (broker/server.py), reading ROOT itself.

A file, not a signal: it survives restarts of serve and of the broker, and
every process that can start anything reads the same one. Its presence is
what counts: a STOP that cannot be read (a link, garbage, a directory)
still stops everything, so a bad write fails closed.

Not here: who may write it (the CLI, the console's signed-in POST), what a
stopped wake writes (loop.py).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.safeio.folder import Folder

STOP_FILE = "STOP"  # in ROOT (docs/architecture.md §4)
POLL_S = 0.5  # how often a call in flight looks at the switch: the kill's worst lag
READ_CAP = 4096  # bytes of STOP read: who, when, why


class StopSwitchError(ConfigError):
    """ROOT/STOP cannot be written or removed: one line for the human."""


@dataclass(frozen=True)
class Stop:
    """Who stopped the fleet under `root`, when and why (as the file says)."""

    root: Path
    who: str
    at: str  # ISO 8601, UTC
    why: str

    def describe(self) -> str:
        why = f": {self.why}" if self.why else ""
        return (
            f"the fleet under {self.root} is stopped (since {self.at}, by {self.who}{why}); "
            f"`wakeloop start {self.root}` lets it run again"
        )


def stop(root: Path, why: str = "", who: str | None = None) -> Stop:
    """Write ROOT/STOP (replacing one already there): from now on nothing starts."""
    root = Path(root)
    record = Stop(root, who or _who(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), why.strip())
    Folder(root).write_atomic(STOP_FILE, json.dumps({"who": record.who, "at": record.at, "why": record.why}) + "\n")
    return record


def start(root: Path) -> Stop | None:
    """Remove ROOT/STOP; what it said, or None if the fleet was not stopped."""
    was = read(root)
    if was is not None and not Folder(Path(root)).unlink(STOP_FILE) and is_stopped(root):
        raise StopSwitchError(
            f"{Path(root) / STOP_FILE} is not a regular file (a link or a folder), so "
            "`start` leaves it alone and the fleet stays stopped: look at it, then remove it"
        )
    return was


def is_stopped(root: Path) -> bool:
    """One lstat: cheap enough for every step boundary and every POLL_S of a call."""
    return os.path.lexists(Path(root) / STOP_FILE)


def read(root: Path) -> Stop | None:
    """The switch's record, or None when the fleet runs. Present but unreadable is still a stop."""
    root = Path(root)
    if not is_stopped(root):
        return None
    try:
        raw = json.loads(Folder(root).read_text(STOP_FILE, READ_CAP))
        fields = [str(raw.get(k, "?"))[:200] if isinstance(raw, dict) else "?" for k in ("who", "at", "why")]
    except (OSError, ValueError):
        fields = ["?", "?", f"{root / STOP_FILE} is there but unreadable"]
    return Stop(root, *fields)


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"
