"""One agent's wake lock held by a command that must not run beside one of its wakes
(`disk rm`, `undo`, `move`).

Not here: the lock itself (records/state.py), the commands (disk_commands.py, record_commands.py, swarm_commands.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def no_wake(shown: str, state_dir: Path, error: type[Exception], then: str) -> Iterator[None]:
    """Hold the agent's wake lock for a command that must not run beside one of its wakes
    (`disk rm`, `undo`, `move`): `error`, in one line, if a wake runs or the lock cannot be taken."""
    from orchestrator.records.state import WakeLock

    lock = WakeLock(state_dir)
    try:
        holder = lock.acquire()
    except OSError as exc:  # state/ missing, or its wake.lock a link: not a wake we can rule out
        raise error(f"cannot take the wake lock of {shown} ({exc.strerror}); `wakeloop status` says why") from None
    if holder is not None:
        raise error(f"{shown} is waking ({holder.describe()}); {then}")
    try:
        yield
    finally:
        lock.release()
