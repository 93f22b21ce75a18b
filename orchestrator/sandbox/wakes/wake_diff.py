"""What one wake changed, read back as two sides per path: before (what its commit replaced,
kept in its undo folder) and after (what the commit put in place).

A committed wake's `after` is the workspace's file now, unless a later wake
changed that path too (undo_folders.changed_since) or its content no longer
matches what the commit landed (the manifest's sha256): then the side is
the manifest's word only (size, hash, target) and `since` says why, rather
than show a diff the wake never made. An undone wake's `after` is what the
undo took away (undo/RUN/new/N); what it replaced is back in the workspace.

Every read goes through undo_folders.read_under's rules: no link followed,
at the end or on the way; regular files only; capped. A side is text when it
is valid UTF-8 without a NUL and at most TEXT_CAP bytes, and the wake's
diff has text budget left (TEXT_BUDGET: it crosses the broker's wire);
otherwise it is shown by size and sha256. A link is its target, as written.

Not here: the rendering (views/diffview.py), the undo folders' order and
the undo itself (undo_folders.py), the broker's op (broker/server.py).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.sandbox.change_set import Change
from orchestrator.sandbox.disks import layers
from orchestrator.sandbox.wakes import transaction, undo_folders
from orchestrator.sandbox.wakes.undo_folders import NotRegular

TEXT_CAP = 256 * 1024  # bytes of one side shown as text; a bigger file is shown by size and hash
TEXT_BUDGET = 2 * 2**20  # bytes of text in one wake's diff (under the wire's 32 MiB line, escaped); then by hash
HASH_BLOCK = 1 << 20  # bytes per read while hashing


@dataclass(frozen=True)
class Side:
    """One side of one path: what was there before the wake, or after it."""

    type: str  # file | dir | link | other | none (nothing there)
    size: int = 0
    mode: int = 0
    sha256: str | None = None
    target: str | None = None  # a link's, as written: never followed
    text: str | None = None  # a text file's content; None: binary, too big, over budget, or not a file
    note: str = ""  # why it is not text, or not read


@dataclass(frozen=True)
class PathDiff:
    change: Change
    before: Side
    after: Side
    since: str = ""  # a later wake changed this path since (its run id), or "changed since": after not shown


@dataclass(frozen=True)
class WakeDiff:
    run_id: str
    state: str  # committed | undone | committing | undoing
    time: float  # when its commit began
    paths: tuple[PathDiff, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def change_set(self) -> dict[str, Any]:
        """`wakeloop diff --json`: the changes and their sides, without the text."""
        out = self.to_json()
        for path in out["paths"]:
            for side in ("before", "after"):
                path[side].pop("text")
        return out

    @classmethod
    def from_json(cls, obj: object) -> WakeDiff:
        """Back from the broker's wire; ValueError if it is not one."""
        try:
            assert isinstance(obj, dict)
            paths = tuple(
                PathDiff(Change(**p["change"]), Side(**p["before"]), Side(**p["after"]), str(p["since"]))
                for p in obj["paths"]
            )
            return cls(str(obj["run_id"]), str(obj["state"]), float(obj["time"]), paths)
        except (AssertionError, TypeError, KeyError, ValueError):
            raise ValueError("not a wake's diff") from None


def read(root: Path, run_id: str | None = None) -> WakeDiff:
    """The diff of wake `run_id` (default: the last to commit) on the disk whose root is `root`."""
    wake = undo_folders.last(root) if run_id is None else undo_folders.wake(root, run_id)
    since = undo_folders.changed_since(root, wake.run_id) if wake.live else {}
    budget = [TEXT_BUDGET]
    undo = layers.undo(root, wake.run_id).relative_to(root)
    paths = []
    for i, change in enumerate(wake.changes):
        before = _before(root, undo / transaction.OLD / str(i), change, wake, i, budget)
        after, why = _after(root, undo / transaction.NEW / str(i), change, wake, since.get(change.path), budget)
        paths.append(PathDiff(change, before, after, why))
    return WakeDiff(wake.run_id, wake.state, wake.time, tuple(paths))


def _before(root: Path, old: Path, change: Change, wake: undo_folders.Wake, i: int, budget: list[int]) -> Side:
    if change.kind == "added":
        return Side("none")
    if change.type == "dir":
        mode = wake.dir_modes.get(str(i), 0)
        return Side("dir", mode=mode if isinstance(mode, int) else 0)
    if wake.state == "undone":
        return Side(change.type, note="undone: what the wake replaced is back in the workspace")
    return side(root, old, budget)


def _after(
    root: Path, new: Path, change: Change, wake: undo_folders.Wake, later: str | None, budget: list[int]
) -> tuple[Side, str]:
    if change.kind == "deleted":
        return Side("none"), ""
    if change.type == "dir":
        return Side("dir", mode=change.mode), ""
    landed = Side(change.type, change.size, change.mode, change.sha256, change.target)
    if wake.state == "undone":
        return side(root, new, budget), ""
    if later:
        return landed, later
    now = side(root, layers.files(root).relative_to(root) / change.path, budget)
    if (now.type, now.sha256, now.target) != (change.type, change.sha256, change.target):
        return landed, "changed since"
    return now, ""


def side(root: Path, rel: Path, budget: list[int]) -> Side:
    """What is at root/rel, read without following a link; text if it fits `budget` (spent)."""
    try:
        found = undo_folders.lstat_under(root, rel)
    except (NotRegular, OSError) as exc:
        return Side("other", note=f"not read: {exc.strerror or exc}")
    if found is None:
        return Side("none", note="not there")
    st, target = found
    if target is not None:
        return Side("link", mode=stat.S_IMODE(st.st_mode), target=target)
    if stat.S_ISDIR(st.st_mode):
        return Side("dir", mode=stat.S_IMODE(st.st_mode))
    if not stat.S_ISREG(st.st_mode):
        return Side("other", mode=stat.S_IMODE(st.st_mode), note=undo_folders.kind(st.st_mode))
    try:
        fd = undo_folders.open_under(root, rel)
    except (NotRegular, OSError) as exc:
        return Side("other", note=f"not read: {exc.strerror or exc}")
    try:
        head, digest, size = _hash(fd, TEXT_CAP + 1)
    finally:
        os.close(fd)
    text, note = _text(head, size, budget)
    return Side("file", size, stat.S_IMODE(st.st_mode), digest, text=text, note=note)


def _hash(fd: int, keep: int) -> tuple[bytes, str, int]:
    """(the first `keep` bytes, the sha256 of all, the size read)."""
    digest, head, size = hashlib.sha256(), b"", 0
    while block := os.read(fd, HASH_BLOCK):
        digest.update(block)
        if len(head) < keep:
            head += block[: keep - len(head)]
        size += len(block)
    return head, digest.hexdigest(), size


def _text(head: bytes, size: int, budget: list[int]) -> tuple[str | None, str]:
    if size > TEXT_CAP:
        return None, f"over {TEXT_CAP // 1024} KiB: shown by size and hash"
    if b"\0" in head:
        return None, "binary"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return None, "binary"
    if size > budget[0]:
        return None, "this wake's diff is long: shown by size and hash"
    budget[0] -= size
    return text, ""
