"""The two file primitives every record in state/ is built on.

atomic_write: a whole file replaced or not at all, even across a crash or a
power cut (temp file, fsync, rename, fsync of the folder). locked: an
exclusive flock that serialises one file's read-modify-write between
processes (inbox, tasks, ledger). Both go through folder.py: the lock file
is walked from the agent folder (no link followed, `state` included), and a
link at the written path is replaced, never followed.

Not here: what any file holds (records/state.py, records/ledger.py, records/tasks.py, records/events.py),
the walk itself (folder.py).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.safeio.folder import Folder, state_folder


def atomic_write(path: Path, text: str) -> None:
    """PATH replaced whole; its folder is the caller's (state/ is walked by state_folder)."""
    path = Path(path)
    Folder(path.parent).write_atomic(path.name, text)


@contextmanager
def locked(state_dir: Path, name: str) -> Iterator[None]:
    """An exclusive flock on state/NAME for the block: serialises the host's
    read-modify-write of one state file between processes (inbox, tasks, ledger)."""
    fd = state_folder(state_dir).open(name, os.O_RDWR | os.O_CREAT, create_dirs=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
