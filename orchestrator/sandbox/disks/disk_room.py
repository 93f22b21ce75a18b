"""The guard that keeps the host's room: a call starts only with room for every call's worst case.

Thin disks, and the guard that keeps the host safe: a disk's size is a
promise, not space set aside (the sizes together may be at most `overcommit`
times the filesystem that holds them, checked where a disk is made or
grown). What bounds the host is one invariant, checked before every call
(flight): a call starts only if the disks' filesystem has room, beyond
RESERVE, for the worst case of every call in flight on this host, its own
included, each disk's worst case being its size less the blocks its image
holds. It is sound because a disk is written only during a call (nothing a
call starts outlives it: programs.py kills the rest before the call ends)
or its making (mkfs, which runs as one); as a call writes, the free space
and its worst case shrink together; and when it ends the disk is synced
(syncfs) before it stops counting, so what it wrote sits in the image, not
only in the disk's page cache. In flight is known across processes (a
CLI's `sandbox exec` and the broker share $WAKELOOP_DISKS): a per-process
count per disk and a shared POSIX record lock on `KEY.call`, tested under
ROOM_LOCK, which goes with its process however it ends. A call that cannot
start waits (bounded) for calls in flight to end, then is refused: NoRoom,
one line, which engine.py turns into a refused result (box.no_room).

Not here: what a refused call says (box.no_room), the promise's bound
(the ceiling's max.disk_overcommit, policy/ceiling.py), making an image
(disk_image.py).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.sandbox.disks.disk import TOOL_TIMEOUT_S, DiskError, disks_dir, locked, path_of

RESERVE = 0.05  # of the disks' filesystem, never left to the calls' worst case
OVERCOMMIT = 10  # the disks' sizes together: at most this many times their
# filesystem's size (the broker's ceiling: max.disk_overcommit)
ROOM_LOCK = "room.lock"  # in the disks' directory: one process at a time claims room

ROOM_WAIT_S = 30.0  # a call waits this long for calls in flight to end (and their
# worst case with them) before it is refused
ROOM_POLL_S = 0.05  # how often it looks meanwhile


class NoRoom(DiskError):
    """A call that did not start: the disks' filesystem lacks room for its worst case."""


@dataclass(frozen=True)
class Room:
    """The disks' filesystem as the guard sees it, at one moment under ROOM_LOCK."""

    free: int  # bytes free to us beyond RESERVE
    worst: int  # what the disks with calls in flight may still take, this call's own included
    own: int  # this call's disk's part of `worst`
    flying: int  # disks with a call in flight, this one included

    @property
    def enough(self) -> bool:
        return self.worst <= self.free


def room(key: str) -> Room:
    """Each disk written only during a call can still take its size less the blocks its
    image holds: the worst case of the disks with calls in flight, anywhere on this host,
    and of `key`'s, against the filesystem's free space beyond its reserve. Paid by
    every call: one listing, a lock test per disk that has had a call, a stat per disk in
    flight (plain strings, no pathlib: 0.7 ms with 100 disks, median, on a loaded
    2-core machine; bench/thin_disks.py --per-call)."""
    where = str(disks_dir())
    st = os.statvfs(where)
    free = st.f_bavail * st.f_frsize - int(st.f_blocks * st.f_frsize * RESERVE)
    called = {entry.name[:-5] for entry in os.scandir(where) if entry.name.endswith(".call")}
    flying = {key} | {k for k in called if k != key and in_flight(k, where)}
    worst = {k: _worst(where, k) for k in flying}
    return Room(free, sum(worst.values()), worst[key], len(flying))


def _worst(where: str, key: str) -> int:
    """What the disk can still take on the host: its size less what its image holds."""
    for suffix in (".img", ".partial"):  # made, or being made
        try:
            st = os.stat(f"{where}/{key}{suffix}")
        except FileNotFoundError:
            continue
        return max(st.st_size - st.st_blocks * 512, 0)
    return 0


