"""The wakes' undo folders on an agent's disk: which there are, in what order, undoing one, pruning old ones.

Each committed wake left `.wakeloop/undo/RUN/` (layers.py): its manifest
(transaction.py: the changes, the state, the time its commit began) and what
the commit replaced. Here they are read as Wakes, oldest commit first (the
manifest's `time`; a manifest without one, by its file's mtime), so a wake's
`later` ones are known: undo refuses a path a later wake changed too, and a
diff says when a path was changed since rather than show a wrong one.

The disk is the agent's: its files are untrusted, and so, as a matter of
course, is everything under `.wakeloop/` (no box sees it, but the host never
relies on that alone). Every read here walks from the disk's root one
component at a time with O_NOFOLLOW, opens regular files only, O_NONBLOCK,
and caps what it reads (`read_under`); a manifest that does not parse is one
line, never a traceback. Old undo folders go with `prune` (shutil.rmtree,
which on Linux never follows a link). What undo keeps is on the disk, so it
counts against the disk's own size: no wake can keep more than its disk holds.

Not here: reading and committing a wake's changes (transaction.py), the
diff of one wake (wake_diff.py), the CLI's lock and event (cli/record_commands.py), the
broker's ops (broker/server.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from orchestrator.errors import ConfigError, WakeloopError
from orchestrator.sandbox.change_set import Change
from orchestrator.sandbox.disks import layers
from orchestrator.sandbox.wakes import transaction

MANIFEST_CAP = 64 * 2**20  # bytes: a manifest of a wake that changed ~300,000 paths
DAY_S = 86400.0
KEEP_STATES = ("committing", "undoing")  # never pruned: recover() finishes them at the next start


class UndoRefused(WakeloopError):
    """An undo that would overwrite a later wake's work, or cannot run now: one line (exit 1)."""


class BadUndoFolder(WakeloopError):
    """An undo folder (or the way to it) that is not what a commit leaves: one line (exit 1)."""


class NoSuchWake(ConfigError):
    """A run id that is not a wake with an undo folder on this disk (exit 2)."""


@dataclass(frozen=True)
class Wake:
    """One undo folder, as its manifest says."""

    run_id: str
    state: str  # committing | committed | undoing | undone
    time: float  # when its commit began (epoch seconds)
    changes: tuple[Change, ...]
    dir_modes: dict[str, object]  # a modified folder's mode before, by its index in `changes` (a string); unchecked
    since: float = 0.0  # when it reached its state (an undone wake: when it was undone)

    @property
    def live(self) -> bool:
        """Its changes are in the workspace (not undone)."""
        return self.state != "undone"


@dataclass(frozen=True)
class Undone:
    """What an undo put back."""

    run_id: str
    changes: int  # paths put back
    paths: tuple[str, ...]  # the first UNDONE_PATHS of them
    forced_over: tuple[str, ...] = ()  # later wakes that changed the same paths (--force)


UNDONE_PATHS = 20  # paths an Undone names; the rest are counted


def wakes(root: Path) -> list[Wake]:
    """Every wake with an undo folder on the disk at `root`, oldest commit first; unreadable ones skipped."""
    try:
        fd = _open_folder(root, layers.undos(root).relative_to(root))
    except FileNotFoundError:
        return []
    except NotRegular as exc:
        raise BadUndoFolder(f"the disk's undo folders: {exc.strerror}") from None
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    found = []
    for name in names:
        if layers.RUN_ID.fullmatch(name):
            try:
                found.append(wake(root, name))
            except (NoSuchWake, BadUndoFolder):
                continue
    return sorted(found, key=lambda w: (w.time, w.run_id))


def checked_run_id(run_id: str) -> str:
    """`run_id` if the harness could have made it; NoSuchWake (one line) if not."""
    try:
        return layers.run_id_ok(run_id)
    except layers.BadRunId as exc:
        raise NoSuchWake(f"{exc}; `wakeloop log AGENT_DIR` shows the runs") from None


