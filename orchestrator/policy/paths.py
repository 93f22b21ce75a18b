"""The path rules of a write into /workspace, written once.

Which path a write_file call may name at all (`check_write_path`: relative,
no `..`, no control character, not the workspace itself), its normal form
(`normalise`), the glob language of `allow`, `deny` and `approve` paths
(`glob_match`), and which spellings a filesystem takes for `.git`
(`is_dotgit`, GIT_DENY). The policy (schema.py's WriteFileTool, ApproveRule)
and the box (sandbox/engine.py's write, sandbox/wakes/transaction.py's check of a
wake's changes) both ask here, so the two can never disagree.

Not here: which globs a policy sets (schema.py), the write script's own
refusals inside the box (sandbox/containers/programs.py).
"""

from __future__ import annotations

import fnmatch
import posixpath
from pathlib import PurePosixPath

# Git runs code from its own directory on the host of whoever later uses the
# repository: hooks, config (core.fsmonitor, core.sshCommand, filter and diff
# drivers), config.worktree, a submodule's .git/modules/*/{hooks,config}, a
# linked worktree's commondir. A `.git` FILE ("gitdir: elsewhere") moves all of
# it to a directory of the writer's choosing. So unless a policy sets
# `protect_git: false`, write_file writes nothing named .git and nothing under
# one, in any spelling a filesystem takes for .git (is_dotgit); `deny` adds to
# this. A bare repository planted elsewhere (HEAD, objects/, refs/ in one
# directory) has no .git segment to see: the write script refuses its config,
# config.worktree, commondir and hooks/ in the box (programs.WRITE_SCRIPT).
GIT_DENY = ("**/.git", "**/.git/**")
GIT_DENY_NOTE = (
    "the .git globs match any case, .git. and git~1 too; the box also refuses "
    "an embedded bare repository's config, config.worktree, commondir and hooks/"
)

# Code points HFS+ ignores in names (git's is_hfs_dotgit), so ".g\u200cit" is .git on macOS.
_HFS_IGNORED = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])


def is_dotgit(segment: str) -> bool:
    """Whether a filesystem may take this one path segment for `.git`: any case
    (macOS and Windows fold it), HFS+'s ignored code points, NTFS's trailing dots
    and spaces, and NTFS's 8.3 short name GIT~1."""
    name = segment.translate(_HFS_IGNORED).lower().rstrip(". ")
    return name in (".git", "git~1")


def check_write_path(path: str) -> str | None:
    """Why `path` names no file inside /workspace, as a sentence for the model, or None.
    `..` is refused anywhere, not only where it escapes: `a/..` is not the workspace
    when `a` is a link, and the box writes without resolving links on the host."""
    if not path:
        return "the path is empty"
    if "\0" in path:
        return "the path contains a NUL byte"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "the path contains a control character"
    if path.startswith("/"):
        return "the path must be relative to /workspace, not absolute"
    if ".." in PurePosixPath(path).parts:
        return "the path may not contain '..'"
    if PurePosixPath(path).parts in ((), (".",)):
        return "the path names the workspace itself, not a file"
    return None


def normalise(path: str) -> str | None:
    """`./a//b/` -> `a/b`; None for any path check_write_path refuses (absolute,
    with `..`, the workspace itself, NUL or control characters)."""
    if check_write_path(path) is not None:
        return None
    return posixpath.normpath(path)


def glob_match(pattern: str, rel: str) -> bool:
    """Whether normalised `rel` matches `pattern` (semantics: schema.py's WriteFileTool)."""
    return _match_parts(tuple(p for p in pattern.split("/") if p), tuple(rel.split("/")))


def _match_parts(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_parts(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _match_parts(rest, parts[1:])
