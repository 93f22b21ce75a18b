# In the box, the text editor's and the memory tool's one program (programs.EDIT_SCRIPT): one command,
# its request as JSON on stdin (editor_request.py builds it). Runs as /usr/bin/python3 -I of the sandbox image
# (3.11). Exit 0 done, 1 the command's own error (no match, a line out of range), 3 refused (a link, a FIFO,
# a size); what it prints is the model's text. Every path is walked from /workspace one name at a time with
# O_NOFOLLOW and the file used through the descriptor the walk opened: a link swapped in meanwhile fails
# the walk (ELOOP, ENOTDIR) instead of being followed, so no check here can race its use.
from __future__ import annotations  # annotations stay strings: typing (36 ms in the box) is never imported

import json
import os
import shutil
import stat
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING's value, without importing typing; mypy takes the name as True
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import NotRequired, TypedDict

    class Request(TypedDict):
        """What editor_request.build writes: the command, where it acts, the policy's caps, its arguments."""

        tool: str  # editor_paths.EDITOR or MEMORY
        command: str
        root: str  # the folder the path is confined to ("" the workspace, "memory"), rel the path inside it
        rel: str
        shown: str  # the path as the model wrote it, for its text
        max_bytes: int
        max_chars: int
        git: bool  # protect_git
        view_range: NotRequired[list[int]]  # a list (build checks); its items are checked by _range
        file_text: NotRequired[str]
        old_str: NotRequired[str]
        new_str: NotRequired[str]
        insert_line: NotRequired[int]
        insert_text: NotRequired[str]
        new_rel: NotRequired[str]  # rename: the destination, in the same root
        new_shown: NotRequired[str]


req: Request = json.loads(sys.stdin.buffer.read(64 << 20).decode("utf-8"))
ROOT, LIMIT, MAX_CHARS = "/workspace", int(req["max_bytes"]), int(req["max_chars"])
SNIPPET = 4  # lines of context shown around an edit
MAX_LISTED = 1000  # entries a folder's view shows at most
BINARY_PROBE = 8192  # bytes looked at for a NUL: a text file has none
MARKS, RUNS = {"head", "objects", "refs"}, {"config", "config.worktree", "commondir", "hooks"}
GIT = bool(req.get("git"))


class Refused(Exception):
    pass


class Failed(Exception):
    pass


def names(root: str, rel: str) -> list[str]:
    parts = ([root] if root else []) + ([p for p in rel.split("/")] if rel else [])
    for part in parts:
        if part in ("", ".", "..") or "\0" in part:
            raise Refused(f"{part!r} is not a name a path here may hold")
    return parts


def bare_repo(fd: int, name: str, where: str, shown: str) -> None:
    # write_file's protect_git (write_script.py): no write makes a folder git would take for a bare repository.
    name = name.lower()
    if not GIT or name not in MARKS | RUNS:
        return
    after = {n.lower() for n in os.listdir(fd)} | {name}
    if after >= MARKS and RUNS & after:
        raise Refused(
            f"{shown}: {where or 'the workspace'} holds HEAD, objects/ and refs/, so git takes it for a "
            f"repository and would run what its {name} says; protect_git keeps edits out of a repository's "
            "config and hooks. This is deliberate."
        )


def walk(root: str, rel: str, shown: str, make: bool = False, write: bool = False) -> tuple[int, str | None]:
    """(the open folder the last name is in, that name); the name None: the workspace itself."""
    parts = names(root, rel)
    fd = os.open(ROOT, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts[:-1]):
            if write:
                bare_repo(fd, part, "/".join(parts[:i]), shown)
            if make:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            fd = _into(fd, part, shown)
        if write and parts:
            bare_repo(fd, parts[-1], "/".join(parts[:-1]), shown)
    except OSError as exc:
        raise Refused(_why(shown, exc)) from None
    return fd, (parts[-1] if parts else None)