def wake(root: Path, run_id: str) -> Wake:
    """The wake `run_id`'s undo folder, read; NoSuchWake, or BadUndoFolder if it does not parse."""
    rel = layers.undo(root, checked_run_id(run_id)).relative_to(root) / transaction.MANIFEST
    try:
        data, st = read_under(root, rel, MANIFEST_CAP)
    except FileNotFoundError:
        raise NoSuchWake(f"no wake {run_id} on this disk: it committed nothing, or was pruned") from None
    except NotRegular as exc:
        raise BadUndoFolder(f"wake {run_id}: {exc.strerror}") from None
    try:
        manifest = json.loads(data)
        changes = tuple(Change(**c) for c in manifest["changes"])
        stamp = manifest.get("time", st.st_mtime)
        dir_modes = manifest.get("dir_modes") or {}
        since = manifest.get("since", st.st_mtime)  # an older manifest: rewritten at each state
        if manifest.get("run_id") != run_id or not isinstance(manifest["state"], str):
            raise ValueError(run_id)
        if not all(isinstance(t, (int, float)) for t in (stamp, since)) or not isinstance(dir_modes, dict):
            raise ValueError(run_id)
    except (ValueError, TypeError, KeyError, AttributeError):
        raise BadUndoFolder(f"wake {run_id}: its undo manifest does not parse") from None
    return Wake(run_id, manifest["state"], float(stamp), changes, dir_modes, float(since))


def last(root: Path) -> Wake:
    """The wake that committed last (undone or not)."""
    found = [w for w in wakes(root) if w.state != "committing"]
    if not found:
        raise NoSuchWake("no wake has committed a change on this disk yet")
    return found[-1]


def later(root: Path, run_id: str) -> list[Wake]:
    """The wakes whose commit began after `run_id`'s."""
    all_wakes = wakes(root)
    ids = [w.run_id for w in all_wakes]
    if run_id not in ids:
        wake(root, run_id)  # raises the reason
    return all_wakes[ids.index(run_id) + 1 :]


def changed_since(root: Path, run_id: str) -> dict[str, str]:
    """path -> the run id of the first later wake (still in the workspace) that changed it too."""
    out: dict[str, str] = {}
    for other in later(root, run_id):
        if other.live:
            for change in other.changes:
                out.setdefault(change.path, other.run_id)
    return out


def undo(root: Path, run_id: str, force: bool = False) -> Undone:
    """Put back what wake `run_id` changed (transaction.undo_run). Refused (UndoRefused) when a
    later wake changed one of its paths, or an earlier one undone since this one committed
    (out of order, --force) did: this undo would put back that wake's version. Unless `force`."""
    target = wake(root, run_id)
    if target.state == "undone":
        raise UndoRefused(f"wake {run_id} is undone already")
    if target.state == "committing":
        raise UndoRefused(f"wake {run_id} did not finish committing; its agent's next wake finishes it first")
    again = changed_since(root, run_id)
    mine = {c.path for c in target.changes}
    over = sorted({again[p] for p in mine if p in again})
    if over and not force:
        paths = sorted(p for p in mine if p in again)
        raise UndoRefused(
            f"a later wake ({', '.join(over)}) changed {', '.join(paths[:3])}{' ...' if len(paths) > 3 else ''} "
            f"too; undo it first, or add --force"
        )
    revived = _undone_since(root, target)
    if revived and not force:
        paths = sorted(revived)
        raise UndoRefused(
            f"an earlier wake ({', '.join(sorted(set(revived.values())))}), undone after this one committed, "
            f"changed {', '.join(paths[:3])}{' ...' if len(paths) > 3 else ''} too: this undo would put back "
            "its version; add --force"
        )
    folder = layers.undo(root, run_id)
    try:
        transaction.undo_run(layers.files(root), folder, [], force=True)  # `later` settled above, without links
    except transaction.TransactionError as exc:
        if exc.errno != errno.ELOOP:
            raise UndoRefused(f"undo of wake {run_id} stopped: {exc.strerror}; run it again to finish") from None
        raise UndoRefused(f"wake {run_id} {exc.strerror}") from None  # done, but for paths behind a link
    except (OSError, KeyError, ValueError) as exc:  # a disk full, an undo folder not as its commit left it
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        raise UndoRefused(f"undo of wake {run_id} stopped: {why}; run it again to finish") from None
    put_back = tuple(c.path for c in target.changes)
    return Undone(run_id, len(put_back), put_back[:UNDONE_PATHS], tuple(over))