@contextmanager
def flight(key: str, view: Path | None = None, wait_s: float = ROOM_WAIT_S) -> Iterator[None]:
    """One call on `key`'s disk, from the check to its last write settled: it starts
    only if room(key) is enough, waiting up to `wait_s` for calls in flight to end,
    else NoRoom (one line). `view`: where the disk is mounted here; the call returns
    at once, and its disk counts as in flight until the settler has synced it (the
    box's writes sit in the disk's page cache until then, not yet on the host).
    Without one (mkfs, which syncs what it wrote), it lands at once."""
    _take_off(key, wait_s)
    try:
        yield
    finally:
        if view is None:
            _land(key)
        else:
            _settler.add(key, view)


def _take_off(key: str, wait_s: float) -> None:
    started = time.monotonic()
    deadline = started + wait_s
    while True:
        with locked(disks_dir() / ROOM_LOCK):  # the check and the mark, one process at a time
            seen = room(key)
            if seen.enough:
                _fly(key)
                return
        # Alone it cannot fit: waiting for others to end will not make room.
        if seen.own > seen.free or time.monotonic() >= deadline:
            raise NoRoom(_no_room_line(seen, time.monotonic() - started))
        time.sleep(ROOM_POLL_S)


def _no_room_line(seen: Room, waited_s: float) -> str:
    others = seen.flying - 1
    return (
        f"sandbox.disk: this call did not start: the disks' filesystem ({disks_dir()}) has "
        f"{max(seen.free, 0):,} bytes free beyond its {RESERVE:.0%} reserve, and this disk may still "
        f"take {seen.own:,}"
        + (
            f", the {others} other disk(s) with calls in flight {seen.worst - seen.own:,}"
            f" (waited {waited_s:.1f} s for them)"
            if others
            else ""
        )
        + "; try again later; the operator frees space there, deletes the disks of removed agents "
        "(`wakeloop disk rm`) or lowers sandbox.disk"
    )


_flying: dict[str, tuple[int, int]] = {}  # key -> (the `call` fd, locked shared; calls in this process)

_flying_lock = threading.Lock()


