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

A disk made before this layout held the agent's files at its root; arrange()
moves them into files/ once, when the disk is attached, crash-safely: every
step is a rename on the disk, into a staging folder (STAGING/files, made
in lost+found, root's, and renamed to the root whole) that is renamed into
place last, and the marker that says "arranged" (META/LAYOUT,
root's) is renamed in with META. Cut at any instant, the next attach finds
the staging folder and goes on. The marker must be root's: a box runs as
another user, so no agent can forge it on a disk it could write whole.

Not here: mounting (disk_mounts.py, wake_layer.py, engine.py), reading and committing a layer
(transaction.py, wake_layer.py), the policy's `workspace:` section (policy/schema.py).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

OVERLAY_OPTIONS = "redirect_dir=off,index=off,metacopy=off,xino=off"  # an upper layer scan() can read whole

FILES = "files"
META = ".wakeloop"
LAYOUT = "layout"  # in META, root's: the disk is arranged (its content: the layout's version)
STAGING = ".layout.partial"  # at the root while arrange() moves the old files; then renamed to META
LOST = "lost+found"  # mkfs's, left where it is
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


def arranged(root: Path) -> bool:
    """The disk has this layout: META and its marker are root's (no agent makes a file of uid 0)."""
    try:
        meta, marker = os.lstat(root / META), os.lstat(root / META / LAYOUT)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return meta.st_uid == 0 and marker.st_uid == 0 and (root / FILES).is_dir() and not (root / FILES).is_symlink()


def arrange(root: Path) -> str | None:
    """Move an old disk's files (at its root) into files/, once; a new disk gets the same
    shape. Every step is a rename, and each is found done if run again (see above).
    What it did, for the person, or None."""
    root = Path(root)
    if arranged(root):
        return None
    staging, moved = root / STAGING, 0
    if _lexists(root / LOST) and not _ours(root / LOST):  # the agent's own (a link, say): one of its files
        os.rename(root / LOST, root / f"{LOST}.agent")
    if not _ours(staging):  # begin: a staging folder with files/ in it, made whole by one rename
        fresh = root / LOST / STAGING  # root's, where no agent writes: found there again if cut here
        fresh.parent.mkdir(mode=0o700, exist_ok=True)
        (fresh / FILES).mkdir(mode=0o700, parents=True, exist_ok=True)
        if _lexists(staging):  # an agent's own entry of that name: one of its files
            os.rename(staging, fresh / FILES / STAGING)
        os.rename(fresh, staging)
    if (staging / FILES).is_dir():  # moving: the rest of the root, then files/ into place
        owner = os.lstat(root)
        for name in sorted(os.listdir(root)):
            if name not in (LOST, STAGING):
                os.rename(root / name, staging / FILES / name)
                moved += 1
        os.chown(staging / FILES, owner.st_uid, owner.st_gid)
        os.chmod(staging / FILES, stat.S_IMODE(owner.st_mode))
        os.rename(staging / FILES, root / FILES)
    (staging / LAYOUT).write_text("1\n")  # moved: the marker and META's folders, then META into place
    for folder in ("wakes", "undo"):
        (staging / folder).mkdir(mode=0o700, exist_ok=True)
    os.chown(root, 0, 0)
    os.chmod(root, 0o755)
    os.rename(staging, root / META)
    return f"moved the disk's {moved} entries into its {FILES}/ folder (once)" if moved else None


def _ours(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0


def _lexists(path: Path) -> bool:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def overlay_options(lower: Path, upper: Path, work: Path) -> str:
    """`mount -o` for a wake's overlay, wherever it is mounted (wake_layer.py, engine_mounts.py):
    an upper layer scan() can read whole; nothing set-id or a device works through it."""
    return f"lowerdir={lower},upperdir={upper},workdir={work},{OVERLAY_OPTIONS},nosuid,nodev"
