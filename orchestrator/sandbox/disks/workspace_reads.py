"""The one module where the host reads workspace files.

EVERYTHING IN THE WORKSPACE IS UNTRUSTED. The agent has a shell in it and may
have planted, anywhere, a symlink (to /etc/shadow, to the API key, dangling),
a FIFO that blocks a reader for ever, a device node, or a 100 GB sparse file.
So the host here:

- walks each path one component at a time from the workspace directory with
  O_NOFOLLOW, so no symlink is ever followed, at the end or in the middle;
- opens files O_NONBLOCK (a FIFO cannot hang the open) and reads only when
  fstat says regular file;
- reads at most READ_CAP bytes, says so in the text when it cut, and replaces
  invalid UTF-8 and strips terminal escapes;
- answers anything else with "(unreadable: reason)", never an exception.

The journal-size check uses lstat semantics (no symlink followed) for the
same reasons. `HostFiles` reads a workspace at a path of this host: the
folder, or the mount of its disk (disk.py); under compose the broker reads
for the orchestrator with the same functions (broker/server.py, op `read`).

Not here: what the files mean (wake/context.py), the harness's one write, an
append from inside a box (wake/journal_stub.py), the agent's own writes (tools.py).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from orchestrator.sandbox.containers.output import decode

READ_CAP = 64 * 1024  # bytes per file in the context; more is cut with a note
JOURNAL_DIR = "memory/journal"
CORE_MEMORY = "memory/core.md"
_JOURNAL_NAME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}\.md")  # fullmatch: ASCII digits, no trailing newline


READS = ("read_text", "read_text_or_none", "journal_names", "journal_size")  # Files' methods, by name


@dataclass(frozen=True)
class HostFiles:
    """The workspace at `root` on this host: the folder, or its disk's mount."""

    root: Path

    def read_text(self, rel: str) -> str:
        return read_text(self.root, rel)

    def read_text_or_none(self, rel: str) -> str | None:
        return read_text_or_none(self.root, rel)

    def journal_names(self) -> list[str]:
        return journal_names(self.root)

    def journal_size(self, day: str) -> int | None:
        return journal_size(self.root, day)


class Unreadable(Exception):
    """Why a workspace path was not read; str() is the reason for the context."""


def read_text(workspace: Path, rel: str, cap: int = READ_CAP) -> str:
    """The file's text (capped, noted) or '(unreadable: reason)'."""
    try:
        return _read_capped(workspace, rel, cap)
    except FileNotFoundError:
        return f"(unreadable: {rel} does not exist)"
    except Unreadable as exc:
        return f"(unreadable: {exc})"
    except OSError as exc:
        return f"(unreadable: {rel}: {exc.strerror})"


def read_text_or_none(workspace: Path, rel: str, cap: int = READ_CAP) -> str | None:
    """Like read_text, but None when the file simply does not exist."""
    try:
        return _read_capped(workspace, rel, cap)
    except FileNotFoundError:
        return None
    except Unreadable as exc:
        return f"(unreadable: {exc})"
    except OSError as exc:
        return f"(unreadable: {rel}: {exc.strerror})"


def journal_names(workspace: Path) -> list[str]:
    """YYYY-MM-DD.md names in memory/journal, oldest first; [] if none or unreadable."""
    try:
        dir_fd = _open_dir(workspace, JOURNAL_DIR)
    except (Unreadable, FileNotFoundError):
        return []
    try:
        return sorted(n for n in os.listdir(dir_fd) if _JOURNAL_NAME.fullmatch(n))
    except OSError:
        return []
    finally:
        os.close(dir_fd)


def journal_size(workspace: Path, day: str) -> int | None:
    """Size of memory/journal/DAY.md if it is a regular file; 0 if missing;
    None if it is anything else (a symlink is not followed, and does not count)."""
    rel = f"{JOURNAL_DIR}/{day}.md"
    if not _JOURNAL_NAME.fullmatch(f"{day}.md"):  # a day, not a path (the broker's read op passes it on)
        return None
    try:
        parent = _open_dir(workspace, str(PurePosixPath(rel).parent))
    except FileNotFoundError:
        return 0
    except Unreadable:
        return None
    try:
        st = os.stat(PurePosixPath(rel).name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    except OSError:
        return None
    finally:
        os.close(parent)
    return st.st_size if stat.S_ISREG(st.st_mode) else None


# -- the walk ----------------------------------------------------------------------


def _read_capped(workspace: Path, rel: str, cap: int) -> str:
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or ".." in parts:
        raise Unreadable(f"{rel!r} is not a plain relative path")
    parent = _open_dir(workspace, str(PurePosixPath(*parts[:-1])) if len(parts) > 1 else ".")
    try:
        # Look before opening: opening a device node can itself do things.
        _require_regular(os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode, rel)
        fd = _open_nofollow(parts[-1], os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY, parent, rel)
    except PermissionError:
        raise Unreadable(f"{rel}: permission denied") from None
    finally:
        os.close(parent)
    try:
        st = os.fstat(fd)  # again: it may have been swapped between the look and the open
        _require_regular(st.st_mode, rel)
        data = _read_upto(fd, cap + 1)
    finally:
        os.close(fd)
    text = decode(data[:cap])
    if len(data) > cap:
        text += f"\n[... cut by the harness: only the first {cap:,} of {st.st_size:,} bytes of {rel} are shown ...]"
    return text


def _require_regular(mode: int, rel: str) -> None:
    if not stat.S_ISREG(mode):
        what = "symlink, which the harness never follows" if stat.S_ISLNK(mode) else _kind(mode)
        raise Unreadable(f"{rel} is a {what}, not a regular file")


def _open_dir(workspace: Path, rel: str) -> int:
    """An fd for workspace/rel, no symlink followed on the way; FileNotFoundError if absent."""
    try:
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Unreadable(f"the workspace cannot be opened ({exc.strerror})") from None
    for part in PurePosixPath(rel).parts:
        if part == ".":
            continue
        try:
            nxt = _open_nofollow(part, os.O_RDONLY | os.O_DIRECTORY, fd, rel)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _open_nofollow(name: str, flags: int, dir_fd: int, rel: str) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_symlink(name, dir_fd):
            raise Unreadable(f"{rel}: {name} is a symlink, which the harness never follows") from None
        if exc.errno == errno.ENOTDIR:
            raise Unreadable(f"{rel}: {name} is not a directory") from None
        raise Unreadable(f"{rel}: {exc.strerror}") from None


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _read_upto(fd: int, limit: int) -> bytes:
    chunks, got = [], 0
    while got < limit:
        chunk = os.read(fd, min(limit - got, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
    ):
        if test(mode):
            return name
    return "special file"
