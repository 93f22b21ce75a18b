"""A wake as a transaction on the workspace: what it changed, checked, committed whole, undoable.

A wake's boxes see the workspace through an overlay (lower: the agent's
files, read-only; upper and work: the wake's, on the same disk, where no box
looks). When the wake ends, whatever its receipt, its upper layer is the
exact record of what it changed:

- `scan(upper, lower)` reads it into Changes (added, modified, deleted;
  files, folders, links as links, never followed): a whiteout (a 0:0
  character device) is a deletion, an opaque folder (xattr
  trusted.overlay.opaque=y) deletes what it hid; a file copied up but equal
  to its lower self (a chmod back, a hard link made to it) is no change.
  The overlay is mounted with redirect_dir, index, metacopy and xino off,
  so nothing else can be in the upper layer.
- `check(changes, protect, protect_git)` sorts them: a path under a
  `workspace.protect` glob, inside a git directory (protect_git), or a file
  with a set-id bit is refused, with the rule that refused it; a folder's
  deletion is refused if anything refused lies beneath it.
- `commit(...)` applies what passes to the lower layer and keeps what it
  replaced in the wake's undo folder. Every step is a rename on one
  filesystem, and a manifest written first (state `committing`) lists them;
  each step can be done again and finds its own work done, so a commit cut
  short at any instant by the process's death (kill -9) is finished by
  `recover()` at the agent's next start: the workspace is as before the wake
  or as after it, never half. A commit that fails (the wake filled its disk:
  a new folder needs an inode and a block) is rolled back at once, by renames
  that allocate nothing, and so is a cut one that recover() cannot finish.
  (A power cut also needs the folders synced after each rename; only the
  manifest is fsynced today.) What was refused stays in the upper layer until
  it is dropped.
- `undo(...)` puts back what one wake changed, the same way (state
  `undoing`), and refuses when a later wake changed one of its paths.

Not here: mounting the overlay and giving it to the boxes (wake_layer.py, engine.py),
the policy section (policy/schema.py), the wake's events (wake/loop.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import time
from dataclasses import asdict, replace
from pathlib import Path

from orchestrator.policy.paths import glob_match, is_dotgit
from orchestrator.sandbox.changes import Change, Refused

MANIFEST = "manifest.json"
OLD, NEW = "old", "new"  # in an undo folder: what a commit replaced; what an undo took away
SETID = stat.S_ISUID | stat.S_ISGID
SHARED = "hard link out of the wake"  # the rule that refuses a Change.shared
OPAQUE = "trusted.overlay.opaque"


class TransactionError(OSError):
    """A commit or an undo that cannot go on: one line."""


# -- reading the upper layer ---------------------------------------------------------------


def scan(upper: Path, lower: Path) -> list[Change]:
    """What the wake changed, parents before children, deletions of a folder's contents before it."""
    changes: list[Change] = []
    _walk(Path(upper), Path(lower), "", changes)
    return _links_outside(Path(upper), changes)


def _links_outside(upper: Path, changes: list[Change]) -> list[Change]:
    """Each file whose inode has more links than the upper layer holds, marked `shared`: a hard
    link to a file outside the wake (in files/, or anywhere on the disk). The box cannot make
    one (overlayfs copies a lower file up before linking it), so it was planted past the box;
    landed, it would share its inode with a file the wake did not change."""
    linked = [c for c in changes if c.type == "file" and c.kind != "deleted" and os.lstat(upper / c.path).st_nlink > 1]
    if not linked:
        return changes
    held: dict[int, int] = {}  # inode -> its names in the upper layer
    for folder, _dirs, names in os.walk(upper):
        for name in names:
            st = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                held[st.st_ino] = held.get(st.st_ino, 0) + 1
    shared = set()
    for c in linked:
        st = os.lstat(upper / c.path)
        if st.st_nlink > held.get(st.st_ino, 0):
            shared.add(c.path)
    return [replace(c, shared=True) if c.path in shared else c for c in changes]


