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

An existing workspace folder is copied into the new image (`mkfs.ext4 -d`),
once, with a line saying so; the folder's own copy is left as it is, unused.

Which disk is whose: a disk belongs to an agent *folder*, named by the
kernel's identity of that folder: its inode number and the mark set when the
inode is made, its birth time (statx's btime, to the nanosecond) or, where
the filesystem keeps none (ext4 with 128-byte inodes), its generation (ext4
draws it at random for each new inode). The index beside the images
($WAKELOOP_DISKS/index.json, root's, outside agents/) maps identity to disk.
Weighed, and why this one:

- a path or a name (the old design) follows whoever holds the name: a rename
  made a new disk each time (11 from four renames), and a folder made at a
  deleted agent's path got its disk;
- an id kept in the agent's state/: a taken-over orchestrator, which holds
  agents/ read-write, copies one file into another folder and that folder's
  box mounts the other agent's disk;
- the folder's identity: renaming or moving the folder keeps its disk (one
  disk per folder, whatever its name becomes); a folder made anew, even on a
  reused inode (ext4 hands a freed inode back at once), has another birth
  time or generation and gets a disk of its own; and no one without root can
  make a folder claim another's: the inode is the kernel's, a birth time
  cannot be set (utimes does not touch it), the index is not in agents/. What
  the orchestrator can do, give agent X's *name* to agent Y's folder by
  renaming, moves Y's disk with Y's folder: what it could already do with
  the folders themselves. (Where the mark is a generation, the folder's owner
  may set it with FS_IOC_SETVERSION on ext4 without metadata_csum: after
  deleting agent X's folder, and if its inode came back, the orchestrator
  could claim X's old disk, files it could reach until it deleted X.) st_dev
  is recorded but not matched (it may change across boots); the broker
  refuses an agent folder on another filesystem than ROOT (a FUSE folder
  could report any identity);
- a folder copied elsewhere (another filesystem, a restore) is a new
  folder: it gets a new disk, copied from its workspace/; the old image
  stays, shown by `wakeloop disk list` with no folder, until `disk rm`.

Disks named the old way (agent name + a hash of the workspace's host path,
`legacy_key`) are adopted, not renamed: the first time a folder with no disk
in the index is seen at the path its old-style image names, and the folder
is older than the image (it was made from the folder), the index records
that image as the folder's. A folder made later at that path is younger than
the image and gets a disk of its own.

Life cycle: each holder of a disk (a DockerSandbox: a wake, a one-shot
command, a broker's kept box) counts as a holder while it has the disk: in
its process, a count per disk; between processes, a shared POSIX record lock
on `KEY.use`, taken by the process's first holder and dropped by its last.
`release` tests it exclusive, without waiting, and so unmounts, removes the
volume and detaches only a disk nobody holds. A holder lets go (and releases
if it was the last) when it closes: at the end of every one-shot command, a
broker's box after its idle time. The image is kept. Record locks, not
flock: a child forked by any thread (losetup for another agent, a notify
command) shares flock's open file until it execs, so a release right after
the last holder closed found the disk held in 2 of 3 tries under forks in a
loop, and left it mounted; a record lock belongs to the process and is never
inherited by a child.

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

Needs root (losetup, mount) and loop devices. Without them a policy that
sets sandbox.disk is refused in one line; `sandbox.disk: none` runs on a
plain folder with no disk limit, as before. Reading the list needs neither.

Not here: when a box closes (engine.py, broker/server.py), the CLI's
`disk list|release|rm` (cli/disk_commands.py; rendered by views/diskview.py), the
workspace's files (workspace_reads.py), what a wake does with a refused call
(wake/loop.py, notify/outcomes.py).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import struct
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
from docker.types import Mount

from orchestrator.sandbox import disk_holders, engine_mounts, layers
from orchestrator.sandbox.box import WORKSPACE, SandboxError

DISKS_ENV = "WAKELOOP_DISKS"
HOST_DISKS_ENV = "WAKELOOP_DISKS_HOST"  # where the host has $WAKELOOP_DISKS (a broker in a container)
DEFAULT_DISKS = Path("/var/lib/wakeloop/disks")
VOLUME_PREFIX = engine_mounts.DISK_PREFIX
LABEL = engine_mounts.DISK_LABEL  # on the engine's volumes and keepers of a disk: its image
BOX_OPTIONS = "nosuid,nodev"  # KEY.box, files/ bound where the box's volume binds it
VIEW_OPTIONS = "nosuid,nodev,noexec,discard"  # ours: nothing on it runs on the host
TOOLS = ("losetup", "mkfs.ext4", "resize2fs", "mount", "umount")
CAP_SYS_RESOURCE = 24  # linux/capability.h: ext4's online resize asks for it
TOOL_TIMEOUT_S = 120  # mkfs -d of a large folder; the rest take milliseconds
RESERVE = 0.05  # of the disks' filesystem, never left to the calls' worst case
OVERCOMMIT = 10  # the disks' sizes together: at most this many times their
# filesystem's size (the broker's ceiling: max.disk_overcommit)
ROOM_LOCK = "room.lock"  # in the disks' directory: one process at a time claims room
ROOM_WAIT_S = 30.0  # a call waits this long for calls in flight to end (and their
# worst case with them) before it is refused
ROOM_POLL_S = 0.05  # how often it looks meanwhile
INDEX = "index.json"  # in the disks' directory: which folder each disk belongs to
INDEX_LOCK = "index.lock"  # one process at a time reads-and-writes the index
INDEX_MAX_BYTES = 16 * 2**20  # ~100k disks; a bigger index is not ours
DETACH_WAIT_S = 10  # a detached loop device goes when its last opener closes it
# (udev's probe, the engine's unmount): ~0.1-1 s, bounded here
DETACH_POLL_S = 0.02  # how often sysfs is read meanwhile


class DiskError(SandboxError):
    """The workspace's disk cannot be made or attached: one line, with what to do."""


class _Hold:
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


_holds: set[_Hold] = set()  # this process's holders, for let_go_all at a command's end
_held_here: dict[str, tuple[int, int]] = {}  # key -> (the locked `use` fd, holders in this process)
_holds_lock = threading.Lock()


def _nobody_holds(key: str) -> bool:
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
    hold: _Hold | None = field(default=None, compare=False, repr=False)  # None: planned, not attached
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


def disks_dir(environ=os.environ) -> Path:
    return Path(environ.get(DISKS_ENV) or DEFAULT_DISKS)


def path_of(key: str, kind: str) -> Path:
    """A disk's files in $WAKELOOP_DISKS: `img` (the image), `lock`, `use`, `call` (calls in flight),
    `view` (the root's mount point), `box` (what the box's volume binds), `engine` (the engine
    mounts it: engine_mounts.py)."""
    return disks_dir() / f"{key}.{kind}"


def legacy_key(agent: str, place: Path) -> str:
    """The old name of a disk: the agent's name and the workspace's host path (adopted, see above)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", agent)[:40]
    return f"{name}-{hashlib.sha256(str(place).encode()).hexdigest()[:12]}"


def _new_key(agent: str) -> str:
    """A new disk's name: readable (the agent's name when it was made), never derived from a path."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '-', agent)[:40]}-{secrets.token_hex(6)}"


# -- whose disk: the folder's identity, the index ---------------------------------------


@dataclass(frozen=True)
class Identity:
    """An agent folder as the kernel knows it: no path, no name (see the module's docstring)."""

    ino: int
    kind: str  # "btime" or "generation": which mark this filesystem gives
    mark: int  # the birth time in ns, or the inode's generation
    dev: int  # st_dev, kept for the record (and the broker's same-filesystem check)

    def matches(self, entry: dict) -> bool:
        return (entry.get("ino"), entry.get("kind"), entry.get("mark")) == (self.ino, self.kind, self.mark)

    def fields(self) -> dict:
        return {"ino": self.ino, "kind": self.kind, "mark": self.mark}


_AT_EMPTY_PATH = 0x1000
_STATX_INO = 0x100
_STATX_BTIME = 0x800
_STATX_BUFFER = 256  # sizeof(struct statx)
_FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long): the inode's generation
_libc_handle = None


def _statx(fd: int) -> tuple[int, int, int]:
    """(the mask statx filled, inode, birth time in ns) of an open file."""
    global _libc_handle
    _libc_handle = _libc_handle or ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(_STATX_BUFFER)
    if _libc_handle.statx(fd, b"", _AT_EMPTY_PATH, _STATX_INO | _STATX_BTIME, buf) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    (mask,), (ino,) = struct.unpack_from("I", buf, 0), struct.unpack_from("Q", buf, 32)
    sec, nsec = struct.unpack_from("qI", buf, 80)  # stx_btime: tv_sec, tv_nsec
    return mask, ino, (sec * 10**9 + nsec) if mask & _STATX_BTIME else 0


def _generation(fd: int) -> int:
    """The inode's generation (ext4: random when the inode is made), or 0 if none is given."""
    try:
        return struct.unpack("q", fcntl.ioctl(fd, _FS_IOC_GETVERSION, b"\0" * 8))[0]
    except OSError:
        return 0


def identity_of(folder: Path, *, within: Path | None = None) -> Identity:
    """The agent folder's identity; never through a link. Its inode, and the birth time
    where the filesystem records one (set when the inode is made; nothing sets it
    later), else the inode's generation (ext4 with small inodes: a random number drawn
    when the inode is made). `within` (the broker's ROOT): the folder must be on ROOT's
    own filesystem, not something mounted there (a FUSE folder reports what it likes)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise DiskError(
            f"sandbox.disk: the agent folder {folder} is not a real folder "
            f"({exc.strerror}); a disk belongs to a folder, never to a link"
        ) from None
    try:
        _, ino, born = _statx(fd)
        generation = 0 if born else _generation(fd)
        dev = os.fstat(fd).st_dev
    finally:
        os.close(fd)
    if within is not None and os.stat(within).st_dev != dev:
        raise DiskError(
            f"sandbox.disk: the agent folder {folder} is a mount point, not a folder "
            f"of {within}'s own filesystem; the broker gives disks only to folders of ROOT"
        )
    if not born and not generation:
        raise DiskError(
            f"sandbox.disk: the filesystem of {folder} gives a folder neither a birth time "
            "nor a generation, by which wakeloop tells one agent's disk from another's; "
            "keep the agents on ext4, xfs or btrfs, or set `sandbox.disk: none`"
        )
    return Identity(ino, "btime", born, dev) if born else Identity(ino, "generation", generation, dev)


def _born_ns(path: Path) -> int:
    """The birth time of a file in ns, or 0 if its filesystem keeps none."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return _statx(fd)[2]
    finally:
        os.close(fd)


def read_index() -> dict[str, dict]:
    """Every disk the index knows: key -> {ino, kind, mark, dev, agent, folder (last seen), adopted}."""
    path = disks_dir() / INDEX
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read(INDEX_MAX_BYTES + 1)
        if len(raw) > INDEX_MAX_BYTES:
            raise ValueError(f"over {INDEX_MAX_BYTES:,} bytes")
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise DiskError(
            f"sandbox.disk: {path} is not the index wakeloop writes ({exc}); move it "
            "aside, and `wakeloop disk list` shows the images it named"
        ) from None
    disks = data.get("disks") if isinstance(data, dict) else None
    return {k: v for k, v in disks.items() if isinstance(v, dict)} if isinstance(disks, dict) else {}


def _write_index(entries: dict[str, dict]) -> None:
    path = disks_dir() / INDEX
    partial = path.with_suffix(".partial-index")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"disks": entries}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def lookup(folder: Path) -> str | None:
    """The key of `folder`'s disk if the index has one (reads only; None on any doubt)."""
    try:
        ident = identity_of(folder)
        return next((k for k, e in read_index().items() if ident.matches(e)), None)
    except (DiskError, OSError):
        return None


