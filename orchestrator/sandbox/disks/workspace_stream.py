"""A workspace as a stream of bytes and back: how an agent's disk moves from one node to another.

`pack` writes the files/ of a disk (the agent's files: not mkfs's lost+found,
not the harness's .wakeloop/ undo history) as a tar stream; `unpack` writes
such a stream into the files/ of a new disk; `digest` names a tree by what a
box would see in it, so the two ends can show they hold the same workspace.

Both ends walk by directory descriptors and open every name with O_NOFOLLOW
relative to its parent's descriptor, so no link in the tree, and no link
swapped in while it is walked, takes the broker (root) anywhere outside it.
The sender reads only files, folders and links; the receiver treats the
stream as hostile (a taken-over orchestrator relays it, and could send
anything): a name that is absolute, empty or has `..` or `.` in it, a member
that is not a file, folder or link (a device, a fifo, a hard link), a name
seen twice, or a parent that is not a folder made earlier in the stream
refuses the whole stream. Modes keep their permission bits only (no set-id,
no sticky). Owners cross only as far as they take nothing from the agent's
files: an entry stays root's (an operator's folder, read-only to the box) or
the disk's owner's (the box's user); any other owner a stream names becomes
the disk's owner. Times cross as they were (folders' set once what is in them
has landed). A link's target is
written as given and never followed here; in a box it resolves inside the
box, as any link the agent makes.

Not here: the wire that carries the stream (broker/wire.py), who sends and
receives it (broker/server.py), the move itself (broker/nodes.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

CHUNK = 256 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = {tarfile.DIRTYPE: "dir", tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.SYMTYPE: "link"}


class Reads(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class Writes(Protocol):
    def write(self, data: bytes, /) -> int: ...


class StreamRefused(ValueError):
    """A stream that is not a workspace as `pack` writes one: one line, nothing more is written."""


@dataclass(frozen=True)
class Entry:
    """One name in the tree, as a walk finds it."""

    path: str  # relative, "/"-separated
    kind: str  # "dir" | "file" | "link"
    mode: int  # permission bits only
    mtime_ns: int
    target: str = ""  # a link's
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class Summary:
    """What one end holds: the digest of its tree and how many entries."""

    digest: str
    entries: int


# -- the walk both ends share --------------------------------------------------------------


def _walk(dir_fd: int, prefix: str = "") -> Iterator[tuple[Entry, int]]:
    """Each entry under the folder `dir_fd`, parents first, names sorted; with its parent's fd.
    Sockets and fifos (a box can make them) are skipped: they hold no data to move."""
    with os.scandir(dir_fd) as listing:
        names = sorted(e.name for e in listing)
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        path = prefix + name
        mode, uid, gid = stat.S_IMODE(st.st_mode) & 0o777, st.st_uid, st.st_gid
        if stat.S_ISDIR(st.st_mode):
            yield Entry(path, "dir", mode, st.st_mtime_ns, uid=uid, gid=gid), dir_fd
            child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            try:
                yield from _walk(child, path + "/")
            finally:
                os.close(child)
        elif stat.S_ISREG(st.st_mode):
            yield Entry(path, "file", mode, st.st_mtime_ns, uid=uid, gid=gid), dir_fd
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=dir_fd)
            yield Entry(path, "link", 0o777, st.st_mtime_ns, target, uid, gid), dir_fd


def _open_file(dir_fd: int, entry: Entry) -> int:
    return os.open(entry.path.rsplit("/", 1)[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _line(entry: Entry, content: str) -> bytes:
    """One entry's line in the digest: what a box sees (kind, permission bits, name, bytes or target)."""
    return f"{entry.kind} {entry.mode:o} {entry.path}\0{content}\n".encode("utf-8", "surrogateescape")


def _root_fd(root: Path) -> int:
    return os.open(root, _DIR_FLAGS)


def digest(root: Path) -> Summary:
    """The tree under `root` as one sha256: `pack`'s, into nothing, so the two cannot differ."""
    return pack(root, _Discard())


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


class _Counted:
    """A file object over another's fd that hashes what it hands out: the digest comes from the
    same bytes the stream carries, read once."""

    def __init__(self, fd: int):
        self.fd, self.sha = fd, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = os.read(self.fd, n if n > 0 else CHUNK)
        self.sha.update(data)
        return data


