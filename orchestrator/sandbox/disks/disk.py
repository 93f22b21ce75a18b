"""An agent's workspace on a filesystem of its own, so the kernel bounds its bytes and files.

`sandbox.disk` and `sandbox.files` make a sparse ext4 image per agent
(`mkfs.ext4 -m 0 -N files`), attached to a loop device and given to each box
as a bind of its files/:

- a full workspace is ENOSPC in the box, and the host's free space is
  untouched: `fallocate --keep-size`, sparse files, hard links and
  directories count like anything else, because it is the filesystem's;
- a box names its workspace by a path in $WAKELOOP_DISKS (root's), never by
  a path under ROOT: nothing done to paths under ROOT, at any moment (a pool
  refill included), redirects a box's mount;
- every mount of it is nosuid and nodev; `discard` hands a deleted file's
  blocks back to the host.

The disk's root holds the agent's files in files/, beside mkfs's lost+found
and the harness's .wakeloop/ (layers.py; an older disk, its files at the
root, is arranged so once, on attach). The root is mounted (nosuid, nodev,
noexec) at a path of this process's own, KEY.view in $WAKELOOP_DISKS, where
it reads the workspace (workspace_reads.py) and commits a wake
(wake_layer.py). A box sees only files/: its /workspace is a bind (Disk.mount,
resolved at each container's start) of KEY.box, a folder in $WAKELOOP_DISKS where
files/ is bound (nosuid, nodev) and, while a wake runs, that wake's overlay
is mounted on top (wake_layer.py). Every path the engine resolves is in
$WAKELOOP_DISKS, root's, outside every agent's folder: nothing done to paths
under ROOT redirects a box's mount. Where the engine cannot see this process's
mounts (a broker in a container on a host whose `/` is private), the engine
mounts the disk and each wake's overlay itself, and a box binds files/ from
there (engine_mounts.py). When wakeloop runs the engine itself,
files/ is also bound over the agent's workspace/ (from the noexec view), so a
person sees the files where they always were. Images
live in $WAKELOOP_DISKS (default /var/lib/wakeloop/disks), outside every
agent's folder: a taken-over orchestrator cannot hand the kernel a crafted
filesystem, nor point the loop device at another file.

A disk's name (its key) and its files in $WAKELOOP_DISKS are here, with the
`Disk` a holder has and the holds of this process; each job on a disk has a
module of its own, named below.

Not here: which disk is whose (disk_index.py), attaching, letting go and
releasing (disk_attach.py), the image and its loop device (disk_image.py), the
mounts (disk_mounts.py), the guard that keeps the host's room (disk_room.py),
`wakeloop disk list` (disk_survey.py), when a box closes (engine.py,
keeper.py), the workspace's files (workspace_reads.py).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker
from docker.types import Mount

from orchestrator.sandbox.box import WORKSPACE, SandboxError
from orchestrator.sandbox.disks import engine_mounts, layers

DISKS_ENV = "WAKELOOP_DISKS"
HOST_DISKS_ENV = "WAKELOOP_DISKS_HOST"  # where the host has $WAKELOOP_DISKS (a broker in a container)
DEFAULT_DISKS = Path("/var/lib/wakeloop/disks")

VOLUME_PREFIX = engine_mounts.DISK_PREFIX
LABEL = engine_mounts.DISK_LABEL  # on the engine's volumes and keepers of a disk: its image

TOOL_TIMEOUT_S = 120  # mkfs -d of a large folder; the rest take milliseconds


class DiskError(SandboxError):
    """The workspace's disk cannot be made or attached: one line, with what to do."""