def claim(
    folder: Path,
    *,
    agent: str,
    host_workspace: Path,
    host_folder: Path,
    within: Path | None = None,
    identity: Identity | None = None,
) -> str:
    """The key of `folder`'s disk: the one the index has for its identity, else an old-style
    image it adopts, else a new key; recorded (with where the folder was last seen).
    `identity`: the folder's as the caller already took it (the broker, which keys its
    kept box by it: read once, so a folder swapped meanwhile cannot split the two)."""
    ident = identity or identity_of(folder, within=within)
    disks_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    with _locked(disks_dir() / INDEX_LOCK):
        entries = read_index()
        key = next((k for k, e in entries.items() if ident.matches(e)), None)
        adopted = key is None and _adoptable(agent, host_workspace, ident, entries)
        key = key or (legacy_key(agent, host_workspace) if adopted else _new_key(agent))
        entry = entries.get(key, {"agent": agent, **ident.fields(), "adopted": bool(adopted)})
        if entries.get(key) != {**entry, "dev": ident.dev, "folder": str(host_folder)}:
            entries[key] = {**entry, "dev": ident.dev, "folder": str(host_folder)}
            _write_index(entries)
    return key


def _adoptable(agent: str, host_workspace: Path, ident: Identity, entries: dict) -> bool:
    """An image named the old way for this agent's name and path, no folder's yet, and
    (where both birth times are known) younger than the folder, which it was made from:
    a folder made later at that path is not the one the image was made for."""
    key = legacy_key(agent, host_workspace)
    if key in entries:
        return False
    try:
        image_born = _born_ns(path_of(key, "img"))
    except OSError:
        return False  # no such image
    return ident.kind != "btime" or not image_born or ident.mark <= image_born


