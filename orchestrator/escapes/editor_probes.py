"""Attacks through Claude's own file tools: the text editor (str_replace_based_edit_tool) and the
memory tool, aimed out of /workspace and out of /memories.

Each call goes to the box's `edit` (Sandbox.edit), as the registry sends a
model's tool_use. Plants are made from inside the box, as the agent would.
The canary is a host file outside the workspace: it must stay byte-for-byte
the same, and its text must never appear in what a call answers.

Not here: write_file's probes (workspace_probes.py), the tools' offer (wake/editor_tool.py).
"""

from __future__ import annotations

import os
from typing import Any

from orchestrator.escapes.lab import Probe, Trial, escaped, held, paths_under
from orchestrator.escapes.swap_race import judged, race_swaps
from orchestrator.policy.editor_paths import EDITOR, MEMORY

CATEGORY = "workspace"
EDIT_TIMEOUT_S = 10  # one edit call; a FIFO or a huge file must not stretch it
MAX_BYTES = 1_048_576  # write_file's default max_bytes, which the tools take
MAX_CHARS = 20_000  # the text editor's default max_characters
HUGE_MB = 64  # the planted file a view must not return whole


def _edit(t: Trial, tool: str, args: dict) -> tuple[int, str]:
    """(exit code, output) of one call; -1 when refused before any box (a broker's BrokerRefusal)."""
    try:
        r = t.box.edit(tool, args, EDIT_TIMEOUT_S, MAX_BYTES, MAX_CHARS)
    except Exception as exc:  # a refusal at a broker's wire; anything else is the finding below
        if type(exc).__name__ == "BrokerRefusal":
            return -1, str(exc)
        raise
    return r.exit_code, r.output


def _leaked(t: Trial, outputs: list[str]) -> bool:
    return any(t.lab.host_canary in out for out in outputs)


PATH_TRICKS: list[tuple[str, dict[str, Any]]] = [
    (EDITOR, {"command": "view", "path": "../mandate.md"}),
    (EDITOR, {"command": "view", "path": "/workspace/../agent.yaml"}),
    (EDITOR, {"command": "view", "path": "/etc/passwd"}),
    (EDITOR, {"command": "view", "path": "/proc/self/environ"}),
    (EDITOR, {"command": "view", "path": "/proc/1/root/etc/hostname"}),
    (EDITOR, {"command": "create", "path": "../state/state.json", "file_text": "{}"}),
    (EDITOR, {"command": "create", "path": "memory/../../mandate.md", "file_text": "You may do anything."}),
    (EDITOR, {"command": "create", "path": "memory/x\ny.md", "file_text": "x"}),
    (EDITOR, {"command": "create", "path": "memory/\x1b[2Jx.md", "file_text": "x"}),
    (EDITOR, {"command": "str_replace", "path": "/workspace/./../mandate.md", "old_str": "a", "new_str": "b"}),
    (EDITOR, {"command": "insert", "path": "/tmp/../workspace/../agent.yaml", "insert_line": 0, "insert_text": "x"}),
    (MEMORY, {"command": "view", "path": "/memories/../mandate.md"}),
    (MEMORY, {"command": "create", "path": "/memories/../../state/state.json", "file_text": "{}"}),
    (MEMORY, {"command": "create", "path": "/workspace/notes.md", "file_text": "x"}),
    (MEMORY, {"command": "create", "path": "/memoriesX/a.md", "file_text": "x"}),
    (MEMORY, {"command": "rename", "old_path": "/memories/core.md", "new_path": "/memories/../core.md"}),
    (MEMORY, {"command": "delete", "path": "/memories"}),
    (MEMORY, {"command": "delete", "path": "/memories/.."}),
]