def _same(fd: int, name: str, opened: int) -> bool:
    """Whether the name, not followed, is what was opened. gVisor follows a link that O_NOFOLLOW |
    O_DIRECTORY names (found by the escape suite's editor_refuses_symlinks): so the name is looked at
    again, and a link there now, or another inode (a link swapped out after the open), is refused."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    was = os.fstat(opened)
    return not stat.S_ISLNK(st.st_mode) and (st.st_dev, st.st_ino) == (was.st_dev, was.st_ino)


def _into(fd: int, part: str, shown: str) -> int:
    try:
        sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError as exc:
        try:  # say "link" wherever it is one: runtimes differ in the errno (gVisor: ENOENT for a dangling one)
            link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        raise Refused(_why(shown, OSError(40, "") if link else exc)) from None
    if not _same(fd, part, sub):
        os.close(sub)
        raise Refused(_why(shown, OSError(40, "")))
    return sub


def _why(shown: str, exc: OSError) -> str:
    if exc.errno in (40, 20):  # ELOOP, ENOTDIR: a link (or a file) where a folder was walked
        return f"{shown}: refused: the path goes through a symbolic link or a file, which is never followed"
    if exc.errno == 2:
        return f"The path {shown} does not exist. Please provide a valid path."
    return f"{shown}: {exc.strerror}"


def open_file(fd: int, name: str, shown: str, flags: int) -> int:
    """The regular file `name` in the folder `fd`, opened with `flags`; never a link, FIFO or device."""
    try:
        # O_NONBLOCK opens even a FIFO at once, so the check below can refuse it.
        out = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=fd)
    except OSError as err:
        try:  # name what is there: runtimes differ in the errno (gVisor: EPERM for a FIFO)
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode) and not stat.S_ISLNK(mode):
            raise Refused(f"{shown}: refused: not a regular file (a folder, FIFO, socket or device)") from None
        raise Refused(_why(shown, OSError(40, "") if stat.S_ISLNK(mode) else err)) from None
    if not stat.S_ISREG(os.fstat(out).st_mode) or not _same(fd, name, out):
        os.close(out)
        raise Refused(f"{shown}: refused: not a regular file (a folder, FIFO, socket or device)")
    os.set_blocking(out, True)
    return out


def read_text(out: int, shown: str, cap: int) -> tuple[str, int]:
    """(the file's text, cut to `cap` bytes; its size in bytes). A binary file is refused."""
    size = os.fstat(out).st_size
    data = b""
    while len(data) < cap and (chunk := os.read(out, min(1 << 20, cap - len(data)))):
        data += chunk
    if b"\0" in data[:BINARY_PROBE]:
        raise Failed(f"{shown} is a binary file ({size:,} bytes); view shows only text. Use bash (file, xxd) on it.")
    try:
        text = data.decode("utf-8") if len(data) >= size else _cut_decode(data)
    except UnicodeDecodeError:
        raise Failed(f"{shown} is not UTF-8 text ({size:,} bytes); view shows only text. Use bash on it.") from None
    return text, size


def _cut_decode(data: bytes) -> str:
    for drop in range(4):  # a read cut inside a character
        try:
            return data[: len(data) - drop].decode("utf-8")
        except UnicodeDecodeError:
            if drop == 3:
                raise
    return ""


def numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines, first))


def capped(text: str, note: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    return text[:MAX_CHARS] + "\n" + note


def view(root: str, rel: str, shown: str, rng: list[int] | None) -> str:
    fd, name = walk(root, rel, shown)
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False) if name else os.fstat(fd)
    except FileNotFoundError:
        if root and not rel:  # the memory folder before anything was written to it
            return f"Here're the files and directories up to 2 levels deep in {shown}, excluding hidden items:\n(empty)"
        raise Refused(f"The path {shown} does not exist. Please provide a valid path.") from None
    if stat.S_ISDIR(st.st_mode):
        if rng is not None:
            raise Failed("The `view_range` parameter is not allowed when `path` points to a directory.")
        here = fd if name is None else _open_dir(fd, name, shown)
        return listing(here, shown)
    assert name is not None  # the workspace itself is a folder, listed above
    out = open_file(fd, name, shown, os.O_RDONLY)
    text, size = read_text(out, shown, LIMIT)
    lines = text.split("\n")
    if lines and lines[-1] == "" and text:
        lines.pop()
    first, last = 1, len(lines)
    if rng is not None:
        first, last = _range(rng, len(lines))
    head = f"Here's the content of {shown} with line numbers:\n"
    if size > LIMIT:
        head = f"{shown} is {size:,} bytes; only its first {LIMIT:,} bytes were read (max_bytes).\n" + head
    body = numbered(lines[first - 1 : last], first)
    return capped(
        head + body,
        f"[view cut at {MAX_CHARS:,} characters (max_characters): {shown} has {len(lines):,} lines; "
        "use view_range to see the rest]",
    )