def forget(key: str) -> None:
    """Take a deleted disk out of the index."""
    with _locked(disks_dir() / INDEX_LOCK):
        entries = read_index()
        if entries.pop(key, None) is not None:
            _write_index(entries)


# -- attach, let go, release ---------------------------------------------------------------


def unavailable() -> str | None:
    """Why this process cannot attach a disk on this host, or None."""
    if os.geteuid() != 0:
        return "attaching a workspace disk needs root (losetup and mount)"
    if not os.path.exists("/dev/loop-control"):
        return "this host has no loop devices (/dev/loop-control is missing)"
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not found (Debian: e2fsprogs, mount)"
    return None


def refusal(reason: str) -> DiskError:
    """The one line a person gets where a disk cannot be attached: why, and the three ways on."""
    return DiskError(
        f"sandbox.disk: {reason}; run wakeloop as root or through the broker "
        "(`docker compose up`), or set `sandbox.disk: none` in the policy for a "
        "workspace with no disk limit"
    )


def require() -> None:
    """Refuse (one line) before anything in $WAKELOOP_DISKS is touched where this process
    cannot attach a disk: a user in the docker group who is not root reaches the engine
    but not root's index.lock, and would otherwise meet a PermissionError there."""
    reason = unavailable()
    if reason:
        raise refusal(reason)


