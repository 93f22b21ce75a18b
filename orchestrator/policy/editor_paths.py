"""Where a call of Claude's own file tools lands, and whether the policy lets it write there.

The text editor (`str_replace_based_edit_tool`) names files as the model
was trained to: absolute (`/workspace/notes.md`) or relative to /workspace.
The memory tool names them under `/memories`, which is the workspace's
`memory/` folder and nothing else. Both arrive here first, on the
orchestrator (wake/editor_tool.py) and again on the broker (broker/edit_op.py):
a path becomes a `Spot` (which folder it is confined to, the path inside it)
or a sentence for the model. `..`, `.`, empty segments, control characters
(a newline in a name) and any path outside the tool's folder are refused here;
links and FIFOs are the box's to refuse (sandbox/containers/in_box/edit.py), where no
check can race the use.

Writes obey write_file's rules whether or not write_file is offered: its
allow/deny globs, max_bytes and protect_git (schema.WriteFileTool.refusal),
over the path relative to /workspace. `approve.rules` with `tool: write_file`
and `paths` globs ask about these writes too (schema.ApproveRule.asks).

Not here: the tools' offers and results (wake/editor_tool.py), the program
that edits (sandbox/containers/in_box/edit.py), the broker's check (broker/edit_op.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

EDITOR = "str_replace_based_edit_tool"  # the name Claude calls its text editor by
EDITOR_TYPE = "text_editor_20250728"
MEMORY = "memory"  # the memory tool's name
MEMORY_TYPE = "memory_20250818"
MEMORY_DIR = "memory"  # /memories in the workspace
WORKSPACE = "/workspace"
MEMORIES = "/memories"
COMMANDS = {
    EDITOR: ("view", "str_replace", "create", "insert"),
    MEMORY: ("view", "create", "str_replace", "insert", "delete", "rename"),
}
WRITES = frozenset({"str_replace", "create", "insert", "delete", "rename"})  # commands that change files
MAX_PATH_CHARS = 4096  # PATH_MAX: a longer name no filesystem takes


class WriteRules(Protocol):
    """schema.WriteFileTool, as seen from here (schema.py imports this module)."""

    def refusal(self, path: str, size: int, offered: bool = True) -> str | None: ...


@dataclass(frozen=True)
class Spot:
    """One path of a call: `root` the folder it is confined to ("" the workspace, "memory"),
    `rel` the path inside it ("" the folder itself), `shown` the path as the model wrote it."""

    root: str
    rel: str
    shown: str

    @property
    def workspace_rel(self) -> str:
        """The path relative to /workspace, as write_file's globs see it."""
        return "/".join(p for p in (self.root, self.rel) if p)


def spot(tool: str, path: object) -> Spot | str:
    """Where `path` lands for `tool`, or why it lands nowhere (a sentence for the model)."""
    if not isinstance(path, str) or not path:
        return "the path is empty"
    if len(path) > MAX_PATH_CHARS:
        return f"the path is {len(path):,} characters; at most {MAX_PATH_CHARS:,}"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return f"{path!r}: the path contains a control character (a newline?); no file here is named so"
    if tool == MEMORY:
        if path != MEMORIES and not path.startswith(MEMORIES + "/"):
            return f"Path must start with {MEMORIES}, got: {path}"
        root, inner = MEMORY_DIR, path[len(MEMORIES) :]
    elif path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        root, inner = "", path[len(WORKSPACE) :]
    elif path.startswith("/"):
        return f"{path} is outside {WORKSPACE}: give a path under {WORKSPACE}, or relative to it"
    else:
        root, inner = "", path
    parts = [p for p in inner.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return f"{path}: '.' and '..' are not allowed in a path here; name the file directly"
    return Spot(root, "/".join(parts), path)


def spots(tool: str, args: dict[str, Any]) -> list[Spot] | str:
    """Every path a call names (rename: two), or why one lands nowhere."""
    keys = ("old_path", "new_path") if args.get("command") == "rename" else ("path",)
    out: list[Spot] = []
    for key in keys:
        where = spot(tool, args.get(key))
        if isinstance(where, str):
            return f"{key}: {where}"
        out.append(where)
    return out


def refusal(rules: WriteRules, tool: str, args: dict[str, Any]) -> str | None:
    """Why the policy refuses this call before any box (a sentence for the model), or None.
    Reads are refused only outside the tool's folder; writes also by write_file's rules
    (`rules`: the policy's tools.write_file), whether write_file is offered or not."""
    found = spots(tool, args)
    if isinstance(found, str):
        return found
    if args.get("command") not in WRITES:
        return None
    size = len(str(args.get("file_text", "")).encode("utf-8"))
    for where in found:
        if not where.rel:
            return f"{where.shown}: names the folder itself, not a file inside it"
        reason = rules.refusal(where.workspace_rel, size, offered=False)
        if reason:
            return reason
    return None


def written(tool: str, args: dict[str, Any]) -> list[str]:
    """The workspace-relative paths a writing call changes ([] for a read or a path refused)
    — what an `approve.rules` paths glob is matched against."""
    if args.get("command") not in WRITES:
        return []
    found = spots(tool, args)
    return [] if isinstance(found, str) else [w.workspace_rel for w in found]
