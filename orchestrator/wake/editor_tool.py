"""Claude's own file tools, offered under their Anthropic-defined types: the model's training applies.

`str_replace_based_edit_tool` (text_editor_20250728: view with view_range,
str_replace, create, insert) works in /workspace; `memory` (memory_20250818:
view, create, str_replace, insert, delete, rename) works in /memories, which
is the workspace's memory/ folder (core.md and the journal included), so what
it writes is what the next wake's context reads. Each call runs in a fresh
box exactly as write_file does (Sandbox.edit: the same walk without following
links, the same size cap, protect_git; the wake's transaction and
workspace.protect at its end), after the policy's checks here
(policy/editor_paths.py: the tool's folder, write_file's globs) and the
approval gate (a `tool: write_file` paths rule asks about their writes too).

The box's program answers with the tools' documented texts (no match, several
matches, insert_line out of range) as `is_error` results; an edit's detail
carries a small diff (`edit_diff`) for the transcript and the console.

Not here: the registry and the other tools (tools.py), the program in the box
(sandbox/containers/in_box/edit.py), its request (sandbox/containers/editor_request.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.policy import editor_paths
from orchestrator.policy.editor_paths import EDITOR, EDITOR_TYPE, MEMORY, MEMORY_TYPE
from orchestrator.policy.schema import Policy
from orchestrator.sandbox.box import Sandbox
from orchestrator.wake.tool_result import Tool, ToolResult, denied, sandbox_detail

DIFF_MAX_LINES = 40  # of one edit's diff in the event log and transcript: an edit, not a blob
DIFF_MAX_LINE_CHARS = 200
_TEXT = {"type": "string"}
EDITOR_SCHEMA = {
    "type": "object",
    "properties": {
        "command": _TEXT,
        "path": _TEXT,
        "view_range": {"type": "array"},
        "old_str": _TEXT,
        "new_str": _TEXT,
        "file_text": _TEXT,
        "insert_line": {"type": "integer"},
        "insert_text": _TEXT,
    },
    "required": ["command", "path"],
}
MEMORY_SCHEMA = {
    "type": "object",
    "properties": {**EDITOR_SCHEMA["properties"], "old_path": _TEXT, "new_path": _TEXT},  # type: ignore[dict-item]
    "required": ["command"],
}


def editor_tools(policy: Policy, sandbox: Sandbox | None, timeout: Callable[[float], float]) -> list[Tool]:
    """The two tools for one wake; `timeout` cuts a call's to the wake's time left."""
    t = policy.tools
    return [
        Tool(
            EDITOR,
            "Claude's text editor (text_editor_20250728) over /workspace: view, str_replace, create, insert.",
            EDITOR_SCHEMA,
            _Calls(policy, sandbox, timeout, EDITOR).call,
            t.text_editor.enabled,
            "the text editor is disabled by this agent's policy",
            offered={"type": EDITOR_TYPE, "name": EDITOR, "max_characters": t.text_editor.max_characters},
        ),
        Tool(
            MEMORY,
            "Claude's memory tool (memory_20250818): /memories is the workspace's memory/ folder.",
            MEMORY_SCHEMA,
            _Calls(policy, sandbox, timeout, MEMORY).call,
            t.memory.enabled,
            "the memory tool is disabled by this agent's policy",
            offered={"type": MEMORY_TYPE, "name": MEMORY},
        ),
    ]


class _Calls:
    def __init__(self, policy: Policy, sandbox: Sandbox | None, timeout: Callable[[float], float], tool: str):
        self.policy, self.sandbox, self.timeout, self.tool = policy, sandbox, timeout, tool

    def call(self, args: dict[str, Any]) -> ToolResult:
        cfg = self.policy.tools.text_editor if self.tool == EDITOR else self.policy.tools.memory
        rules = self.policy.tools.write_file
        reason = editor_paths.refusal(rules, self.tool, args)
        if reason:
            return denied(f"{self.tool} {args.get('command')}: {reason}")
        assert self.sandbox is not None  # a registry built without one only lists its tools
        result = self.sandbox.edit(
            self.tool,
            args,
            timeout_s=self.timeout(cfg.timeout_s),
            max_bytes=rules.max_bytes,
            max_chars=cfg.max_characters,
            protect_git=rules.protect_git,
        )
        detail = sandbox_detail(result) | {"command": str(args.get("command"))}
        diff = edit_diff(self.tool, args) if result.ok else ""
        if diff:
            detail["diff"] = diff
        if result.no_room:  # the disk guard did not start it: the wake records it and tells the operator
            return ToolResult(text=result.for_model(), is_error=True, detail=detail | {"no_room": result.no_room})
        plain = not (result.timed_out or result.oom_killed or result.stopped or result.truncated)
        return ToolResult(text=result.output if plain else result.for_model(), is_error=not result.ok, detail=detail)


def call_diff(name: str, args: object) -> str:
    """A tool_use block's input as a diff when it is a text editor or memory edit, else ""
    (views/logview.py and the console show an edit so, not as a JSON blob)."""
    return edit_diff(name, args) if name in (EDITOR, MEMORY) and isinstance(args, dict) else ""


def edit_diff(tool: str, args: dict[str, Any]) -> str:
    """A str_replace or insert as a few `diff -u`-like lines (the transcript's and console's view of an
    edit); "" for the other commands. Capped: the model's input is kept whole in the transcript."""
    command, path = args.get("command"), str(args.get("path", ""))
    if command == "str_replace":
        old, new = str(args.get("old_str", "")), str(args.get("new_str", ""))
        lines = [f"--- {path}", f"+++ {path}"] + [f"-{x}" for x in old.split("\n")] + [f"+{x}" for x in new.split("\n")]
    elif command == "insert":
        text = str(args.get("insert_text", "")).removesuffix("\n")
        lines = [f"--- {path}", f"+++ {path}", f"@@ after line {args.get('insert_line')} @@"]
        lines += [f"+{x}" for x in text.split("\n")]
    else:
        return ""
    cut = [x if len(x) <= DIFF_MAX_LINE_CHARS else x[:DIFF_MAX_LINE_CHARS] + "…" for x in lines[:DIFF_MAX_LINES]]
    if len(lines) > DIFF_MAX_LINES:
        cut.append(f"… {len(lines) - DIFF_MAX_LINES} more lines")
    return "\n".join(cut)