def attach(
    client: docker.DockerClient,
    *,
    key: str,
    size: int,
    files: int,
    seed: Path,
    person: Path | None = None,
    overcommit: float = OVERCOMMIT,
    engine_mounts_in: str | None = None,
) -> Disk:
    """The agent's disk, made if it is new (from `seed`, the workspace folder as it
    is), attached, its root mounted at KEY.view and arranged (layers.py), its files/
    bound at KEY.box, and (`person`: the agent's workspace/ when wakeloop runs the
    engine itself) bound there; held (its `use` lock, shared) until let_go. Made or
    grown only while the disks' sizes together stay within `overcommit` times their
    filesystem. `engine_mounts_in` (an image; a broker whose mounts the engine cannot
    see): the engine mounts the disk itself, kept by a container of that image
    (engine_mounts.py), and KEY.box stays empty."""
    require()
    disks_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    image = path_of(key, "img")
    with _locked(path_of(key, "lock")):
        hold = _Hold(key)  # first: a release waiting for this lock then finds the disk held
        try:
            note = None
            if not image.exists():
                note = _create(image, size, files, seed, overcommit)
            device = _loop(image)
            note = _grow(image, device, size, overcommit) or note
            view = path_of(key, "view")
            _mount_view(device, view)
            try:
                moved = layers.arrange(view)  # a new disk is made so here: only an old one's move is news
                note = note or moved
            except OSError as exc:
                raise DiskError(
                    f"sandbox.disk: cannot arrange the disk {image} (files/ beside .wakeloop/): {exc}"
                ) from None
            engine_root = None
            if engine_mounts_in:
                path_of(key, "box").mkdir(mode=0o700, exist_ok=True)  # where a wake's reads mount (wake_layer)
                path_of(key, "engine").touch(mode=0o600)  # first: a release then drops what keep made
                try:
                    engine_root = engine_mounts.keep(client, key, device, image, engine_mounts_in)
                except engine_mounts.EngineMountError as exc:
                    raise DiskError(str(exc)) from None
            else:
                _no_device_volume(client, key)
                _bind_box(layers.files(view), path_of(key, "box"))
            if person is not None:
                _mount_view(device, person, source=layers.files(view))
        except BaseException:
            hold.drop()
            raise
    return Disk(key, image, device, view, note, hold, engine_root, client if engine_root else None)


