"""Which disk is whose: an agent folder's identity, and the index that maps it to its disk.

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

Not here: attaching the disk a key names (disk_attach.py), the disks as
`wakeloop disk list` shows them (disk_survey.py).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import re
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

from orchestrator.sandbox.disks.disk import DiskError, disks_dir, locked, path_of

INDEX = "index.json"  # in the disks' directory: which folder each disk belongs to
INDEX_LOCK = "index.lock"  # one process at a time reads-and-writes the index
INDEX_MAX_BYTES = 16 * 2**20  # ~100k disks; a bigger index is not ours


def legacy_key(agent: str, place: Path) -> str:
    """The old name of a disk: the agent's name and the workspace's host path (adopted, see above)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", agent)[:40]
    return f"{name}-{hashlib.sha256(str(place).encode()).hexdigest()[:12]}"


def _new_key(agent: str) -> str:
    """A new disk's name: readable (the agent's name when it was made), never derived from a path."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '-', agent)[:40]}-{secrets.token_hex(6)}"


class IndexEntry(TypedDict, total=False):
    """One disk in the index (read from JSON, so any key may be missing)."""

    ino: int
    kind: str
    mark: int
    dev: int
    agent: str
    folder: str  # where the host last saw it
    adopted: bool


@dataclass(frozen=True)
class Identity:
    """An agent folder as the kernel knows it: no path, no name (see the module's docstring)."""

    ino: int
    kind: str  # "btime" or "generation": which mark this filesystem gives
    mark: int  # the birth time in ns, or the inode's generation
    dev: int  # st_dev, kept for the record (and the broker's same-filesystem check)

    def matches(self, entry: IndexEntry) -> bool:
        return (entry.get("ino"), entry.get("kind"), entry.get("mark")) == (self.ino, self.kind, self.mark)

    def fields(self) -> IndexEntry:
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
        generation: int = struct.unpack("q", fcntl.ioctl(fd, _FS_IOC_GETVERSION, b"\0" * 8))[0]
        return generation
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


def read_index() -> dict[str, IndexEntry]:
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
    # As _write_index wrote them; read with .get and compared with ==, so a hand-edited entry is no harm.
    return {k: cast(IndexEntry, v) for k, v in disks.items() if isinstance(v, dict)} if isinstance(disks, dict) else {}


def _write_index(entries: dict[str, IndexEntry]) -> None:
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
    with locked(disks_dir() / INDEX_LOCK):
        entries = read_index()
        key = next((k for k, e in entries.items() if ident.matches(e)), None)
        adopted = key is None and _adoptable(agent, host_workspace, ident, entries)
        key = key or (legacy_key(agent, host_workspace) if adopted else _new_key(agent))
        entry = entries.get(key, {"agent": agent, **ident.fields(), "adopted": bool(adopted)})
        if entries.get(key) != {**entry, "dev": ident.dev, "folder": str(host_folder)}:
            entries[key] = {**entry, "dev": ident.dev, "folder": str(host_folder)}
            _write_index(entries)
    return key


def _adoptable(agent: str, host_workspace: Path, ident: Identity, entries: dict[str, IndexEntry]) -> bool:
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
    with locked(disks_dir() / INDEX_LOCK):
        entries = read_index()
        if entries.pop(key, None) is not None:
            _write_index(entries)
