"""Where a wake's transaction lives on an agent's disk: one layout, named once.

The disk's root (its view, which only this process and root see) holds:

    files/                      the agent's files: the overlay's lower layer; a box's /workspace
                                shows it merged with the running wake's upper layer
    lost+found/                 mkfs's own, beside files/: no box and no reader ever sees it
    .wakeloop/wakes/RUN/upper   what wake RUN changed so far (overlayfs upper layer)
    .wakeloop/wakes/RUN/work    overlayfs's work folder for it
    .wakeloop/undo/RUN/         what RUN's commit replaced (transaction.py's undo folder:
                                manifest.json, old/, new/), kept `workspace.keep_undo_days`

Every layer is on the same filesystem as files/, so a commit is renames
(transaction.py). A run id is what the harness makes (12 hex digits); any
other name is refused here, so no id read from a file or the wire can walk
out of .wakeloop/.

Not here: mounting (disk.py, engine.py), reading and committing a layer
(transaction.py), the policy's `workspace:` section (policy/schema.py).
"""

from __future__ import annotations

import re
from pathlib import Path

FILES = "files"
META = ".wakeloop"
RUN_ID = re.compile(r"[0-9a-f]{12}")


class BadRunId(ValueError):
    """A run id that is not one the harness makes."""


def run_id_ok(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):
        raise BadRunId(f"not a run id: {run_id[:40]!r} (12 hex digits)")
    return run_id


def files(root: Path) -> Path:
    return root / FILES


def wakes(root: Path) -> Path:
    return root / META / "wakes"


def upper(root: Path, run_id: str) -> Path:
    return wakes(root) / run_id_ok(run_id) / "upper"


def work(root: Path, run_id: str) -> Path:
    return wakes(root) / run_id_ok(run_id) / "work"


def undos(root: Path) -> Path:
    return root / META / "undo"


def undo(root: Path, run_id: str) -> Path:
    return undos(root) / run_id_ok(run_id)