def let_go(client: docker.DockerClient, held: Disk) -> str | None:
    """This holder is done with the disk: release it if nobody else holds it. Never raises
    (it runs at the end of a command, whatever ended it): the reason it could not, or None."""
    if held.hold is None:
        return None
    _settler.wait(held.key)
    if not held.hold.drop():
        return None
    try:
        release(client, held.key)
    except (SandboxError, docker.errors.DockerException, OSError) as exc:
        return f"could not release the disk {held.image}: {exc}; `wakeloop disk release` retries"
    return None


def holding() -> frozenset:
    """The holds this process has now (a command's start, to let go only its own at the end)."""
    with _holds_lock:
        return frozenset(_holds)


def let_go_all(client: docker.DockerClient, kept: frozenset = frozenset()) -> list[str]:
    """Every disk this process still holds but those in `kept` (a command's end, whatever
    ended it): let go, each released if nobody else holds it."""
    with _holds_lock:
        left = [hold for hold in _holds if hold not in kept]
    problems = []
    for hold in left:
        _settler.wait(hold.key)
        if hold.drop():
            try:
                release(client, hold.key)
            except (SandboxError, docker.errors.DockerException, OSError) as exc:
                problems.append(f"could not release the disk {path_of(hold.key, 'img')}: {exc}")
    return problems


def release(client: docker.DockerClient, key: str, *, delete: bool = False, force: bool = False) -> bool:
    """Unmount the disk everywhere this process sees it, remove its volume, detach
    its loop device; with `delete`, the image too (its files are gone). Only a disk
    nobody holds (False, nothing done, while a wake or a box has it), unless `force`
    (the tests' own cleanup of what a test left)."""
    image = path_of(key, "img")
    if not disks_dir().is_dir():
        return True
    _settler.wait(key)  # its syncfs holds the mount open: an unmount beside it fails EBUSY (a forced release too)
    with _locked(path_of(key, "lock")):
        # A holder is made only under this lock (attach): none can appear until it is let go.
        if not _nobody_holds(key) and not force:
            return False
        _detach(client, key, image)
        if delete:
            image.unlink(missing_ok=True)
            for kind in ("view", "box"):  # mount points, empty once unmounted
                if path_of(key, kind).is_dir():
                    path_of(key, kind).rmdir()
            forget(key)
    if delete:  # the lock files last: nobody waits on them now
        for kind in ("use", "call", "engine", "lock"):
            path_of(key, kind).unlink(missing_ok=True)
    return True


def held(key: str) -> bool:
    """Whether a wake, a one-shot command or a broker's box holds this disk now."""
    if not path_of(key, "use").exists():
        return False
    return not _nobody_holds(key)


def _detach(client: docker.DockerClient, key: str, image: Path) -> None:
    _unmount_box(key)  # a wake's overlay over KEY.box first: it holds the disk
    for device in _devices_of(image):
        rdev = os.stat(device).st_rdev
        for target in _mounts_of(device):
            # umount takes a path and removes the mount on top there: never another disk's.
            if os.stat(target).st_dev != rdev:
                raise DiskError(
                    f"sandbox.disk: {image} is mounted at {target} beneath another mount; release that one first"
                )
            _tool("umount", target)
    try:
        _no_device_volume(client, key, strict=True)  # first: the engine's mounts of the device, if any
    except (docker.errors.DockerException, engine_mounts.EngineMountError) as exc:
        raise DiskError(f"sandbox.disk: cannot drop the engine's mounts of {image}: {exc}") from None
    devices = _devices_of(image)
    for device in devices:
        # Not checked: a device still open (udev's probe, the engine's last unmount) is
        # detached when it closes, and one another release detached first is gone.
        _tool("losetup", "-d", device, check=False)
    deadline = time.monotonic() + DETACH_WAIT_S
    while any(_loops().get(device) == str(image) for device in devices):
        if time.monotonic() > deadline:  # released means gone: its last writes are in the image
            raise DiskError(
                f"sandbox.disk: {', '.join(devices)} still open {DETACH_WAIT_S:g} s after "
                f"detaching ({_who_holds(devices)}); it goes when that closes it"
            )
        time.sleep(DETACH_POLL_S)