def _open_dir(fd: int, name: str, shown: str) -> int:
    return _into(fd, name, shown)


def _range(rng: list[int], n: int) -> tuple[int, int]:
    ok = isinstance(rng, list) and len(rng) == 2 and all(type(x) is int for x in rng)
    if not ok or not 1 <= rng[0] <= max(n, 1) or not (rng[1] == -1 or rng[0] <= rng[1] <= n):
        raise Failed(
            f"Invalid `view_range` parameter: {rng}. It should be [start, end] with 1 <= start <= end <= {n} "
            "(the file's lines), or end -1 for the end of the file."
        )
    return rng[0], (n if rng[1] == -1 else rng[1])


def listing(fd: int, shown: str) -> str:
    rows: list[str] = []

    def shown_name(name: str) -> str:  # one entry, one line: a name with a newline is written out
        return name if name.isprintable() else repr(name)

    def add(dirfd: int, prefix: str, depth: int) -> None:
        with os.scandir(dirfd) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name.startswith(".") or len(rows) >= MAX_LISTED:
                    continue
                st = entry.stat(follow_symlinks=False)
                path = f"{prefix}{shown_name(entry.name)}"
                if stat.S_ISDIR(st.st_mode):
                    rows.append(f"{_size(st.st_size)}\t{shown}/{path}/")
                    if depth < 2:
                        sub = _into(dirfd, entry.name, shown)  # never a link swapped in since the stat
                        try:
                            add(sub, path + "/", depth + 1)
                        finally:
                            os.close(sub)
                else:
                    rows.append(f"{_size(st.st_size)}\t{shown}/{path}")

    add(fd, "", 1)
    more = f"\n[only the first {MAX_LISTED} entries are listed]" if len(rows) >= MAX_LISTED else ""
    head = f"Here're the files and directories up to 2 levels deep in {shown}, excluding hidden items:\n"
    return capped(head + ("\n".join(rows) or "(empty)") + more, f"[cut at {MAX_CHARS:,} characters (max_characters)]")


def _size(n: float) -> str:
    for unit in ("B", "K", "M", "G"):
        if n < 1024:
            return f"{n:.1f}{unit}" if unit != "B" and n < 10 else f"{n:.0f}{unit}"
        n /= 1024
    return f"{n:.0f}T"


def replace_all(out: int, text: str) -> None:
    data = text.encode("utf-8")
    if len(data) > LIMIT:
        raise Refused(f"the edited file would be {len(data):,} bytes; this policy allows at most {LIMIT:,} (max_bytes)")
    os.lseek(out, 0, os.SEEK_SET)
    view_ = memoryview(data)
    while view_:
        view_ = view_[os.write(out, view_) :]
    os.ftruncate(out, len(data))


def editable(root: str, rel: str, shown: str) -> tuple[int, str]:
    fd, name = walk(root, rel, shown, write=True)
    if name is None:
        raise Refused(f"{shown}: names the folder itself, not a file inside it")
    out = open_file(fd, name, shown, os.O_RDWR)
    size = os.fstat(out).st_size
    if size > LIMIT:
        raise Refused(f"{shown} is {size:,} bytes; edits take files of at most {LIMIT:,} bytes (max_bytes)")
    text, _ = read_text(out, shown, LIMIT + 1)
    return out, text


def snippet(text: str, line0: int, count: int, shown: str, what: str) -> str:
    lines = text.split("\n")
    first = max(0, line0 - SNIPPET)
    last = min(len(lines), line0 + count + SNIPPET)
    body = numbered(lines[first:last], first + 1)
    return capped(
        f"The {what} {shown} has been edited. Here's the result of running `cat -n` on a snippet of {shown}:\n"
        f"{body}\nReview the changes and make sure they are as expected. Edit the file again if necessary.",
        "[snippet cut at max_characters]",
    )


