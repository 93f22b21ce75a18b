"""Reading a wake for a person: a transcript rendered, a running wake followed, a fleet's events tailed.

`wakeloop log AGENT --run ID` (or `wakeloop transcript AGENT [ID]`) renders
records/transcript.py's lines: who spoke, what ran, exit codes, timings,
cost; a text editor or memory str_replace/insert as a small diff. `-f`
follows the newest transcript until its `end` line; `wakeloop log ROOT`
follows every agent's events.jsonl, a line per event prefixed by the
agent's name. Everything the model or a command wrote is untrusted: cleaned
of escape sequences (sandbox/output.clean) before it reaches a terminal.

Following polls a file for growth (POLL_S) rather than using inotify: it is
portable, costs nothing measurable at this rate, and a half-written last
line is simply read again next time.

Not here: the transcript's format and caps (records/transcript.py), the
event log's one-line rendering (eventview.format_event).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from orchestrator.fleet.schedule import agent_dirs
from orchestrator.records.events import EVENTS_FILE, parse_event
from orchestrator.records.receipt import Usage
from orchestrator.records.retention import LINE_CAP, holder
from orchestrator.records.transcript import parse_line, prompt_text
from orchestrator.safeio.shown import shown
from orchestrator.sandbox.containers.output import clean
from orchestrator.views.eventview import format_event
from orchestrator.wake.editor_tool import call_diff

POLL_S = 0.2  # how often a followed file is looked at again
INPUT_CAP = 4000  # chars of one tool input shown (the JSON lines keep it whole)


def render_line(line: dict) -> str:
    """One transcript line as a few readable lines of text."""
    kind, t = line["type"], str(line.get("t", ""))[11:23]
    step = f"step {line['step']} " if "step" in line else ""
    if kind == "wake":
        return (
            f"{t} == wake #{line.get('wake')} of {line.get('agent')}, run {line.get('run_id')}, "
            f"model {line.get('model')}, {'live' if line.get('live') else 'dry run'}"
        )
    if kind == "system":
        return f"{t} -- system prompt {line.get('hash')} ({line.get('chars', 0):,} chars; --system shows it)"
    if kind == "user":
        return f"{t} {step}harness/human >\n{_indent(line.get('text', ''))}"
    if kind == "assistant":
        return _assistant(t, step, line)
    if kind == "tool_result":
        head = f"exit {line['exit_code']}" if "exit_code" in line else "error" if line.get("is_error") else "ok"
        took = f", {line['duration_ms'] / 1000:.1f}s" if isinstance(line.get("duration_ms"), (int, float)) else ""
        return f"{t} {step}{line.get('tool')} <- {head}{took}\n{_indent(line.get('text', ''))}"
    if kind == "approval":  # a call a person decided on, told at the start of this wake (approval_gate.py)
        who = f" by {line.get('decided_by')} at {line.get('decided_at')}" if line.get("decided_by") else ""
        args = shown(json.dumps(line.get("input"), ensure_ascii=False))[:INPUT_CAP]  # the call as it ran
        said = line.get("result") or line.get("reason") or ""
        return f"{t} approval {line.get('id')} {line.get('status')}{who}: {line.get('tool')} {args}\n{_indent(said)}"
    if kind == "truncated":
        return (
            f"{t} -- the transcript reached max_wake_bytes ({line.get('max_wake_bytes', 0):,}): "
            "the rest is counted, not kept"
        )
    if kind == "end":
        dropped = f"; {line['dropped_lines']} line(s) not kept" if line.get("dropped_lines") else ""
        return (
            f"{t} == {line.get('status')}: {clean(str(line.get('reason', '')))}; {line.get('steps')} steps, "
            f"{line.get('tokens', 0):,} tokens, {line.get('tool_calls')} tool calls, "
            f"{_cost(line.get('usd'))}, {line.get('duration_ms', 0) / 1000:.1f}s{dropped}"
        )
    return f"{t} {kind} {clean(json.dumps(line, ensure_ascii=False))[:INPUT_CAP]}"


def _assistant(t: str, step: str, line: dict) -> str:
    out = []
    for block in line.get("content") or []:
        if block.get("type") == "text":
            out.append(_indent(block.get("text", "")))
        elif block.get("type") == "thinking":  # a 5.x model's words between tool calls come back as these
            out.append(_indent(f"(thinking) {block.get('thinking')}" if block.get("thinking") else THINKING_OMITTED))
        elif block.get("type") == "tool_use":
            diff = call_diff(str(block.get("name")), block.get("input"))
            args = json.dumps(block.get("input"), ensure_ascii=False)
            out.append(f"  -> {block.get('name')} {clean(args)[:INPUT_CAP]}" if not diff else _edit(block, diff))
    tokens = Usage.from_json(line.get("usage")).tokens  # any version's names (receipt.OLD_NAMES)
    head = f"{t} {step}model > ({line.get('stop_reason')}, {tokens:,} tokens, ${line.get('usd_so_far', 0):.4f} so far)"
    return "\n".join([head, *out])


def _edit(block: dict, diff: str) -> str:
    """A text editor or memory str_replace/insert as the edit it is: its command, then a small diff."""
    return f"  -> {block.get('name')} {clean(str(block['input'].get('command')))}\n" + "\n".join(
        "     " + row for row in clean(diff).splitlines()
    )


THINKING_OMITTED = "(thinking, not shown: the model was not asked for a summary)"


def _indent(text: str) -> str:
    return "\n".join("  " + row for row in clean(str(text)).splitlines()) or "  (empty)"


def render_transcript(lines: list[dict], state_dir: Path, system: bool = False) -> Iterator[str]:
    for line in lines:
        yield render_line(line)
        if system and line["type"] == "system":
            yield _indent(prompt_text(state_dir, str(line.get("hash"))) or "(the prompt's text was pruned)")


# -- following ------------------------------------------------------------------


class Tail:
    """New complete lines of one file, from an offset; a missing file is empty for now."""

    def __init__(self, path: Path, from_end: bool = False):
        self.path, self.offset = path, 0
        if from_end:
            try:
                self.offset = path.stat().st_size
            except OSError:
                pass

    def lines(self) -> list[str]:
        try:
            folder, name = holder(self.path)  # safeio/folder.py: no link followed, never a FIFO
            with folder.reader(name) as f:
                f.seek(self.offset)
                data = f.read(LINE_CAP)  # a look reads at most this: a planted 100 GB file costs no more
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next look
        if end == 0 and len(data) == LINE_CAP:
            end = len(data)  # no line of ours is that long: skipped
        self.offset += end
        return data[:end].decode("utf-8", errors="replace").splitlines()


def follow_transcript(path: Path, out: Callable[[str], None], stop: Callable[[], bool] = lambda: False) -> None:
    """Print a transcript as it grows, until its `end` line (or `stop`)."""
    tail = Tail(path)
    while not stop():
        for raw in tail.lines():
            line = parse_line(raw)
            if line is not None:
                out(render_line(line))
                if line["type"] == "end":
                    return
        time.sleep(POLL_S)


def follow_root(root: Path, out: Callable[[str], None], stop: Callable[[], bool] = lambda: False) -> None:
    """Every agent's new events under ROOT, a line each, prefixed by the agent's folder name.
    Agents added while following are picked up from their first event."""
    tails: dict[Path, Tail] = {d: Tail(d / "state" / EVENTS_FILE, from_end=True) for d in agent_dirs(root)}
    while not stop():
        for d in agent_dirs(root):
            tails.setdefault(d, Tail(d / "state" / EVENTS_FILE))
        for d, tail in tails.items():
            for raw in tail.lines():
                event = parse_event(raw)
                if event is not None:
                    out(f"{d.name:<16} {format_event(event)}")
        time.sleep(POLL_S)


def _cost(usd) -> str:
    """None is a cost that is not known (a model with no price), never $0."""
    return f"${usd:.4f}" if isinstance(usd, (int, float)) else "cost unknown"
