"""The one module where the host reads, writes and deletes in an agent folder.

AN AGENT FOLDER IS NOT THE OPERATOR'S ALONE. Under a shared ROOT whoever may
write one agent folder (actor D in docs/security.md's threat model) can plant anything
in it and in its state/: a symlink (to /etc/shadow, to another agent's
state, to a folder elsewhere for retention to empty), a FIFO that blocks a
reader for ever while the wake holds its lock, /dev/zero, a 100 GB sparse
file. So every path under a folder is:

- walked one component at a time from the folder's own descriptor with
  O_NOFOLLOW, so no link is followed, at the end or in the middle (`Refused`);
- opened O_NONBLOCK (a FIFO cannot hang the open) and used only when fstat
  says regular file with one name (a FIFO, device, socket, or a hard link to a
  file elsewhere is `Refused`);
- read up to a cap the caller names (`TooBig` past it, or cut with `head`);
- written whole (temp file, fsync, rename in the same folder descriptor) or
  by one O_APPEND write, and deleted only when it is a regular file.

A folder's own path is the operator's (ROOT/name, as resolved by load_agent)
and is opened as given; `state_folder(state_dir)` also walks `state` itself
without following it, so `state` planted as a link is refused too.

`Refused` is an OSError, so callers that already treat an unreadable file as
missing or corrupt keep doing so, and a ConfigError, so one the CLI meets is
one line saying what to remove. sandbox/disks/workspace_reads.py keeps its own walk for
the workspace (it says why a read failed, in the model's words).

Not here: what any file holds (records/state.py, records/events.py, records/transcript.py, ...), the
workspace's reads for the context (sandbox/disks/workspace_reads.py).
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from orchestrator.errors import ConfigError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC  # a step of the walk: a real folder
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC  # never a link; a FIFO cannot hang it
CHUNK = 1 << 16  # bytes per read(2)
RECORD_CAP = 16 * 2**20  # bytes of a JSON record read whole (tasks.json, ledger.json): years of use


class Refused(OSError, ConfigError):
    """A path under an agent folder that is not ours to use: a link, a FIFO, a device, too big.
    An OSError to the readers that treat an unreadable file as missing or corrupt; a
    ConfigError (one line, exit 2) to the CLI when it reaches it."""

    def __str__(self) -> str:
        return (
            f"{self.filename}: {self.strerror}; wakeloop never follows a link in an agent folder, "
            "nor opens anything there but a regular file of its own: remove it (`rm` it; what "
            "wakeloop needs there it makes again)"
        )


class TooBig(Refused):
    """A file over the cap its reader named."""

    def __init__(self, size: int, cap: int, shown: str):
        super().__init__(errno.EFBIG, f"{size:,} bytes, over {cap:,}", shown)
        self.size, self.cap = size, cap


@dataclass(frozen=True)
class Folder:
    """A folder whose contents are untrusted. `root` is opened as given (the
    operator's path); `base` (e.g. ("state",)) and every path below are walked
    without following a link."""

    root: Path
    base: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return Path(self.root, *self.base)

    # -- descriptors -------------------------------------------------------------

    @contextmanager
    def dir(self, rel: str = ".", create: bool = False) -> Iterator[int]:
        """An fd for the folder at `rel`, no link followed on the way; with
        `create`, missing folders are made (0700)."""
        fd = self._walk(_parts(rel, allow_empty=True), create)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def parent(self, rel: str, create: bool = False) -> Iterator[tuple[int, str]]:
        """(fd of rel's folder, rel's last name): for the *at() calls."""
        parts = _parts(rel)
        fd = self._walk(parts[:-1], create)
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def _walk(self, parts: tuple[str, ...], create: bool) -> int:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        for part in (*self.base, *parts):
            try:
                nxt = _open_dir_in(fd, part, create)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            fd = nxt
        return fd

    def open(self, rel: str, flags: int = os.O_RDONLY, mode: int = 0o600, create_dirs: bool = False) -> int:
        """An fd on a regular file at rel (flags as os.open's, e.g. O_WRONLY|O_APPEND|O_CREAT)."""
        with self.parent(rel, create_dirs) as (dir_fd, name):
            try:  # look before opening: opening a device node can itself do things
                _require_regular(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode, self._show(rel))
            except FileNotFoundError:
                if not flags & os.O_CREAT:
                    raise
            try:
                fd = os.open(name, flags | FILE_FLAGS, mode, dir_fd=dir_fd)
            except OSError as exc:
                raise _refusal(exc, name, dir_fd, self._show(rel)) from None
        try:
            st = os.fstat(fd)
            _require_regular(st.st_mode, self._show(rel))  # it may have been swapped meanwhile
            if st.st_nlink > 1:  # ours never have two names: a hard link to a file elsewhere
                raise Refused(errno.EMLINK, "a hard link (a file with another name elsewhere)", self._show(rel))
        except BaseException:
            os.close(fd)
            raise
        return fd

    # -- reading -----------------------------------------------------------------

    def head(self, rel: str, cap: int) -> bytes:
        """At most cap + 1 bytes of rel (one more than the cap says there was more)."""
        fd = self.open(rel)
        try:
            return read_upto(fd, cap + 1)
        finally:
            os.close(fd)

    def read_bytes(self, rel: str, cap: int) -> bytes:
        """All of rel, or TooBig when it is over cap (known from fstat, before a byte is read)."""
        fd = self.open(rel)
        try:
            size = os.fstat(fd).st_size
            data = read_upto(fd, cap + 1) if size <= cap else b""
        finally:
            os.close(fd)
        if size > cap or len(data) > cap:  # or grown since the fstat
            raise TooBig(max(size, len(data)), cap, self._show(rel))
        return data

    def read_text(self, rel: str, cap: int) -> str:
        return self.read_bytes(rel, cap).decode("utf-8", "replace")

    def reader(self, rel: str) -> IO[bytes]:
        """A binary file object on rel, for streaming (the caller bounds what it reads)."""
        return os.fdopen(self.open(rel), "rb")

    def lstat(self, rel: str) -> os.stat_result | None:
        """rel's own stat (a link is not followed), or None when absent or its folder is refused."""
        try:
            with self.parent(rel) as (dir_fd, name):
                return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None

    def is_file(self, rel: str) -> bool:
        st = self.lstat(rel)
        return st is not None and stat.S_ISREG(st.st_mode)

    def files(self, rel: str = ".") -> dict[str, os.stat_result]:
        """The regular files directly in folder rel, by name (links and the rest left out);
        {} when the folder is absent or refused."""
        try:
            with self.dir(rel) as fd:
                found = {}
                for name in os.listdir(fd):
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        found[name] = st
                return found
        except OSError:
            return {}

    # -- writing and deleting ------------------------------------------------------

    def append(self, rel: str, data: bytes, fsync: bool = False, create_dirs: bool = False) -> None:
        """One write(2) on an O_APPEND descriptor: two writers never interleave inside it."""
        fd = self.open(rel, os.O_WRONLY | os.O_APPEND | os.O_CREAT, create_dirs=create_dirs)
        try:
            os.write(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def write_atomic(self, rel: str, data: bytes | str, create_dirs: bool = False) -> None:
        """rel replaced whole or not at all, even across a crash (temp file, fsync,
        rename, fsync of the folder). A link at rel is replaced, never followed."""
        raw = data.encode("utf-8") if isinstance(data, str) else data
        with self.parent(rel, create_dirs) as (dir_fd, name):
            tmp = f".{name}.{os.urandom(6).hex()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=dir_fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(raw)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dir_fd)
                except OSError:
                    pass
                raise
            os.fsync(dir_fd)

    def unlink(self, rel: str) -> bool:
        """Delete rel if it is a regular file; a link, a folder or anything else is
        left alone (False), as is a file already gone."""
        try:
            with self.parent(rel) as (dir_fd, name):
                if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    return False
                # Swapped for a link meanwhile, unlink removes the link: nothing outside is touched.
                os.unlink(name, dir_fd=dir_fd)
                return True
        except (FileNotFoundError, Refused):  # gone, or its folder is a link: nothing of ours
            return False

    def rename(self, src: str, dst: str) -> None:
        """src -> dst inside the folder; only a regular file moves."""
        with self.parent(src) as (src_fd, src_name), self.parent(dst) as (dst_fd, dst_name):
            _require_regular(os.stat(src_name, dir_fd=src_fd, follow_symlinks=False).st_mode, self._show(src))
            os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)

    def _show(self, rel: str) -> str:
        return str(self.path / rel)


@dataclass(frozen=True)
class Place:
    """A file named by its agent folder and its path inside it, for a reader that takes a
    path (yamlfile.py's read_config): it then reads with the folder's walk. As a path
    (os.fspath, str) it is the full one, for messages and for code that opens paths."""

    folder: Path
    rel: str

    def __fspath__(self) -> str:
        return str(Path(self.folder) / self.rel)

    def __str__(self) -> str:
        return self.__fspath__()


def state_folder(state_dir: Path) -> Folder:
    """An agent's state/, walked from the agent folder: `state` itself must not be a link."""
    state_dir = Path(state_dir)
    return Folder(state_dir.parent, (state_dir.name,))


def read_upto(fd: int, limit: int) -> bytes:
    chunks, got = [], 0
    while got < limit:
        chunk = os.read(fd, min(limit - got, CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def capped_lines(f: IO[bytes] | io.BufferedIOBase, line_cap: int, total_cap: int) -> Iterator[bytes]:
    """The lines of a binary stream, each at most line_cap bytes (a longer one is
    skipped whole: no line of ours is that long), and no more than total_cap bytes
    read in all: a sparse 100 GB file, or a gzip bomb, costs no more than that.
    A last line with no newline is yielded if the stream ended before the cap."""
    parts: list[bytes] = []
    size, skipping, read = 0, False, 0
    while read < total_cap:
        chunk = f.read(min(CHUNK, total_cap - read))
        if not chunk:
            break
        read += len(chunk)
        start = 0
        while (cut := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start : cut + 1]
            if not skipping and size + len(piece) <= line_cap:
                yield b"".join(parts) + piece
            parts, size, skipping, start = [], 0, False, cut + 1
        rest = chunk[start:]
        if rest and not skipping:
            if size + len(rest) > line_cap:
                parts, size, skipping = [], 0, True
            else:
                parts.append(rest)
                size += len(rest)
    if parts and read < total_cap:
        yield b"".join(parts)


def _parts(rel: str, allow_empty: bool = False) -> tuple[str, ...]:
    parts = tuple(p for p in PurePosixPath(rel).parts if p != ".")
    if str(rel).startswith("/") or ".." in parts or (not parts and not allow_empty):
        raise Refused(errno.EINVAL, "not a plain relative path", str(rel))
    return parts


def _open_dir_in(dir_fd: int, name: str, create: bool) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        raise _refusal(exc, name, dir_fd, name) from None
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass  # made meanwhile by another writer: open it (still no link followed)
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(exc, name, dir_fd, name) from None


def _refusal(exc: OSError, name: str, dir_fd: int, shown: str) -> OSError:
    """ELOOP/ENOTDIR on a link, ENXIO on a FIFO with no reader: say what it was."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            return exc
        if not stat.S_ISDIR(mode) or exc.errno != errno.ENOTDIR:
            return Refused(exc.errno, f"a {_kind(mode)}, which the harness never follows or opens", shown)
    return exc


def _require_regular(mode: int, shown: str) -> None:
    if not stat.S_ISREG(mode):
        raise Refused(errno.EINVAL, f"a {_kind(mode)}, not a regular file", shown)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return name
    return "special file"
