"""One wake's diff (sandbox/wakes/wake_diff.py) rendered for a person: a unified diff, as lines.

Text files as `diff -u` would show them; binary and large files by size and
sha256; links by their targets; folders by their mode; a path a later wake
changed since says so instead of a diff. Every line is cleaned of terminal
escapes and control characters (the agent wrote it); the console escapes it
for HTML as it renders (templates/wake.html).

Each line comes with its kind (`DiffLine.kind`: head, add, del, hunk, note,
same) so the console can colour it without parsing it again.

Not here: reading the sides (sandbox/wakes/wake_diff.py), the CLI's --json (the
change set: WakeDiff.change_set).
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.sandbox.containers.output import clean
from orchestrator.sandbox.wakes.wake_diff import PathDiff, Side, WakeDiff

CONTEXT_LINES = 3  # as diff -u
DIFF_TIMEOUT_S = 5.0  # one file's diff; past it the file is shown by size (GNU diff rarely needs 0.2 s)


@dataclass(frozen=True)
class DiffLine:
    kind: str  # head | hunk | add | del | same | note
    text: str


def render(diff: WakeDiff) -> list[DiffLine]:
    when = datetime.fromtimestamp(diff.time, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
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
    names = _label(before, "a", name), _label(after, "b", name)
    lines = _unified(before.text or "", after.text or "", names)
    if lines is None:
        return [
            DiffLine("head", f"--- {names[0]}"),
            DiffLine("head", f"+++ {names[1]}"),
            DiffLine("note", f"(changed in too many places to diff within {DIFF_TIMEOUT_S:g} s: shown by size)"),
            *(DiffLine("del", f"-{line}") for line in _describe(before) if before.type != "none"),
            *(DiffLine("add", f"+{line}") for line in _describe(after) if after.type != "none"),
        ]
    if not lines:  # the same content: a mode change
        return [DiffLine("head", f"file {name}: mode {before.mode:o} -> {after.mode:o}")]
    out = []
    for n, line in enumerate(lines):  # the first two are the names: a line of `---` beneath is a deletion
        kind = "head" if n < 2 else {"@": "hunk", "+": "add", "-": "del", "\\": "note"}.get(line[:1], "same")
        out.append(DiffLine(kind, clean(line)))
    if before.type == after.type == "file" and before.mode != after.mode:
        out.append(DiffLine("note", f"mode {before.mode:o} -> {after.mode:o}"))
    return out


def _unified(old: str, new: str, names: tuple[str, str]) -> list[str] | None:
    """`diff -u` of two texts, as lines (headers first), [] when equal, None past DIFF_TIMEOUT_S.
    GNU diff, not difflib: difflib takes time quadratic in the lines on a file changed in many
    places (10,000 lines with every seventh changed: 34 s), diff's heuristics keep it near
    linear (the same: 5 ms). Both sides end in a newline: only lines are compared."""
    with tempfile.TemporaryDirectory(prefix="wakeloop-diff-") as folder:
        sides = []
        for label, text in zip(("a", "b"), (old, new), strict=True):
            path = Path(folder) / label
            lines = text.splitlines()
            path.write_text("".join(line + "\n" for line in lines), encoding="utf-8", errors="surrogateescape")
            sides.append(str(path))
        argv = ["diff", f"-U{CONTEXT_LINES}", "--label", names[0], "--label", names[1], *sides]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=DIFF_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None
    if done.returncode not in (0, 1):
        raise OSError(f"diff failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode("utf-8", errors="replace").splitlines()


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