def _who_holds(devices: list[str]) -> str:
    """Another mount namespace's copy of a mount (a lab's node, `unshare -m`), named with the way out."""
    found = disk_holders.holders(devices)
    if not found:
        return "by another process?"
    return "; ".join(f"{h.describe()}: `{h.release()}` lets go" for h in found)


def keys() -> set[str]:
    """Every disk in $WAKELOOP_DISKS, attached or not."""
    return {image.stem for image in disks_dir().glob("*.img")}


def devices(key: str) -> list[str]:
    """The loop devices backed by this disk's image now, one on its way out (detached, still open) too."""
    image = str(path_of(key, "img"))
    return sorted(device for device, backing in _loops().items() if backing == image)


def usage(key: str) -> tuple[int, int] | None:
    """(bytes the image holds on the host, the disk's size), or None if it has none."""
    try:
        st = path_of(key, "img").stat()
    except OSError:
        return None
    return st.st_blocks * 512, st.st_size


# -- the guard: a call starts only with room for the worst case of every call in flight ------


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
    flying = {key} | {k for k in called if k != key and _in_flight(k, where)}
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
def flight(key: str, view: Path | None = None, wait_s: float = ROOM_WAIT_S):
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
        with _locked(disks_dir() / ROOM_LOCK):  # the check and the mark, one process at a time
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
    never inherited by a child (see _Hold)."""
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


def _in_flight(key: str, where: str | None = None) -> bool:
    """A call of `key`'s disk in flight in this process or any other, tested without
    waiting (under ROOM_LOCK: no mark is made meanwhile). As _nobody_holds: only while
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

    def __init__(self):
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


# -- what is there: `wakeloop disk list` ---------------------------------------------------


@dataclass(frozen=True)
class DiskRecord:
    """One image in $WAKELOOP_DISKS, as `disk list` shows it."""

    key: str
    image: Path
    folder: str | None  # the agent folder it belongs to (found under ROOT, or last seen)
    folder_found: bool  # the folder was found (under ROOT) by its identity just now
    adopted: bool  # named the old way and adopted by its folder
    size: int  # bytes promised: the disk's size
    host_bytes: int  # bytes the sparse image holds on the host
    devices: tuple[str, ...]  # loop devices backed by it: attached if any
    mounts: tuple[str, ...]  # where those are mounted (in this namespace)
    held: bool | None  # a wake or a box holds it now (None: cannot tell without root)
    in_flight: bool | None = None  # a call of it runs now (None: cannot tell without root)


@dataclass(frozen=True)
class Filesystem:
    """The filesystem that holds the disks, as `disk list` shows it."""

    size: int
    free: int  # f_bavail: what the disks may still take, the reserve included
    reserve: int  # RESERVE of it, left out of every call's room


def filesystem() -> Filesystem:
    st = os.statvfs(disks_dir())
    return Filesystem(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, int(st.f_blocks * st.f_frsize * RESERVE))


def survey(root: Path | None = None) -> list[DiskRecord]:
    """Every disk image, with its folder and whether it is attached. Reads only: no
    root needed beyond reading $WAKELOOP_DISKS (sysfs and mountinfo are world-readable)."""
    index = read_index()
    found = _folders_under(root, index) if root else {}
    loops = _loops()
    records = []
    for image in sorted(disks_dir().glob("*.img")):
        key, st = image.stem, image.stat()
        entry = index.get(key, {})
        devices = tuple(sorted(dev for dev, backing in loops.items() if backing == str(image)))
        try:
            holding = held(key) if os.access(disks_dir(), os.W_OK) else None
            flying = _in_flight(key) if os.access(disks_dir(), os.W_OK) else None
        except OSError:
            holding = flying = None
        records.append(
            DiskRecord(
                key,
                image,
                str(found[key]) if key in found else entry.get("folder"),
                key in found,
                bool(entry.get("adopted")),
                st.st_size,
                st.st_blocks * 512,
                devices,
                tuple(t for dev in devices for t in _mounts_of(dev)),
                holding,
                flying,
            )
        )
    return records


def _folders_under(root: Path, index: dict[str, dict]) -> dict[str, Path]:
    """key -> the folder directly under ROOT that has that disk's identity."""
    out = {}
    for child in sorted(Path(root).iterdir()):
        try:
            if not child.is_dir() or child.is_symlink():
                continue
            ident = identity_of(child)
        except (DiskError, OSError):
            continue
        key = next((k for k, e in index.items() if ident.matches(e)), None)
        if key:
            out[key] = child.resolve()
    return out


