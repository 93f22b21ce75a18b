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
import subprocess
import threading
import time
from typing import Any

from orchestrator.escapes.lab import Probe, Trial, escaped, held
from orchestrator.policy.editor_paths import EDITOR, MEMORY
from orchestrator.sandbox.containers.deadline import KILL_GRACE_S

CATEGORY = "workspace"
EDIT_TIMEOUT_S = 10  # one edit call; a FIFO or a huge file must not stretch it
MAX_BYTES = 1_048_576  # write_file's default max_bytes, which the tools take
MAX_CHARS = 20_000  # the text editor's default max_characters
HUGE_MB = 64  # the planted file a view must not return whole
LINK_EDITS = 4  # edits made while the box holds the symlink in place (str_replace and insert)
RACED_EDITS = 4  # edits that must overlap a whole file/link flip of the box's fastest swaps
MAX_RACE_EDITS = 16  # edits tried at most to get those
HANDOFF_S = 60  # the box's turn in the hand-off (a new container on a loaded engine), at most
SWAP_LIMIT_S = 300  # the swapper's own end, should the host's side never say stop


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
    before = _tree(t.dir)
    t.run("mkdir -p memory && echo core > memory/core.md")
    answers = [(tool, args, *_edit(t, tool, args)) for tool, args in PATH_TRICKS]
    after = _tree(t.dir)
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


def _swapper(t: Trial) -> str:
    """The box's side of the swap, handing off through files in notes/: for each of LINK_EDITS
    rounds it puts the link in place, says so in notes/state and holds it until the host's
    swap-ack.N; then it flips file and link as fast as it can, counting whole flips in
    notes/flips, until swap-stop, which also ends a hold (a probe that gave up). The host's
    markers are at the workspace's top: notes/ is the box's, which the host must not make."""
    return (
        f"end=$((SECONDS+{SWAP_LIMIT_S})); mkdir -p notes; "
        f"link() {{ ln -sfn {t.lab.canary_path} notes/race.tmp && mv -fT notes/race.tmp notes/race.md; }}; "
        f"file() {{ echo {t.lab.host_canary} > notes/race.tmp2 && mv -fT notes/race.tmp2 notes/race.md; }}; "
        "put() { echo $2 > notes/$1.tmp && mv -fT notes/$1.tmp notes/$1; }; "
        'late() { [ $SECONDS -ge $end ] && echo "swapper out of time" && exit 3; }; '
        f"for i in $(seq 1 {LINK_EDITS}); do link; put state link-$i; "
        "until [ -e swap-ack.$i ] || [ -e swap-stop ]; do late; sleep 0.02; done; file; done; "
        "n=0; until [ -e swap-stop ]; do late; link; file; n=$((n+1)); put flips $n; done; echo swapped $n"
    )


def _marker(t: Trial, name: str) -> str:
    try:
        return (t.workspace / "notes" / name).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _flips(t: Trial) -> int:
    text = _marker(t, "flips")
    return int(text) if text.isdigit() else 0


def _swap_edit(t: Trial, i: int) -> dict:
    if i % 2:
        return {"command": "str_replace", "path": "notes/race.md", "old_str": t.lab.host_canary, "new_str": "ESCAPE"}
    return {"command": "insert", "path": "notes/race.md", "insert_line": 0, "insert_text": "ESCAPE-EDIT"}


def _edits_on_the_link(t: Trial) -> tuple[list[tuple[int, str]], str]:
    """One edit per round while the swapper provably holds the link in place (it waits for
    our ack): whatever the timing, each of these edits meets the symlink."""
    race = t.workspace / "notes" / "race.md"
    answers: list[tuple[int, str]] = []
    for i in range(1, LINK_EDITS + 1):
        if not _wait_for(lambda i=i: _marker(t, "state") == f"link-{i}", HANDOFF_S):
            return answers, f"the swapper never put the link in place for round {i}"
        if not race.is_symlink():
            return answers, f"round {i}: notes/race.md is not the link the swapper said it placed"
        answers.append(_edit(t, EDITOR, _swap_edit(t, i)))
        (t.workspace / f"swap-ack.{i}").touch()
    return answers, ""


def _edits_in_the_race(t: Trial) -> tuple[int, int, list[tuple[int, str]]]:
    """Edits while the swapper flips, until RACED_EDITS of them provably overlapped a whole
    flip (file → link → file counted twice over during the call), MAX_RACE_EDITS at most."""
    raced = 0
    answers: list[tuple[int, str]] = []
    while raced < RACED_EDITS and len(answers) < MAX_RACE_EDITS:
        before = _flips(t)
        answers.append(_edit(t, EDITOR, _swap_edit(t, len(answers))))
        raced += _flips(t) - before >= 2
    return raced, len(answers), answers


def _survives_symlink_swap(t: Trial) -> str:
    """The box swaps notes/race.md between a file and a symlink to the host canary while the
    host issues str_replace and insert calls on it: first edits made while the link is
    provably in place (handed off through files), then edits racing the box's fastest swaps."""
    before = t.lab.canary_path.read_bytes()
    swap_out: list = []
    worker = threading.Thread(
        target=lambda: swap_out.append(t.new_box().run(_swapper(t), SWAP_LIMIT_S + 10, 2000)), daemon=True
    )
    worker.start()
    try:
        on_link, stuck = _edits_on_the_link(t)
        raced, racing, in_race = _edits_in_the_race(t) if not stuck else (0, 0, [])
    finally:
        (t.workspace / "swap-stop").touch()
        worker.join(SWAP_LIMIT_S + 10 + KILL_GRACE_S)
    if t.lab.canary_path.read_bytes() != before:
        return escaped("an edit through the swapped symlink reached the host canary")
    if any(code == 0 for code, _ in on_link):
        return escaped(f"an edit that met the symlink was accepted: {[out[:80] for _, out in on_link]}")
    if stuck or not swap_out or "swapped" not in swap_out[0].output:
        why = swap_out[0].output[-200:] if swap_out else "no result"
        return f"the swapper did not run its course: {stuck}; it said: {why}"
    if raced < RACED_EDITS:
        return f"too little raced to judge: {raced} of {racing} edits overlapped a whole flip"
    landed = sum(code == 0 for code, _ in in_race)
    return held(
        f"{len(on_link)} edits met the link in place, all refused; {raced} of {racing} edits raced whole "
        f"flips: {landed} landed in the regular file, {racing - landed} refused; canary intact"
    )


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


def _tree(top) -> set[str]:
    """Every path under `top` (find(1): deep trees are deeper than Python recursion)."""
    out = subprocess.run(["find", str(top), "-xdev"], capture_output=True, text=True, check=False).stdout
    return set(out.splitlines())


def _wait_for(condition, seconds: float) -> bool:
    """Poll `condition` until it holds or `seconds` pass (no blind sleep)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


PROBES = [
    editor_refuses_path_tricks,
    editor_refuses_symlinks,
    editor_survives_symlink_swap,
    editor_bounds_huge_view,
    editor_refuses_insert_past_end,
]