def pack(root: Path, out: Writes) -> Summary:
    """Write the tree under `root` to `out` as a tar stream; its Summary (`digest`'s too).
    A file that changes size while it is read fails the stream (tarfile's own check)."""
    total, count = hashlib.sha256(), 0
    fd = _root_fd(root)
    try:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:  # type: ignore[call-overload]
            for entry, parent in _walk(fd):
                count += 1
                info = tarfile.TarInfo(entry.path)
                info.mode, info.mtime, info.uid, info.gid = entry.mode, entry.mtime_ns / 1e9, entry.uid, entry.gid
                info.type = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "link": tarfile.SYMTYPE}[entry.kind]
                if entry.kind != "file":
                    info.linkname = entry.target
                    tar.addfile(info)
                    total.update(_line(entry, entry.target))
                    continue
                f = _open_file(parent, entry)
                try:
                    info.size = os.fstat(f).st_size
                    counted = _Counted(f)
                    tar.addfile(info, counted)
                    total.update(_line(entry, counted.sha.hexdigest()))
                finally:
                    os.close(f)
    finally:
        os.close(fd)
    return Summary(total.hexdigest(), count)


# -- the receiving end ---------------------------------------------------------------------


def clear(root: Path) -> None:
    """Remove everything under `root`, which stays (shutil.rmtree's fd-based walk follows no link)."""
    fd = _root_fd(root)
    try:
        with os.scandir(fd) as listing:
            names = [e.name for e in listing]
        for name in names:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def unpack(stream: Reads, root: Path) -> Summary:
    """Write a stream `pack` made into the empty folder `root`, owned as `root` is; its Summary
    (digest's, read back from what was written). StreamRefused: one line; what was written stays
    for the caller to clear."""
    st = os.stat(root, follow_symlinks=False)
    disk_owner = (st.st_uid, st.st_gid)
    fd = _root_fd(root)
    folders: list[tuple[list[str], int]] = []  # each folder's parts and mtime: set once its contents landed
    try:
        try:
            with tarfile.open(fileobj=stream, mode="r|", encoding="utf-8") as tar:  # type: ignore[call-overload]
                for member in tar:
                    _write(tar, member, fd, _owner(member, disk_owner))
                    if member.isdir():
                        folders.append((_parts(member.name), int(member.mtime * 1e9)))
        except tarfile.TarError as exc:
            raise StreamRefused(f"not a workspace's tar stream: {exc}") from None
        for parts, mtime in reversed(folders):  # deepest last in the stream: first here
            parent = _parent(fd, parts)
            try:
                os.utime(parts[-1], ns=(mtime, mtime), dir_fd=parent, follow_symlinks=False)
            finally:
                os.close(parent)
    finally:
        os.close(fd)
    return digest(root)


def _owner(member: tarfile.TarInfo, disk_owner: tuple[int, int]) -> tuple[int, int]:
    """Root's or the disk owner's id as the stream says; any other, the disk owner's."""
    uid = member.uid if member.uid in (0, disk_owner[0]) else disk_owner[0]
    gid = member.gid if member.gid in (0, disk_owner[1]) else disk_owner[1]
    return uid, gid


def _parts(name: str) -> list[str]:
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StreamRefused(f"the stream names {name!r:.200}: a workspace's names are relative, without . or ..")
    return parts


def _parent(root_fd: int, parts: list[str]) -> int:
    """The fd of the folder holding parts[-1], each step a folder (O_NOFOLLOW: a link is refused)."""
    fd = os.dup(root_fd)
    for part in parts[:-1]:
        try:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            os.close(fd)
            raise StreamRefused(
                f"the stream puts {'/'.join(parts)!r:.200} under {part!r:.80}, not a folder it made before"
            ) from None
        os.close(fd)
        fd = child
    return fd


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, root_fd: int, owner: tuple[int, int]) -> None:
    kind = _KINDS.get(member.type)
    if kind is None:
        raise StreamRefused(
            f"the stream holds {member.name!r:.200} of tar type {member.type!r}: not a file, folder or link"
        )
    parts = _parts(member.name)
    parent = _parent(root_fd, parts)
    name, mode = parts[-1], stat.S_IMODE(member.mode) & 0o777
    try:
        if kind == "dir":
            os.mkdir(name, 0o700, dir_fd=parent)
            os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)
            os.chmod(name, mode, dir_fd=parent, follow_symlinks=False)
        elif kind == "link":
            os.symlink(member.linkname, name, dir_fd=parent)
            os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)
        else:
            _write_file(tar, member, parent, name, mode, owner)
        if kind != "dir":
            mtime = int(member.mtime * 1e9)
            os.utime(name, ns=(mtime, mtime), dir_fd=parent, follow_symlinks=False)
    except FileExistsError:
        raise StreamRefused(f"the stream names {member.name!r:.200} twice") from None
    finally:
        os.close(parent)


def _write_file(
    tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, name: str, mode: int, owner: tuple[int, int]
) -> None:
    f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
    try:
        source = tar.extractfile(member)
        assert source is not None  # a regular member always has one
        with open(f, "wb", closefd=False) as out:
            shutil.copyfileobj(source, out, CHUNK)
        os.fchown(f, *owner)
        os.fchmod(f, mode)
    finally:
        os.close(f)