def _fly(key: str) -> None:
    """Mark a call in flight: a count here; for other processes, a shared POSIX record lock
    on KEY.call, which goes with the process, however it ends (kill -9 included), and is
    never inherited by a child (see disk.py's Hold)."""
    with _flying_lock:
        fd, count = _flying.get(key, (None, 0))
        if fd is None:
            fd = os.open(path_of(key, "call"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.lockf(fd, fcntl.LOCK_SH)  # under ROOM_LOCK: no one tests it meanwhile
        _flying[key] = (fd, count + 1)


def _land(key: str) -> None:
    with _flying_lock:
        fd, count = _flying.pop(key)
        if count > 1:
            _flying[key] = (fd, count - 1)
        else:
            os.close(fd)


def in_flight(key: str, where: str | None = None) -> bool:
    """A call of `key`'s disk in flight in this process or any other, tested without
    waiting (under ROOM_LOCK: no mark is made meanwhile). As disk.py's nobody_holds: only while
    this process has no lock on the file, whose closing would drop it."""
    with _flying_lock:
        if key in _flying:
            return True
        try:
            fd = os.open(f"{where or disks_dir()}/{key}.call", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # EAGAIN or EACCES: another process has a call in flight
            return True
        finally:
            os.close(fd)
        return False


class _Settler:
    """Syncs a disk once its calls end, off their path (syncfs: 2.6 ms median on this
    host with nothing to write, more after a write), then lands them. One thread per
    process, started at its first call and kept: a thread started at every call's end
    cost that call the wait for the thread to run (Thread.start: 0.3 ms idle, 2.7 ms in
    a paced wake under profile, more while the engine makes a box on the same cores).
    Calls that end during a sync are synced again."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pending: dict[str, tuple[Path, int]] = {}  # key -> (its view, calls ended, not landed)
        self._thread: threading.Thread | None = None

    def add(self, key: str, view: Path) -> None:
        with self._changed:
            self._pending[key] = (view, self._pending.get(key, (view, 0))[1] + 1)
            self._changed.notify_all()
            if self._thread is None or not self._thread.is_alive():  # first call, or a forked child
                self._thread = threading.Thread(target=self._run, name="wakeloop-disk-settler", daemon=True)
                self._thread.start()

    def wait(self, key: str, timeout_s: float = TOOL_TIMEOUT_S) -> None:
        """Until the calls of `key` that ended here have landed (before it is let go: a
        sync in progress holds the mount, which release unmounts)."""
        with self._changed:
            self._changed.wait_for(lambda: key not in self._pending, timeout_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending)
                key, (view, ended) = next(iter(self._pending.items()))
            try:
                _sync(view)
            except Exception:  # landed all the same: the kernel writes it back within ~30 s anyway
                pass
            finally:
                with self._changed:
                    view, now = self._pending.pop(key)
                    if now > ended:  # ended during the sync: their writes may be after it
                        self._pending[key] = (view, now - ended)
                    for _ in range(ended):
                        _land(key)
                    self._changed.notify_all()


_settler = _Settler()
_libc_handle = None  # libc, loaded at the first sync


def settled(key: str) -> None:
    """Wait until the calls of `key`'s disk that ended in this process no longer count as in flight."""
    _settler.wait(key)


def _sync(view: Path) -> None:
    """Write the disk's dirty pages to its image (syncfs on its mount), so that the host's
    free space already counts what the call wrote when the call stops counting."""
    global _libc_handle
    _libc_handle = _libc_handle or ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(view, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # not there (a test's planned disk); its writes reach the host within ~30 s anyway
    try:
        _libc_handle.syncfs(fd)
    finally:
        os.close(fd)


def check_promise(more: int, overcommit: float) -> None:
    """Thin disks: a disk's size is a promise, not space set aside (the guard keeps the
    host safe, call by call). Refuse `more` bytes of promise only past `overcommit`
    times the filesystem's size, the disks' sizes together."""
    size, promised, bound = _promises(overcommit)
    if more + promised > bound:
        raise DiskError(
            f"sandbox.disk: no promise of {more:,} more bytes of disk in {disks_dir()}: its "
            f"{len(_images())} disk(s) have {promised:,} promised, and at most {overcommit:g}× "
            f"its filesystem's {size:,} bytes ({bound:,}) may be (the "
            "ceiling's max.disk_overcommit); lower sandbox.disk, delete the disks of agents you "
            "removed (`wakeloop disk list`, then `wakeloop disk rm`), or give WAKELOOP_DISKS a "
            "bigger filesystem"
        )


def promise_room(overcommit: float = OVERCOMMIT) -> int | None:
    """Bytes of disk this host may still promise (the bound check_promise holds, less what
    its disks promise now): a swarm places an agent only where its disk fits. None: no disks here."""
    try:
        _, promised, bound = _promises(overcommit)
    except OSError:  # no disks' directory: a broker whose agents have no disk
        return None
    return max(bound - promised, 0)


def _promises(overcommit: float) -> tuple[int, int, int]:
    """(the disks' filesystem's size, the bytes its disks promise, the most they may)."""
    st = os.statvfs(disks_dir())
    whole = st.f_blocks * st.f_frsize
    return whole, sum(size for size, _ in _images().values()), int(whole * overcommit)


def _images() -> dict[str, tuple[int, int]]:
    """key -> (size, bytes held on the host) of every image here, those being made included."""
    out = {}
    for image in [*disks_dir().glob("*.img"), *disks_dir().glob("*.partial")]:
        try:
            st = image.stat()
        except FileNotFoundError:
            continue  # released or renamed meanwhile
        out[image.stem] = (st.st_size, st.st_blocks * 512)
    return out
