"""One text editor or memory call as the request the box's edit program reads on stdin.

The host resolves nothing of the workspace: it turns the model's path into
a folder and the names inside it (policy/editor_paths.py, which refuses
`..`, control characters and anything outside the tool's folder), and hands
those names, the command's arguments and the policy's caps (max_bytes,
max_characters, protect_git) to in_box/edit.py, which walks and edits in
the box. Built the same way on the orchestrator (engine.py, in process)
and on the broker, from the broker's own copy of the policy.

Not here: the program (in_box/edit.py, programs.EDIT_SCRIPT), the policy's
checks (policy/editor_paths.py), the tools the model sees (wake/editor_tool.py).
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.policy.editor_paths import COMMANDS, spots

OVERHEAD_CHARS = 4096  # what the program prints besides the file's text (headers, notes): the output cap's margin
MAX_REQUEST_BYTES = 32 << 20  # a request's JSON: file_text is already capped by max_bytes, far below
FIELDS: dict[str, dict[str, type]] = {  # the arguments each command takes beside path, and their JSON types
    "view": {"view_range": list},
    "create": {"file_text": str},
    "str_replace": {"old_str": str, "new_str": str},
    "insert": {"insert_line": int, "insert_text": str},
    "delete": {},
    "rename": {"old_path": str, "new_path": str},
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "create": ("file_text",),
    "str_replace": ("old_str",),
    "insert": ("insert_line", "insert_text"),
}


def build(tool: str, args: dict[str, Any], max_bytes: int, max_chars: int, protect_git: bool) -> bytes | str:
    """The program's stdin for this call, or why it is refused before any box (a sentence for the model)."""
    command = args.get("command")
    if command not in COMMANDS.get(tool, ()):
        return f"unknown command {command!r}; {tool} takes {', '.join(COMMANDS.get(tool, ()))}"
    problem = _shape(command, args)
    if problem:
        return f"{command}: {problem}"
    found = spots(tool, args)
    if isinstance(found, str):
        return found
    first, *rest = found
    request = {
        "tool": tool,
        "command": command,
        "root": first.root,
        "rel": first.rel,
        "shown": first.shown,
        "max_bytes": max_bytes,
        "max_chars": max_chars,
        "git": protect_git,
        **{k: args[k] for k in FIELDS[command] if k in args and k not in ("old_path", "new_path")},
    }
    if rest:  # rename: the destination, in the same folder (editor_paths confines both)
        request |= {"new_rel": rest[0].rel, "new_shown": rest[0].shown}
    data = json.dumps(request).encode()
    if len(data) > MAX_REQUEST_BYTES:
        return f"the request is {len(data):,} bytes; at most {MAX_REQUEST_BYTES:,}"
    return data


def _shape(command: str, args: dict[str, Any]) -> str | None:
    """Why the arguments do not fit the command, or None."""
    missing = [k for k in REQUIRED.get(command, ()) if k not in args]
    if missing:
        return f"missing argument {missing[0]!r}"
    for key, want in FIELDS[command].items():
        if key in args and (not isinstance(args[key], want) or isinstance(args[key], bool)):
            return f"argument {key!r} must be {'a list' if want is list else want.__name__}"
    return None
