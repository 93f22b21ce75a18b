"""A wake's overlay on the agent's disk: mounted where its boxes look, committed at its end.

`begin(disk, run_id)` first settles what an earlier wake left (see below),
then mounts the wake's overlay (lower: the disk's files/, read-only; upper
and work: .wakeloop/wakes/RUN/, on the same disk, where no box looks; the
options layers.OVERLAY_OPTIONS, nosuid, nodev) over KEY.box in
$WAKELOOP_DISKS. Every box of the wake binds its /workspace there (disk.py's
Disk.mount), the harness reads the workspace there (HostFiles), and the journal
stub appends there (a box): every call sees the wake's changes so far, and
files/ sees none of them until `finish`.

Why a host-side overlay given to the box as a bind, where the engine sees our
mounts: one overlay per wake, and ours. finish() removes the wake's
containers, unmounts the overlay (a plain umount) and only then reads the
upper layer. Every path the engine resolves is KEY.box, in $WAKELOOP_DISKS
(root's): nothing done under ROOT redirects it.

Where it does not (a broker in a container on a host whose `/` is a private
mount: engine_mounts.py), the overlay is the engine's: a volume of type
overlay its boxes mount. Two things then need care. The engine unmounts it
only when its last container goes, so finish first drops the volume with
every container that uses it (the engine refuses to drop a volume in use:
once it is gone no box writes). And the harness's reads mid-wake cannot
share the upper layer (a second overlay with that upper is refused, and an
upper layer changed under a mounted overlay is undefined behaviour), so it
reads through a read-only overlay with the upper as a lower layer, mounted
for one read (LayerFiles).

`finish(disk, run_id, protect, protect_git)`: scan, check against the policy,
commit what passes (transaction.py), drop the rest with the wake's layer. At
the agent's next start (begin), before anything runs: a commit cut short (its
manifest says `committing`) is finished (transaction.recover: the policy
passed it already); a wake that never reached its commit (the process died:
kill -9, the OOM killer, a reboot) is DISCARDED, its change set read first
and reported. Why discarded, not committed: a wake cut short may stop between
two steps the model meant as one (the old config deleted, the new one not yet
written), and landing half of it breaks the promise that the workspace is as
before a wake or as after it; nor did its record (receipt, journal) ever say
what it did.

Without a disk (`sandbox.disk: none`) there is no transaction: calls write
the folder as before. `wakeloop sandbox exec` is a wake of its own
(wake/one_call.py; the broker's _own_begin for a client that never begins
one), or, while a wake of the same agent runs, lands with that wake. A box
made outside any wake with no begin (the escape suite) writes files/ directly.

Not here: the layout (layers.py), scan/check/commit/recover (transaction.py),
the event and the next context (wake/loop.py, wake/context.py).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.sandbox.change_set import Settled, WakeChanges
from orchestrator.sandbox.disks import disk, disk_attach, engine_mounts, layers
from orchestrator.sandbox.disks.workspace_reads import HostFiles
from orchestrator.sandbox.wakes import transaction

READ_OPTIONS = f"{layers.OVERLAY_OPTIONS},nosuid,nodev,noexec"  # LayerFiles': nothing on it runs
# A wake's layer takes 4 inodes (its folder, upper, work, overlayfs's work/work). A dropped layer frees
# all of its own at once, when the kernel lets go of its overlay: wait for a margin past 4, so that a
# few freed early (a folder's) do not pass for it. A disk really this full waits FREED_WAIT_S, once.
LAYER_INODES = 64
FREED_WAIT_S = 5.0  # for the inodes a dropped layer frees once the kernel lets go of its overlay
FREED_POLL_S = 0.02


def begin(held: disk.Disk, run_id: str) -> Settled:
    """Settle what earlier wakes left, then offer this wake's overlay where its boxes get it:
    mounted over KEY.box, or (the engine's mounts) as the engine's volume."""
    settled = settle(held)
    root = held.view
    upper, work = layers.upper(root, run_id), layers.work(root, run_id)
    _await_inodes(root)
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    files = layers.files(root)
    os.chown(upper, *_owner(files))  # the upper layer's root takes the lower's owner and mode
    os.chmod(upper, stat.S_IMODE(os.lstat(files).st_mode))
    if held.engine_root is not None and held.engine is not None:
        try:
            engine_mounts.offer_wake(held.engine, held.key, held.engine_root, run_id, held.image)
        except engine_mounts.EngineMountError as exc:
            raise disk.DiskError(str(exc)) from None
        return settled
    _mount(["mount", "-t", "overlay", "overlay", "-o", layers.overlay_options(files, upper, work), str(held.box)])
    return settled


@dataclass(frozen=True)
class LayerFiles:
    """A running wake's workspace, as its boxes see it, where the engine mounts the overlay
    (engine_mounts.py): read through an overlay of this process's own, read-only (lower: the
    wake's upper layer, then files/), mounted over KEY.box for one read and gone after it, so
    no cached lookup outlives what the boxes change meanwhile."""

    held: disk.Disk
    run_id: str

    def read_text(self, rel: str) -> str:
        with reading(self.held, self.run_id) as root:
            return HostFiles(root).read_text(rel)

    def read_text_or_none(self, rel: str) -> str | None:
        with reading(self.held, self.run_id) as root:
            return HostFiles(root).read_text_or_none(rel)

    def journal_names(self) -> list[str]:
        with reading(self.held, self.run_id) as root:
            return HostFiles(root).journal_names()

    def journal_size(self, day: str) -> int | None:
        with reading(self.held, self.run_id) as root:
            return HostFiles(root).journal_size(day)


_reading_locks: dict[str, threading.Lock] = {}  # one read of a wake's overlay at a time per disk (KEY.box)


@contextmanager
def reading(held: disk.Disk, run_id: str) -> Iterator[Path]:
    """The wake's merged view, read-only, nosuid, nodev, noexec, at KEY.box while the block runs."""
    root, box = held.view, held.box
    lowers = f"{layers.upper(root, run_id)}:{layers.files(root)}"
    with _reading_locks.setdefault(held.key, threading.Lock()):
        _mount(["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={lowers},{READ_OPTIONS}", str(box)])
        try:
            yield box
        finally:
            _mount(["umount", str(box)], "unmount the wake's view")


def finish(held: disk.Disk, run_id: str, protect: tuple[str, ...], protect_git: bool) -> WakeChanges:
    """Unmount the wake's overlay (its boxes are gone), then scan, check, commit what passes
    and drop the rest. Never raises for the wake's own files: an error is a line in the result."""
    root = held.view
    upper, lower = layers.upper(root, run_id), layers.files(root)
    try:
        disk_attach.unmount_wake(held)
        changes = transaction.scan(upper, lower)
        allowed, refused = transaction.check(changes, protect, protect_git)
        if allowed:
            transaction.commit(upper, lower, layers.undo(root, run_id), run_id, allowed)
    except (OSError, ValueError) as exc:
        return WakeChanges(run_id, error=f"the wake's changes were not committed: {exc}")
    _drop(root, run_id)
    return WakeChanges(run_id, tuple(allowed), tuple(refused))


def settle(held: disk.Disk) -> Settled:
    """At an agent's start: a stale overlay unmounted, cut commits and undos finished,
    wakes that never reached their commit discarded (see the module's docstring)."""
    disk_attach.unmount_wake(held)
    root, lines, discarded = held.view, [], []
    undos = layers.undos(root)
    for folder in sorted(undos.iterdir()) if undos.is_dir() else []:
        if layers.RUN_ID.fullmatch(folder.name):
            done = transaction.recover(layers.files(root), folder)
            if done:
                lines.append(done)
    wakes = layers.wakes(root)
    for folder in sorted(wakes.iterdir()) if wakes.is_dir() else []:
        run_id = folder.name
        if not layers.RUN_ID.fullmatch(run_id):
            continue
        if not (layers.undo(root, run_id) / transaction.MANIFEST).exists():  # never reached its commit
            try:
                changes = transaction.scan(layers.upper(root, run_id), layers.files(root))
            except OSError:
                changes = []
            discarded.append(WakeChanges(run_id, discarded=tuple(changes)))
        _drop(root, run_id)
    return Settled(tuple(lines), tuple(discarded))


def _await_inodes(root: Path) -> None:
    """Wait (at most FREED_WAIT_S) until the disk has the inodes a wake's layer needs. A wake that
    filled its disk's inodes frees them when its layer is dropped, but only once the kernel lets
    go of its overlay: a removed box's mount namespace still holds it for some milliseconds after
    the engine says the box is gone. Past the wait, mkdir says ENOSPC, as it would."""
    deadline = time.monotonic() + FREED_WAIT_S
    while os.statvfs(root).f_ffree < LAYER_INODES and time.monotonic() < deadline:
        time.sleep(FREED_POLL_S)


def _drop(root: Path, run_id: str) -> None:
    """The wake's layer, with what was refused in it: gone. (overlayfs's work/work is 000.)"""
    shutil.rmtree(layers.wakes(root) / layers.run_id_ok(run_id), ignore_errors=True)


def _owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid


def _mount(argv: list[str], what: str = "mount the wake's overlay") -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=disk.TOOL_TIMEOUT_S)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise disk.DiskError(f"sandbox.disk: cannot {what}: {why}")