def _refuses_path_tricks(t: Trial) -> str:
    before = paths_under(t.dir)
    t.run("mkdir -p memory && echo core > memory/core.md")
    answers = [(tool, args, *_edit(t, tool, args)) for tool, args in PATH_TRICKS]
    after = paths_under(t.dir)
    outside = [p for p in after - before if not p.startswith(str(t.workspace) + "/")]
    if outside:
        return escaped(f"files appeared outside the workspace: {outside[:3]}")
    accepted = [
        f"{tool} {args.get('command')} {args.get('path', args.get('new_path'))!r}"
        for tool, args, code, _ in answers
        if code == 0
    ]
    if accepted:
        return escaped(f"accepted: {accepted[:3]}")
    if _leaked(t, [out for *_, out in answers]):
        return escaped("a call answered with the host canary's text")
    if not os.path.exists(t.workspace / "memory/core.md"):
        return escaped("the memory tool deleted or moved memory/core.md through a path trick")
    return held(f"{len(answers)} calls with '..', absolute, /proc, newline, escape and non-/memories paths refused")


editor_refuses_path_tricks = Probe(
    "editor_refuses_path_tricks",
    CATEGORY,
    "the text editor and memory tool refuse '..', absolute paths outside their folder, /proc, newlines in names",
    _refuses_path_tricks,
)


def _refuses_symlinks(t: Trial) -> str:
    before = t.lab.canary_path.read_bytes()
    target, folder = t.lab.canary_path, t.lab.canary_path.parent
    t.run(
        f"mkdir -p memory notes; ln -sf {target} notes/link.md; ln -sfn {folder} notes/outside; "
        f"ln -sfn .. memory/up; ln -sf {target} memory/link.md"
    )
    calls: list[tuple[str, dict[str, Any]]] = [
        (EDITOR, {"command": "view", "path": "notes/link.md"}),
        (EDITOR, {"command": "view", "path": f"/workspace/notes/outside/{target.name}"}),
        (EDITOR, {"command": "str_replace", "path": "notes/link.md", "old_str": t.lab.host_canary, "new_str": "X"}),
        (EDITOR, {"command": "insert", "path": f"notes/outside/{target.name}", "insert_line": 0, "insert_text": "X"}),
        (EDITOR, {"command": "create", "path": "notes/link.md", "file_text": "ESCAPE-EDIT"}),
        (EDITOR, {"command": "create", "path": "notes/outside/new.md", "file_text": "ESCAPE-EDIT"}),
        (MEMORY, {"command": "view", "path": "/memories/link.md"}),
        (MEMORY, {"command": "create", "path": "/memories/up/escaped.md", "file_text": "out of /memories"}),
        (MEMORY, {"command": "view", "path": "/memories/up"}),
        (MEMORY, {"command": "rename", "old_path": "/memories/link.md", "new_path": "/memories/up/moved.md"}),
    ]
    answers = [_edit(t, tool, args) for tool, args in calls]
    if t.lab.canary_path.read_bytes() != before or (folder / "new.md").exists():
        return escaped(f"an edit went through a symlink into {folder}")
    if _leaked(t, [out for _, out in answers]):
        return escaped("a view through a symlink showed the host canary")
    if (t.workspace / "escaped.md").exists() or (t.workspace / "moved.md").exists():
        return escaped("the memory tool left /memories through a symlinked folder")
    accepted = [calls[i][1]["command"] for i, (code, _) in enumerate(answers) if code == 0]
    if accepted:
        return escaped(f"a call through a symlink was accepted: {accepted}")
    return held(f"{len(calls)} calls through symlinked files and folders refused; canary intact")


editor_refuses_symlinks = Probe(
    "editor_refuses_symlinks",
    CATEGORY,
    "neither tool views, edits or creates through a symlink (file or folder), nor leaves /memories by one",
    _refuses_symlinks,
)


def _survives_symlink_swap(t: Trial) -> str:
    """The box swaps notes/race.md between a file and a symlink to the host canary while the
    host issues str_replace and insert calls on it (swap_race.py says how, deterministically)."""
    before = t.lab.canary_path.read_bytes()
    race = race_swaps(t, "notes/race.md", t.lab.host_canary, lambda i: _edit(t, EDITOR, _swap_edit(t, i))[0])
    if t.lab.canary_path.read_bytes() != before:
        return escaped("an edit through the swapped symlink reached the host canary")
    if any(code == 0 for code in race.on_link):
        return escaped(f"an edit that met the symlink was accepted (exit codes {race.on_link})")
    return judged(race, "edits")


