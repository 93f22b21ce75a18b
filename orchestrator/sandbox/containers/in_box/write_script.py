# In the box, write_file's one program (programs.WRITE_SCRIPT): argv[1] the path, argv[2] "write" or "append",
# argv[3] "git" (protect_git) or "-"; the content on stdin. Runs as /usr/bin/python3 -I of the sandbox image (3.11).
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


target = os.path.realpath(os.path.join(root, rel))
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
        fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    bare_repo(fd, parts[-1], "/".join(parts[:-1]))
    # O_RDWR|O_NONBLOCK opens even a FIFO at once, so the check below can refuse it.
    out = os.open(
        parts[-1],
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_APPEND if append else 0),
        0o644,
        dir_fd=fd,
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
