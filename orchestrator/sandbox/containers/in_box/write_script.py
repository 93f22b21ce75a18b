# In the box, write_file's one program (programs.WRITE_SCRIPT): argv[1] the path, argv[2] "write" or "append",
# argv[3] "git" (protect_git) or "-"; the content on stdin. Runs as /usr/bin/python3 -I of the sandbox image (3.11).
import errno
import os
import stat
import sys

root, rel, append = "/workspace", sys.argv[1], sys.argv[2] == "append"
git = sys.argv[3:4] == ["git"]
MARKS, RUNS = {"head", "objects", "refs"}, {"config", "config.worktree", "commondir", "hooks"}


def bare_repo(fd: int, name: str, where: str) -> None:
    name = name.lower()
    if not git or name not in MARKS | RUNS:
        return
    after = {n.lower() for n in os.listdir(fd)} | {name}
    if after >= MARKS and RUNS & after:
        print(
            f"refused: {rel}: {where or 'the workspace'} holds HEAD, objects/ and refs/, so git "
            f"takes it for a repository and would run what its {name} says; protect_git keeps "
            "write_file out of a repository's config and hooks. This is deliberate."
        )
        sys.exit(3)


def same(fd: int, name: str, opened: int) -> bool:
    """Whether the name, not followed, is what was opened. gVisor follows a link that O_NOFOLLOW |
    O_DIRECTORY names (the escape suite's write_file_survives_folder_swap): so the name is looked at
    again, and a link there now, or another inode (a link swapped out after the open), is refused.
    The same lines as in_box/edit.py's _same: each program is one file, sent whole (programs.py)."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    was = os.fstat(opened)
    return not stat.S_ISLNK(st.st_mode) and (st.st_dev, st.st_ino) == (was.st_dev, was.st_ino)


def open_checked(fd: int, name: str, flags: int, mode: int = 0o777) -> int:
    """`name` in the folder `fd`, opened with `flags` (O_NOFOLLOW among them) and checked to be what the name is."""
    out = os.open(name, flags, mode, dir_fd=fd)
    if not same(fd, name, out):
        os.close(out)
        raise OSError(errno.ELOOP, "the path goes through a symbolic link, which is never followed")
    return out


try:
    target = os.path.realpath(os.path.join(root, rel))
except OSError as exc:  # a link swapped out between realpath's lstat and its readlink
    print(f"refused: {rel}: {exc.strerror}")
    sys.exit(3)
if os.path.commonpath([root, target]) != root or target == root:
    print(f"refused: {rel} resolves to {target}, outside /workspace")
    sys.exit(3)
if target != os.path.normpath(os.path.join(root, rel)):
    # The policy's globs were checked on the path as written; a symlink on the
    # way would carry the write somewhere they never saw. Name the real path.
    real = os.path.relpath(target, root)
    print(f"refused: {rel} goes through a symlink; write to {real} instead")
    sys.exit(3)
parts = os.path.relpath(target, root).split(os.sep)
try:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for i, part in enumerate(parts[:-1]):
        bare_repo(fd, part, "/".join(parts[:i]))
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        fd = open_checked(fd, part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    bare_repo(fd, parts[-1], "/".join(parts[:-1]))
    # O_RDWR|O_NONBLOCK opens even a FIFO at once, so the check below can refuse it.
    out = open_checked(
        fd, parts[-1], os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_APPEND if append else 0), 0o644
    )
except OSError as exc:
    print(f"refused: {rel}: {exc.strerror}")
    sys.exit(3)
if not stat.S_ISREG(os.fstat(out).st_mode):
    print(f"refused: {rel} exists and is not a regular file")
    sys.exit(3)
os.set_blocking(out, True)
if not append:
    os.ftruncate(out, 0)
n = 0
while chunk := sys.stdin.buffer.read(1 << 16):
    n += os.write(out, chunk)
print(f"{'appended' if append else 'wrote'} {n} bytes to {os.path.relpath(target, root)}")