def _walk(upper: Path, lower: Path, rel: str, out: list[Change]) -> None:
    with os.scandir(upper / rel if rel else upper) as entries:
        names = sorted(entry.name for entry in entries)
    below = _lstat_in(lower, rel) if rel else None
    if rel and _opaque(upper / rel) and below is not None and stat.S_ISDIR(below.st_mode):
        for name in sorted(os.listdir(lower / rel)):
            if name not in names:
                out += _deleted(lower, _join(rel, name))
    for name in names:
        path = _join(rel, name)
        st, before = os.lstat(upper / path), _lstat_in(lower, path)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout
            if before is not None:
                out += _deleted(lower, path)
            continue
        if before is not None and _type(before.st_mode) != _type(st.st_mode):
            out += _deleted(lower, path)  # a file became a folder, or the reverse
            before = None
        if stat.S_ISDIR(st.st_mode):
            if before is None or stat.S_IMODE(before.st_mode) != stat.S_IMODE(st.st_mode):
                out.append(_change(upper, path, st, "added" if before is None else "modified"))
            _walk(upper, lower, path, out)
        elif before is None:
            out.append(_change(upper, path, st, "added"))
        elif not _same(upper / path, st, lower / path, before):
            out.append(_change(upper, path, st, "modified"))


def _deleted(lower: Path, path: str) -> list[Change]:
    """A deletion of `path` in the lower layer: a folder's contents first, deepest first."""
    st = os.lstat(lower / path)
    out: list[Change] = []
    if stat.S_ISDIR(st.st_mode):
        for name in sorted(os.listdir(lower / path)):
            out += _deleted(lower, _join(path, name))
    out.append(Change(path, "deleted", _type(st.st_mode)))
    return out


def _change(upper: Path, path: str, st: os.stat_result, kind: str) -> Change:
    kind_of = _type(st.st_mode)
    return Change(
        path,
        kind,
        kind_of,
        st.st_size if kind_of == "file" else 0,
        stat.S_IMODE(st.st_mode),
        os.readlink(upper / path) if kind_of == "link" else None,
        _sha256(upper / path) if kind_of == "file" else None,
    )


def _same(new: Path, st: os.stat_result, old: Path, before: os.stat_result) -> bool:
    """A copy-up that changed nothing: same type, mode and content (a link: same target)."""
    if stat.S_IMODE(st.st_mode) != stat.S_IMODE(before.st_mode):
        return False
    if stat.S_ISLNK(st.st_mode):
        return os.readlink(new) == os.readlink(old)
    if stat.S_ISREG(st.st_mode):
        return st.st_size == before.st_size and _sha256(new) == _sha256(old)
    return False