class Hold:
    """One holder of a disk in this process; while any is open the disk is not released."""

    def __init__(self, key: str):
        self.key, self.open = key, True
        with _holds_lock:
            fd, count = _held_here.get(key, (None, 0))
            if fd is None:  # the process's first holder takes the lock other processes see
                fd = os.open(path_of(key, "use"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.lockf(fd, fcntl.LOCK_SH)  # made under the disk's lock: no release has it
            _held_here[key] = (fd, count + 1)
            _holds.add(self)

    def drop(self) -> bool:
        """Let go; False if this holder let go already."""
        with _holds_lock:
            if not self.open:
                return False
            self.open = False
            _holds.discard(self)
            fd, count = _held_here.pop(self.key)
            if count > 1:
                _held_here[self.key] = (fd, count - 1)
            else:
                os.close(fd)  # the process's last holder: its record lock goes with it
        return True


_holds: set[Hold] = set()  # this process's holders, for let_go_all at a command's end

_held_here: dict[str, tuple[int, int]] = {}  # key -> (the locked `use` fd, holders in this process)

_holds_lock = threading.Lock()


def nobody_holds(key: str) -> bool:
    """No holder in this process nor in any other, tested without waiting. A record lock
    is the process's: any fd of the file closed drops it, so the test runs only while this
    process has none, and no holder of it is made meanwhile (_holds_lock)."""
    with _holds_lock:
        if key in _held_here:
            return False
        fd = os.open(path_of(key, "use"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # EAGAIN or EACCES: another process holds it
            return False
        finally:
            os.close(fd)
        return True


@dataclass(frozen=True)
class Disk:
    key: str
    image: Path
    device: str  # /dev/loopN
    view: Path  # where this process has the disk's root mounted (KEY.view): files/, .wakeloop/
    note: str | None = None  # a migration or a size it could not take, for the person
    hold: Hold | None = field(default=None, compare=False, repr=False)  # None: planned, not attached
    engine_root: Path | None = None  # the disk's root where the engine mounts it itself (engine_mounts.py):
    # a broker whose own mounts the engine cannot see; None: the engine binds KEY.box, ours
    engine: docker.DockerClient | None = field(default=None, compare=False, repr=False)  # that engine

    @property
    def volume(self) -> str:
        return VOLUME_PREFIX + self.key

    @property
    def files(self) -> Path:
        """The agent's files, as this process reads them outside a wake."""
        return layers.files(self.view)

    @property
    def box(self) -> Path:
        """What a box's volume binds: files/ bound here, and a running wake's overlay on top."""
        return path_of(self.key, "box")

    def mount(self, wake: str | None = None) -> Mount:
        """The box's one mount, resolved when each container starts, so a box started after a
        wake's begin gets its overlay. Ours: a bind of KEY.box (root's, in $WAKELOOP_DISKS,
        outside ROOT). Not an engine volume of type bind: the engine mounts such a volume once
        and hands that one mount to every container using it, so while a container from before
        the begin lived, new ones got files/ without the overlay (seen on runsc with a warm
        pool). The engine's (engine_mounts.py): the wake's overlay volume while `wake` runs,
        else a bind of files/ where the engine has the disk."""
        if self.engine_root is None:
            return Mount(target=WORKSPACE, source=str(host_box(self.key)), type="bind")
        if wake:
            volume = engine_mounts.wake_volume(self.key, wake)
            return Mount(target=WORKSPACE, source=volume, type="volume", no_copy=True)
        return Mount(target=WORKSPACE, source=str(layers.files(self.engine_root)), type="bind")


def disks_dir(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get(DISKS_ENV) or DEFAULT_DISKS)


def path_of(key: str, kind: str) -> Path:
    """A disk's files in $WAKELOOP_DISKS: `img` (the image), `lock`, `use`, `call` (calls in flight),
    `view` (the root's mount point), `box` (what the box's volume binds), `engine` (the engine
    mounts it: engine_mounts.py)."""
    return disks_dir() / f"{key}.{kind}"


def holding() -> frozenset[Hold]:
    """The holds this process has now (a command's start, to let go only its own at the end)."""
    with _holds_lock:
        return frozenset(_holds)


def host_box(key: str) -> Path:
    """KEY.box as the engine sees it: $WAKELOOP_DISKS_HOST (a broker in a container, whose disks
    folder the host has elsewhere and sees our mounts in: compose with rshared) or ours."""
    where = os.environ.get(HOST_DISKS_ENV)
    return Path(where) / f"{key}.box" if where else path_of(key, "box")


def tool(*argv: str, check: bool = True, pass_fds: tuple[int, ...] = ()) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, pass_fds=pass_fds)
    if check and done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise DiskError(f"sandbox.disk: {argv[0]} failed: {why}")
    return done.stdout


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """One process at a time makes, attaches or mounts a given disk."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
