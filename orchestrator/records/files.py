"""The two file primitives every record in state/ is built on.

atomic_write: a whole file replaced or not at all, even across a crash or a
power cut (temp file, fsync, rename, fsync of the folder). locked: an
exclusive flock that serialises one file's read-modify-write between
processes (inbox, tasks, ledger).

Not here: what any file holds (state.py, ledger.py, tasks.py, events.py).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


def atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextmanager
def locked(state_dir: Path, name: str):
    """An exclusive flock on state/NAME for the block: serialises the host's
    read-modify-write of one state file between processes (inbox, tasks, ledger)."""
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(state_dir) / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