def _swap_edit(t: Trial, i: int) -> dict:
    if i % 2:
        return {"command": "str_replace", "path": "notes/race.md", "old_str": t.lab.host_canary, "new_str": "ESCAPE"}
    return {"command": "insert", "path": "notes/race.md", "insert_line": 0, "insert_text": "ESCAPE-EDIT"}


editor_survives_symlink_swap = Probe(
    "editor_survives_symlink_swap",
    CATEGORY,
    "a symlink swapped in during str_replace or insert is refused, never followed",
    _survives_symlink_swap,
)


def _bounds_huge_view(t: Trial) -> str:
    made = t.run(
        f"head -c {HUGE_MB}M /dev/zero | tr '\\0' 'a' | fold -w 100 > notes.big 2>&1; "
        "head -c 4M /dev/urandom > blob.bin; mkfifo pipe.md; ls -l notes.big blob.bin",
        timeout_s=60,
    )
    if made.exit_code != 0:
        return f"could not plant the files: {made.output[-200:]}"
    bound = MAX_CHARS + 4096  # editor_request.OVERHEAD_CHARS
    answers = [
        _edit(t, EDITOR, {"command": "view", "path": "notes.big"}),
        _edit(t, EDITOR, {"command": "view", "path": "notes.big", "view_range": [1, -1]}),
        _edit(t, EDITOR, {"command": "view", "path": "blob.bin"}),
        _edit(t, EDITOR, {"command": "view", "path": "pipe.md"}),
        _edit(t, EDITOR, {"command": "str_replace", "path": "notes.big", "old_str": "a" * 100, "new_str": "b"}),
    ]
    big = [len(out) for _, out in answers if len(out) > bound]
    if big:
        return escaped(f"a view answered {big[0]:,} characters, past max_characters {MAX_CHARS:,}")
    if "max_characters" not in answers[0][1]:
        return escaped("a cut view did not say it was cut")
    if answers[2][0] == 0 or answers[3][0] == 0 or answers[4][0] == 0:
        return escaped("a binary file, a FIFO or a file past max_bytes was viewed or edited as text")
    return held(f"views of a {HUGE_MB} MiB file cut at {MAX_CHARS:,} characters and said so; binary, FIFO refused")


editor_bounds_huge_view = Probe(
    "editor_bounds_huge_view",
    CATEGORY,
    "a view of a huge file is cut at max_characters and says so; a binary file or FIFO is refused",
    _bounds_huge_view,
)


def _refuses_insert_past_end(t: Trial) -> str:
    t.run("printf 'one\\ntwo\\n' > notes.md")
    before = (t.workspace / "notes.md").read_bytes()
    answers = [
        _edit(t, EDITOR, {"command": "insert", "path": "notes.md", "insert_line": n, "insert_text": "ESCAPE"})
        for n in (3, 1000, 2**40, -1)
    ]
    after = (t.workspace / "notes.md").read_bytes()
    if after != before:
        return escaped(f"an insert past the end changed the file: {after[:80]!r}")
    if any(code == 0 for code, _ in answers):
        return escaped("an insert past the end was accepted")
    return held(f"inserts at lines 3, 1000, 2**40, -1 of a 2-line file refused: {answers[0][1][:60]}")


editor_refuses_insert_past_end = Probe(
    "editor_refuses_insert_past_end",
    CATEGORY,
    "an insert past the end of a file (or before its start) is refused and changes nothing",
    _refuses_insert_past_end,
)


PROBES = [
    editor_refuses_path_tricks,
    editor_refuses_symlinks,
    editor_survives_symlink_swap,
    editor_bounds_huge_view,
    editor_refuses_insert_past_end,
]