def _opaque(folder: Path) -> bool:
    try:
        return os.getxattr(folder, OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


# -- the policy -----------------------------------------------------------------------------


def check(
    changes: list[Change], protect: tuple[str, ...] = (), protect_git: bool = True
) -> tuple[list[Change], list[Refused]]:
    """(what may land, what may not and why). A folder is deleted only with everything in it."""
    allowed: list[Change] = []
    refused: list[Refused] = []
    for change in changes:
        rule = _rule(change, protect, protect_git)
        if rule is None and change.kind == "deleted" and change.type == "dir":
            under = next((r for r in refused if r.change.path.startswith(change.path + "/")), None)
            rule = f"{under.rule} (beneath it: {under.change.path})" if under else None
        if rule is None and change.kind == "added":  # in the place of what could not be deleted
            kept = next((r for r in refused if r.change.path == change.path), None)
            rule = kept.rule if kept else None
        if rule:
            refused.append(Refused(change, rule))
        else:
            allowed.append(change)
    return allowed, refused


def _rule(change: Change, protect: tuple[str, ...], protect_git: bool) -> str | None:
    if protect_git and any(is_dotgit(part) for part in change.path.split("/")):
        return "protect_git"
    glob = next((g for g in protect if glob_match(g, change.path)), None)
    if glob:
        return glob
    if change.type == "file" and change.mode & SETID:
        return "set-id bit"
    if change.shared:
        return SHARED
    return None


# -- landing it, and taking it back ------------------------------------------------------------


def commit(upper: Path, lower: Path, undo: Path, run_id: str, allowed: list[Change]) -> None:
    """Apply `allowed` to `lower`, keeping what it replaces under `undo` (a folder of this
    wake's, on the same filesystem). Finished by recover() if cut short; rolled back whole
    if it fails (the undo folder and manifest included: a full disk fails them first)."""
    modes = {
        str(i): stat.S_IMODE(os.lstat(Path(lower) / c.path).st_mode)
        for i, c in enumerate(allowed)
        if c.type == "dir" and c.kind == "modified"
    }
    folder_times = _folder_times(Path(upper), allowed)  # before a rename out of them moves them
    manifest = {
        "run_id": run_id,
        "state": "committing",
        "time": time.time(),  # when the commit began: the wakes' order (undo_folders.py)
        "upper": str(upper),
        "changes": [asdict(c) for c in allowed],
        "dir_modes": modes,
        "folder_times": folder_times,
    }
    try:
        undo.mkdir(parents=True, exist_ok=True)
        _write_manifest(undo, manifest)
        _apply(Path(upper), Path(lower), undo, allowed, folder_times)
        _set_state(undo, "committed")
    except Exception:
        _roll_back(Path(upper), Path(lower), undo, allowed, modes)
        raise


def undo_run(lower: Path, undo: Path, later: list[Path], force: bool = False) -> list[Change]:
    """Put back what the wake of `undo` changed. `later`: the undo folders of the wakes after it;
    a path one of them changed too is refused (TransactionError) unless `force`."""
    manifest = read_manifest(undo)
    if manifest["state"] not in ("committed", "undoing"):
        raise TransactionError(errno.EINVAL, f"wake {manifest['run_id']} is {manifest['state']}, not committed")
    changes = [Change(**c) for c in manifest["changes"]]
    if not force:
        mine = {c.path for c in changes}
        for folder in later:
            theirs = read_manifest(folder)
            again = sorted(mine & {c["path"] for c in theirs["changes"]})
            if again and theirs["state"] != "undone":
                raise TransactionError(
                    errno.EBUSY,
                    f"a later wake ({theirs['run_id']}) changed "
                    f"{', '.join(again[:3])}{' ...' if len(again) > 3 else ''} too; "
                    "undo it first, or use --force",
                )
    _set_state(undo, "undoing")
    skipped = _revert(Path(lower), undo, changes, manifest.get("dir_modes") or {})
    _set_state(undo, "undone")
    if skipped:
        raise TransactionError(
            errno.ELOOP,
            f"undone but for {', '.join(skipped[:3])}{' ...' if len(skipped) > 3 else ''}: "
            "a link stands on the way there now, and is never followed",
        )
    return changes


def recover(lower: Path, undo: Path) -> str | None:
    """Finish a commit or an undo that a crash cut short (at the agent's next start, before
    anything else): what was done, or None if there was nothing to finish."""
    try:
        manifest = read_manifest(undo)
    except FileNotFoundError:
        return None
    changes = [Change(**c) for c in manifest["changes"]]
    if manifest["state"] == "committing":
        upper = Path(manifest["upper"])
        try:
            _apply(upper, Path(lower), undo, changes, manifest.get("folder_times") or {})
            _set_state(undo, "committed")
        except OSError as exc:
            _roll_back(upper, Path(lower), undo, changes, manifest.get("dir_modes") or {})
            return f"rolled back wake {manifest['run_id']}'s cut commit, which could not be finished: {exc.strerror}"
        return f"finished committing wake {manifest['run_id']} ({len(changes)} changes)"
    if manifest["state"] == "undoing":
        _revert(Path(lower), undo, changes, manifest.get("dir_modes") or {})
        _set_state(undo, "undone")
        return f"finished undoing wake {manifest['run_id']} ({len(changes)} changes)"
    return None


# Each change's old version is kept at undo/old/N and what an undo takes away at undo/new/N,
# N its place in the manifest: one name per step, never a path's, so a folder replaced by a
# file (or the reverse) and a folder deleted with its contents never meet. A step is done
# when its own name says so; run again, it does nothing.


def _apply(upper: Path, lower: Path, undo: Path, changes: list[Change], folder_times: dict) -> None:
    for i, change in enumerate(changes):
        here, new, old = lower / change.path, upper / change.path, undo / OLD / str(i)
        if _linked_above(lower, change.path):  # not as scan saw it: never followed (scan refuses the way)
            continue
        if change.kind == "deleted":
            if not _lexists(old):
                _move(here, old)  # contents first (scan's order), then the folder
        elif change.type == "dir":
            _mkdir(here)
            _own_folder(here, new)
            _chmod_folder(here, change.mode)
        elif _lexists(new):  # not yet landed: the old kept, then the new landed
            if change.kind == "modified" and not _lexists(old):
                _move(here, old)
            _move(new, here)
    _time_folders(lower, folder_times)


# What crosses from the wake's layer to the agent's files with each change. Files and links
# cross by rename(2): their inode moves whole (owner, group, mode, times, bytes). A folder
# cannot move (the lower one may hold files the wake never touched), so the commit makes it
# and gives it what the box saw: its owner and group (_own_folder), its mode (_chmod_folder)
# and, once everything beneath it has landed, its times (_time_folders). A file with a set-id
# bit never crosses (check() refuses it).


def _roll_back(upper: Path, lower: Path, undo: Path, changes: list[Change], dir_modes: dict) -> None:
    """A commit that could not go on, put back as before it, its undo folder gone: the wake's
    layer is then one that never reached its commit (discarded, and reported, at the next
    start). Why it fails: the wake filled its disk, and a folder the commit makes needs an
    inode and a block. So every step here is a rename into a folder that exists or a removal,
    which allocate nothing: each of the commit's renames done is undone, last first, as far
    as it got (a step not reached finds its source still in place)."""
    for i in reversed(range(len(changes))):
        change = changes[i]
        here, new, old = lower / change.path, upper / change.path, undo / OLD / str(i)
        if _linked_above(lower, change.path):  # skipped by the commit: never followed
            continue
        if change.type == "dir" and change.kind == "added":
            made = _lstat_in(lower, change.path)
            if made is not None and stat.S_ISDIR(made.st_mode) and not os.listdir(here):
                here.rmdir()  # what the commit moved into it went back first
        elif change.type == "dir" and change.kind == "modified":
            _chmod_folder(here, dir_modes[str(i)])
        elif change.kind == "deleted":
            _move(old, here)
        else:
            if not _lexists(new):  # landed: back to the wake's layer
                _move(here, new)
            _move(old, here)  # what it replaced, if it was moved aside
    (undo / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(undo, ignore_errors=True)


def _revert(lower: Path, undo: Path, changes: list[Change], dir_modes: dict) -> list[str]:
    """Each change put back, last first; the paths left as they are because a link stands on the
    way there now (planted since the wake: never followed)."""
    skipped = []
    for i in reversed(range(len(changes))):
        change = changes[i]
        here, old, gone = lower / change.path, undo / OLD / str(i), undo / NEW / str(i)
        if _linked_above(lower, change.path):
            skipped.append(change.path)
            continue
        if change.type == "dir" and change.kind == "added":
            if not _lexists(gone) and here.is_dir() and not here.is_symlink() and not os.listdir(here):
                _move(here, gone)
        elif change.type == "dir" and change.kind == "modified":
            _chmod_folder(here, dir_modes[str(i)])  # keys are strings: the manifest is JSON
        elif change.kind == "deleted":
            _move(old, here)
        else:
            if not _lexists(gone):
                _move(here, gone)
            if change.kind == "modified":
                _move(old, here)
    return skipped


def _mkdir(path: Path) -> None:
    """A folder the commit makes: the step a full disk fails first (the tests fail it so)."""
    path.mkdir(exist_ok=True)


def _move(source: Path, target: Path) -> None:
    """rename(2), never across filesystems, with the target's folder made; no source: nothing."""
    if not _lexists(source):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(source, target)


def read_manifest(undo: Path) -> dict:
    return json.loads((undo / MANIFEST).read_text())


def _write_manifest(undo: Path, manifest: dict) -> None:
    partial = undo / (MANIFEST + ".partial")
    with open(partial, "w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(partial, undo / MANIFEST)


def _set_state(undo: Path, state: str) -> None:
    """`since`: when (undo_folders.undo asks whether an earlier wake was undone after a later one committed)."""
    _write_manifest(undo, {**read_manifest(undo), "state": state, "since": time.time()})


def _type(mode: int) -> str:
    return "dir" if stat.S_ISDIR(mode) else "link" if stat.S_ISLNK(mode) else "file" if stat.S_ISREG(mode) else "other"


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # a parent that is a file: nothing beneath it
        return None


def _lexists(path: Path) -> bool:
    return _lstat(path) is not None


def _lstat_in(root: Path, rel: str) -> os.stat_result | None:
    """root/rel's own lstat, with no link on the way: a link there (the agent's: a committed
    `x -> /root`) is never followed, and what lies beyond it is not there."""
    return None if _linked_above(root, rel) else _lstat(root / rel)


def _linked_above(root: Path, rel: str) -> str | None:
    """The first step on the way to root/rel that is a link, or None. (One missing is made as a
    real folder; a file there fails the step with ENOTDIR, as it should.)"""
    here = root
    for part in rel.split("/")[:-1]:
        here = here / part
        st = _lstat(here)
        if st is not None and stat.S_ISLNK(st.st_mode):
            return str(here.relative_to(root))
        if st is None or not stat.S_ISDIR(st.st_mode):
            return None
    return None


def _own_folder(path: Path, like: Path) -> None:
    """A folder the commit made takes the owner and group of the box's (`like`, in the upper
    layer): without it, root's, and the box's user could no longer write in its own folder."""
    theirs, made = _lstat(like), _lstat(path)
    if theirs is None or made is None or not stat.S_ISDIR(made.st_mode):
        return
    if (made.st_uid, made.st_gid) != (theirs.st_uid, theirs.st_gid):
        os.chown(path, theirs.st_uid, theirs.st_gid, follow_symlinks=False)


def _folder_times(upper: Path, changes: list[Change]) -> dict[str, list[int]]:
    """{folder: [atime_ns, mtime_ns]} as the box left them, for each folder the wake touched (made,
    chmodded, or holding a change), read before the commit: its renames out of them move them."""
    folders = {c.path for c in changes if c.type == "dir" and c.kind != "deleted"}
    for change in changes:
        parts = change.path.split("/")[:-1]
        folders.update("/".join(parts[: n + 1]) for n in range(len(parts)))
    times = {}
    for rel in folders:
        st = _lstat_in(upper, rel)
        if st is not None and stat.S_ISDIR(st.st_mode):
            times[rel] = [st.st_atime_ns, st.st_mtime_ns]
    return times


def _time_folders(lower: Path, folder_times: dict) -> None:
    """Each folder the wake touched gets the times the box saw, once everything beneath it has
    landed (the commit's renames and mkdirs moved them to the commit's time)."""
    for rel, (atime_ns, mtime_ns) in folder_times.items():
        st = _lstat_in(lower, rel)
        if st is not None and stat.S_ISDIR(st.st_mode):
            os.utime(lower / rel, ns=(atime_ns, mtime_ns), follow_symlinks=False)


def _chmod_folder(path: Path, mode: int) -> None:
    """A folder's mode, never a link's target's (os.chmod follows links)."""
    st = _lstat(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        os.chmod(path, mode)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with open(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name