def str_replace(root: str, rel: str, shown: str, old: str, new: str, what: str) -> str:
    if old == "":
        raise Failed("old_str is empty: give the exact text to replace, with enough context to be unique.")
    out, text = editable(root, rel, shown)
    count = text.count(old)
    if count == 0:
        raise Failed(
            f"No match found for replacement. old_str did not appear verbatim in {shown}. "
            "Please check your text and try again."
        )
    if count > 1:
        lines = sorted({text[:i].count("\n") + 1 for i in _starts(text, old)})
        raise Failed(
            f"Found {count} matches for replacement text (lines {', '.join(map(str, lines[:20]))}). "
            "Please provide more context to make a unique match."
        )
    at = text.index(old)
    replace_all(out, text[:at] + new + text[at + len(old) :])
    return snippet(text[:at] + new + text[at + len(old) :], text[:at].count("\n"), new.count("\n") + 1, shown, what)


def _starts(text: str, old: str) -> Iterator[int]:
    i = text.find(old)
    while i != -1:
        yield i
        i = text.find(old, i + 1)


def insert(root: str, rel: str, shown: str, line: int | None, new: str, what: str) -> str:
    out, text = editable(root, rel, shown)
    lines = text.splitlines(keepends=True)
    if type(line) is not int or not 0 <= line <= len(lines):
        raise Failed(f"Invalid `insert_line` parameter: {line}. It should be within the range [0, {len(lines)}].")
    if lines and not lines[-1].endswith("\n") and line == len(lines):
        lines[-1] += "\n"
    if not new.endswith("\n") and line < len(lines):
        new += "\n"
    edited = "".join(lines[:line] + [new] + lines[line:])
    replace_all(out, edited)
    return snippet(edited, line, new.count("\n") + 1, shown, what)


def create(root: str, rel: str, shown: str, content: str) -> str:
    fd, name = walk(root, rel, shown, make=True, write=True)
    if name is None:
        raise Refused(f"{shown}: names the folder itself, not a file inside it")
    out = open_file(fd, name, shown, os.O_RDWR | os.O_CREAT)
    replace_all(out, content)
    return f"File created successfully at: {shown}"


def delete(root: str, rel: str, shown: str) -> str:
    fd, name = walk(root, rel, shown, write=True)
    if not rel or name is None:
        raise Refused(f"Cannot delete the {shown} directory itself")
    try:
        if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            shutil.rmtree(name, dir_fd=fd)  # fd-based: never follows a link inside
        else:
            os.unlink(name, dir_fd=fd)  # a link is removed, never its target
    except OSError as exc:
        raise Refused(_why(shown, exc)) from None
    return f"Successfully deleted {shown}"


def rename(src: tuple[str, str, str], dst: tuple[str, str, str]) -> str:
    (sroot, srel, sshown), (droot, drel, dshown) = src, dst
    sfd, sname = walk(sroot, srel, sshown, write=True)
    dfd, dname = walk(droot, drel, dshown, make=True, write=True)
    if not srel or not drel or sname is None or dname is None:  # a name is None only where its rel is empty
        raise Refused("Cannot rename the /memories directory itself")
    try:
        os.stat(sname, dir_fd=sfd, follow_symlinks=False)
    except OSError as exc:
        raise Refused(_why(sshown, exc)) from None
    try:
        os.stat(dname, dir_fd=dfd, follow_symlinks=False)
        raise Failed(f"The destination {dshown} already exists")
    except FileNotFoundError:
        pass
    try:
        os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
    except OSError as exc:
        raise Refused(_why(sshown, exc)) from None
    return f"Successfully renamed {sshown} to {dshown}"


def main() -> str:
    cmd, what = req["command"], ("memory file" if req["tool"] == "memory" else "file")
    here = (req["root"], req["rel"], req["shown"])
    if cmd == "view":
        return view(*here, req.get("view_range"))
    if cmd == "create":
        return create(*here, req.get("file_text", ""))
    if cmd == "str_replace":
        return str_replace(*here, req.get("old_str", ""), req.get("new_str", ""), what)
    if cmd == "insert":
        return insert(*here, req.get("insert_line"), req.get("insert_text", ""), what)
    if cmd == "delete":
        return delete(*here)
    if cmd == "rename":
        return rename(here, (req["root"], req["new_rel"], req["new_shown"]))
    raise Failed(f"unknown command {cmd!r}")


try:
    sys.stdout.write(main())  # the model's text as it is: no newline of ours after it
except Failed as exc:
    sys.stdout.write(str(exc))
    sys.exit(1)
except Refused as exc:
    sys.stdout.write(str(exc))
    sys.exit(3)