def _undone_since(root: Path, target: Wake) -> dict[str, str]:
    """path -> an earlier wake that changed it too and was undone after `target` committed (out
    of order): what `target` replaced there is that wake's version."""
    mine = {c.path for c in target.changes}
    out: dict[str, str] = {}
    for other in wakes(root):
        if other.time < target.time and other.state == "undone" and other.since > target.time:
            out.update({c.path: other.run_id for c in other.changes if c.path in mine})
    return out


def prune(root: Path, keep_days: float, now: float | None = None) -> list[str]:
    """Remove the undo folders of wakes that committed more than `keep_days` ago (never one a
    crash left half done): those wakes can no longer be undone or diffed. Their run ids."""
    cutoff = (time.time() if now is None else now) - keep_days * DAY_S
    gone = []
    for old in wakes(root):
        if old.time < cutoff and old.state not in KEEP_STATES:
            shutil.rmtree(layers.undo(root, old.run_id), ignore_errors=True)
            gone.append(old.run_id)
    return gone


# -- reading a disk that the agent wrote, no link followed ------------------------------------------


class NotRegular(OSError):
    """What a reader found in a regular file's place (a link, a folder, a FIFO): not read."""


def read_under(root: Path, rel: Path | str, cap: int) -> tuple[bytes, os.stat_result]:
    """(at most `cap` bytes, the stat) of the regular file root/rel, no link followed on the way.
    FileNotFoundError if absent; NotRegular for anything else in its place."""
    fd = open_under(root, rel)
    try:
        st = os.fstat(fd)
        data = _read_upto(fd, cap)
    finally:
        os.close(fd)
    return data, st


def open_under(root: Path, rel: Path | str) -> int:
    """An fd of the regular file root/rel, opened O_NOFOLLOW at every step; NotRegular otherwise."""
    parts = _parts(rel)
    parent = _open_folder(root, PurePosixPath(*parts[:-1])) if len(parts) > 1 else _open_folder(root, ".")
    try:
        st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)  # look first: opening a device acts
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(errno.EINVAL, f"{rel} is a {kind(st.st_mode)}, not a regular file")
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=parent)
    finally:
        os.close(parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between the look and the open
        os.close(fd)
        raise NotRegular(errno.EINVAL, f"{rel} changed while it was read")
    return fd


def lstat_under(root: Path, rel: Path | str) -> tuple[os.stat_result, str | None] | None:
    """(lstat, a link's target) of root/rel, nothing followed on the way; None if absent.
    NotRegular when a folder on the way is a link or not a folder."""
    parts = _parts(rel)
    try:
        parent = _open_folder(root, PurePosixPath(*parts[:-1])) if len(parts) > 1 else _open_folder(root, ".")
    except FileNotFoundError:
        return None
    try:
        st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        return st, os.readlink(parts[-1], dir_fd=parent) if stat.S_ISLNK(st.st_mode) else None
    except FileNotFoundError:
        return None
    finally:
        os.close(parent)


def _parts(rel: Path | str) -> tuple[str, ...]:
    parts = PurePosixPath(rel).parts
    if not parts or parts[0] == "/" or ".." in parts:
        raise NotRegular(errno.EINVAL, f"{str(rel)[:80]!r} is not a plain relative path")
    return parts


def _open_folder(root: Path, rel: PurePosixPath | Path | str) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for part in PurePosixPath(rel).parts:
        if part in (".", ""):
            continue
        if part == "..":
            os.close(fd)
            raise NotRegular(errno.EINVAL, f"{rel}: '..' is not followed")
        try:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise NotRegular(exc.errno, f"{rel}: {part} is not a folder (a link is never followed)") from None
            raise
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _read_upto(fd: int, limit: int) -> bytes:
    chunks, got = [], 0
    while got < limit:
        chunk = os.read(fd, min(limit - got, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "folder"),
        (stat.S_ISLNK, "link"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"