def _loops() -> dict[str, str]:
    """/dev/loopN -> the file backing it, from sysfs (readable without root)."""
    out = {}
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            out["/dev/" + backing.parent.parent.name] = backing.read_text().strip()
        except OSError:
            continue
    return out


# -- the steps ------------------------------------------------------------------------


def _create(image: Path, size: int, files: int, seed: Path, overcommit: float) -> str | None:
    """A sparse image holding a copy of `seed`; -m 0: no blocks kept back for root.
    mkfs writes it as a call would: only with room for its worst case (the guard)."""
    fd = os.open(seed, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # never a symlinked folder
    partial = image.with_suffix(".partial")
    try:
        st = os.fstat(fd)
        entries = os.listdir(fd)
        with _locked(disks_dir() / ROOM_LOCK):  # the check and the claim, one process at a time
            _check_promise(size, overcommit)
            with open(partial, "wb") as f:
                f.truncate(size)
        options = f"nodiscard,lazy_itable_init=1,lazy_journal_init=1,root_owner={st.st_uid}:{st.st_gid}"
        with flight(image.stem):  # mkfs fsyncs what it wrote before it exits: nothing left to settle
            done = subprocess.run(
                [
                    "mkfs.ext4",
                    "-q",
                    "-F",
                    "-m",
                    "0",
                    "-N",
                    str(files),
                    "-E",
                    options,
                    "-d",
                    f"/proc/self/fd/{fd}",
                    str(partial),
                ],
                pass_fds=(fd,),
                capture_output=True,
                text=True,
                timeout=TOOL_TIMEOUT_S,
            )
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        why = (done.stderr.strip().splitlines() or ["mkfs.ext4 failed"])[-1]
        raise DiskError(
            f"sandbox.disk: cannot make the workspace's disk from {seed} ({size:,} bytes, {files:,} files): {why}"
        )
    partial.chmod(0o600)
    partial.rename(image)
    # The folder's own copy stays where it is (beneath the disk's mount, when that is
    # over it): never deleted by us, and no longer used.
    return (
        (
            f"copied {len(entries)} entries of {seed} into the agent's new disk {image}; the folder's "
            "own copy is no longer used (beneath the disk's mount if it is mounted there)"
        )
        if entries
        else None
    )


def _check_promise(more: int, overcommit: float) -> None:
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
    """Bytes of disk this host may still promise (the bound _check_promise holds, less what
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


def _loop(image: Path) -> str:
    """The loop device of `image`: the one it has, or a free one (--nooverlap)."""
    return _tool("losetup", "--nooverlap", "--find", "--show", str(image)).strip()


def _grow(image: Path, device: str, size: int, overcommit: float) -> str | None:
    """A policy that asks for more: grow the mounted filesystem in place (ext4's online
    resize, which needs CAP_SYS_RESOURCE). Less, or no such capability: say so."""
    have = image.stat().st_size
    anew = f"to make it anew, stop the agent, copy its files out and remove {image}"
    if size < have:
        return f"sandbox.disk asks for {size:,} bytes but the disk has {have:,}; a disk does not shrink: {anew}"
    if size > have and not _capable(CAP_SYS_RESOURCE):
        return (
            f"sandbox.disk asks for {size:,} bytes but the disk has {have:,}: growing a disk in use "
            f"needs CAP_SYS_RESOURCE, which this process lacks; {anew}"
        )
    if size > have:
        with _locked(disks_dir() / ROOM_LOCK):
            _check_promise(size - have, overcommit)
            os.truncate(image, size)
        _tool("losetup", "--set-capacity", device)
        _tool("resize2fs", device)
    return None


def _capable(cap: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def host_box(key: str) -> Path:
    """KEY.box as the engine sees it: $WAKELOOP_DISKS_HOST (a broker in a container, whose disks
    folder the host has elsewhere and sees our mounts in: compose with rshared) or ours."""
    where = os.environ.get(HOST_DISKS_ENV)
    return Path(where) / f"{key}.box" if where else path_of(key, "box")


def _no_device_volume(client: docker.DockerClient, key: str, strict: bool = False) -> None:
    """The engine's volume of the device gone: an older wakeloop's (its boxes mounted the disk's
    root by it), or, where KEY.engine says the engine mounted this disk (engine_mounts.py), that
    and its keeper and wakes' volumes. One API call when it never did: this runs at every attach.
    Not `strict`: one still in use (by a container of an older wakeloop) stays, unused from now on."""
    marker = path_of(key, "engine")
    try:
        if marker.exists():
            engine_mounts.let_go(client, key)
            marker.unlink()
        else:
            client.api.remove_volume(VOLUME_PREFIX + key, force=True)
    except docker.errors.NotFound:
        pass
    except (docker.errors.DockerException, engine_mounts.EngineMountError):
        if strict:
            raise


def _bind_box(files: Path, box: Path) -> None:
    """files/ bound at KEY.box, nosuid and nodev but not noexec (the box runs what the agent
    wrote), unless something is mounted there already (another holder's bind, or a running
    wake's overlay over it). Both paths are in $WAKELOOP_DISKS, root's: named by path."""
    box.mkdir(mode=0o700, exist_ok=True)
    if not _mount_point(box):
        _tool("mount", "--no-canonicalize", "--bind", "-o", BOX_OPTIONS, str(files), str(box))


def _mount_point(path: Path) -> bool:
    return os.stat(path).st_dev != os.stat(path.parent).st_dev


def unmount_wake(held: Disk) -> bool:
    """A wake's overlay gone from where boxes get it: unmounted from KEY.box, or (the engine's
    mounts) its volume dropped with every container that uses it. True if there was one."""
    if held.engine_root is None or held.engine is None:
        return _unmount_box(held.key)
    try:
        return engine_mounts.drop_wake(held.engine, held.key)
    except (engine_mounts.EngineMountError, docker.errors.DockerException) as exc:
        raise DiskError(str(exc)) from None


def _unmount_box(key: str) -> bool:
    if not wake_mounted(key):
        return False
    _tool("umount", str(path_of(key, "box")))
    return True


def wake_mounted(key: str) -> bool:
    """Whether a wake's overlay is mounted over KEY.box, as this process sees the mounts."""
    box = str(path_of(key, "box"))
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        cut = fields.index("-")
        if fields[4].encode().decode("unicode_escape") == box and fields[cut + 1] == "overlay":
            return True
    return False


def _mount_view(device: str, view: Path, source: Path | None = None) -> None:
    """Mount at the folder `view` names now, never at a path: whoever may write the agent
    folder could swap workspace/ for a link between a check and mount(8), which follows
    links in its target (root's disk on /etc/profile.d). So the folder is opened first,
    without following a link, and the mount goes on that open folder (/proc/self/fd/N in
    mount's own process, not canonicalized). `source`: a folder of the device's view
    (files/), bound there; it keeps the view's nosuid, nodev and noexec."""
    view.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(view, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise DiskError(
            f"sandbox.disk: {view} is not a folder wakeloop can mount on ({exc.strerror}); "
            "a disk is mounted only over a real folder, never through a link"
        ) from None
    try:
        if os.fstat(fd).st_dev == os.stat(device).st_rdev:
            return  # mounted there already
        if source is not None:
            _tool("mount", "--no-canonicalize", "--bind", str(source), f"/proc/self/fd/{fd}", pass_fds=(fd,))
            return
        _tool(
            "mount",
            "--no-canonicalize",
            "-t",
            "ext4",
            "-o",
            VIEW_OPTIONS,
            device,
            f"/proc/self/fd/{fd}",
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)


def _devices_of(image: Path) -> list[str]:
    out = _tool("losetup", "--noheadings", "--output", "NAME", "--associated", str(image), check=False)
    return [line.strip() for line in out.splitlines() if line.strip()]


def _mounts_of(device: str) -> list[str]:
    """Where `device` is mounted in this process's namespace, deepest first."""
    rdev = os.stat(device).st_rdev
    wanted = f"{os.major(rdev)}:{os.minor(rdev)}"
    targets = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[2] == wanted:
            targets.append(fields[4].encode().decode("unicode_escape"))
    return sorted(targets, key=len, reverse=True)


def _tool(*argv: str, check: bool = True, pass_fds: tuple[int, ...] = ()) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, pass_fds=pass_fds)
    if check and done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise DiskError(f"sandbox.disk: {argv[0]} failed: {why}")
    return done.stdout


@contextmanager
def _locked(path: Path):
    """One process at a time makes, attaches or mounts a given disk."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
