"""One wake's diff (sandbox/wake_diff.py) rendered for a person: a unified diff, as lines.

Text files as `diff -u` would show them; binary and large files by size and
sha256; links by their targets; folders by their mode; a path a later wake
changed since says so instead of a diff. Every line is cleaned of terminal
escapes and control characters (the agent wrote it); the console escapes it
for HTML as it renders (templates/wake.html).

Each line comes with its kind (`DiffLine.kind`: head, add, del, hunk, note,
same) so the console can colour it without parsing it again.

Not here: reading the sides (sandbox/wake_diff.py), the CLI's --json (the
change set: WakeDiff.change_set).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import datetime, timezone

from orchestrator.sandbox.output import clean
from orchestrator.sandbox.wake_diff import PathDiff, Side, WakeDiff

CONTEXT_LINES = 3  # as diff -u


@dataclass(frozen=True)
class DiffLine:
    kind: str  # head | hunk | add | del | same | note
    text: str


def render(diff: WakeDiff) -> list[DiffLine]:
    when = datetime.fromtimestamp(diff.time, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    out = [
        DiffLine(
            "note",
            f"wake {diff.run_id}: {len(diff.paths)} change(s), committed {when}"
            + ("" if diff.state == "committed" else f"; {diff.state}"),
        )
    ]
    for path in diff.paths:
        out += _path(path)
    return out


def render_text(diff: WakeDiff) -> str:
    return "".join(line.text + "\n" for line in render(diff))


def _path(p: PathDiff) -> list[DiffLine]:
    name, change = clean(p.change.path), p.change
    if p.since:
        who = (
            "outside any wake's commit"
            if p.since == "changed since"
            else f"by wake {p.since} (`wakeloop diff AGENT_DIR --run {p.since}`)"
        )
        return [DiffLine("note", f"{change.kind} {name}: changed since {who}; this wake's diff of it is not shown")]
    if "dir" in (p.before.type, p.after.type) and p.before.type in ("dir", "none") and p.after.type in ("dir", "none"):
        return [DiffLine("head", f"folder {name}: {_folder(p.before, p.after)}")]
    if p.before.type in ("file", "none") and p.after.type in ("file", "none") and _both_text(p.before, p.after):
        return _text_diff(name, p.before, p.after)
    return [
        DiffLine("head", f"--- {_label(p.before, 'a', name)}"),
        DiffLine("head", f"+++ {_label(p.after, 'b', name)}"),
        *(DiffLine("del", f"-{line}") for line in _describe(p.before) if p.before.type != "none"),
        *(DiffLine("add", f"+{line}") for line in _describe(p.after) if p.after.type != "none"),
    ]


def _text_diff(name: str, before: Side, after: Side) -> list[DiffLine]:
    old = (before.text or "").splitlines()
    new = (after.text or "").splitlines()
    names = _label(before, "a", name), _label(after, "b", name)
    lines = list(difflib.unified_diff(old, new, *names, lineterm="", n=CONTEXT_LINES))
    if not lines:  # the same content: a mode change
        return [DiffLine("head", f"file {name}: mode {before.mode:o} -> {after.mode:o}")]
    out = []
    for line in lines:
        kind = "head" if line[:3] in ("---", "+++") else {"@": "hunk", "+": "add", "-": "del"}.get(line[:1], "same")
        out.append(DiffLine(kind, clean(line)))
    if before.type == after.type == "file" and before.mode != after.mode:
        out.append(DiffLine("note", f"mode {before.mode:o} -> {after.mode:o}"))
    return out


def _both_text(before: Side, after: Side) -> bool:
    return all(s.type == "none" or s.text is not None for s in (before, after))


def _label(side: Side, prefix: str, name: str) -> str:
    return "/dev/null" if side.type == "none" and not side.note else f"{prefix}/{name}"


def _describe(side: Side) -> list[str]:
    """A side that is not shown as text, in one line."""
    if side.type == "none":
        return [f"(nothing{': ' + side.note if side.note else ''})"]
    if side.type == "link":
        return [f"(link to {clean(side.target or '')!r}, not followed)"]
    if side.type == "file" and side.sha256:
        return [f"(file, {side.size:,} bytes, sha256 {side.sha256}, mode {side.mode:o}; {side.note or 'binary'})"]
    if side.type == "file":
        return [f"(file{'; ' + clean(side.note) if side.note else ''})"]
    return [f"({side.type}{'; ' + clean(side.note) if side.note else ''})"]


def _folder(before: Side, after: Side) -> str:
    if before.type == "none":
        return f"added (mode {after.mode:o})"
    if after.type == "none":
        return "deleted"
    return f"mode {before.mode:o} -> {after.mode:o}"
