"""One tool step: each tool_use block of a model turn run through the registry and answered,
every part of it recorded the moment it happens: a `tool_call` event, the registry's call in
a trace span, `policy_denied` for a refusal, `disk_no_room` for the wake's first call the disk
guard did not start, a `tool_result` event, the transcript's line, a progress line. Steps 3
and 15 of one tool call's travel (docs/architecture.md §6).

A stopping wake (its stop, its wall clock, the fleet's switch) runs no further call of the
turn, and answers each: the API refuses a tool_use block left without its tool_result.

Not here: what a tool does (tools.py), a call that waits for a person (approval_gate.py),
whether a turn's calls are run at all (loop.py, stop_reasons.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator import tracing
from orchestrator.records import event_types as ev
from orchestrator.records import transcript as tr
from orchestrator.records.events import EventLog
from orchestrator.wake.model import Block, Turn
from orchestrator.wake.progress import short
from orchestrator.wake.tally import Tally
from orchestrator.wake.tool_result import ToolResult, error
from orchestrator.wake.tools import Registry

EVENT_INPUT_CAP = 2000  # chars per tool argument kept in the event log


@dataclass
class ToolStep:
    """What running a turn's calls needs from its wake."""

    registry: Registry
    events: EventLog
    transcript: tr.Transcript
    say: Callable[[str], None]
    tally: Tally  # its tool_calls counted here; its steps name the step
    stopping: Callable[[], bool]  # the wake is stopping: no further call runs
    no_room: Callable[[str], None]  # a call the disk guard did not start (the wake tells it once)

    def run_tools(self, turn: Turn) -> list[Block]:
        """Every tool_use block, in order, each answered; a stop skips the rest, answered too."""
        results = []
        for call in turn.tool_uses:
            if self.stopping():
                results.append(error("not run: the wake is stopping").to_anthropic(call["id"]))
                continue
            result = self._run(call, _words_before(turn.content, call["id"]))
            results.append(result.to_anthropic(call["id"]))
        return results

    def _run(self, call: Block, words: str) -> ToolResult:
        step, call_id = self.tally.steps, call["id"]
        self.tally.tool_calls += 1
        name, args = call.get("name", ""), call.get("input")
        self.events.write(ev.ToolCall(step=step, id=call_id, tool=name, input=_for_log(args)))
        self.say(f"step {step}: {name} {short(json.dumps(args, ensure_ascii=False))}")
        with tracing.tool_span(name, call_id, args) as span:
            result = self.registry.call(name, args, words=words)
            if span:
                span.result(result.text, result.is_error, result.detail)
        if result.denied:
            self.events.write(ev.PolicyDenied(step=step, tool=name, reason=result.denied))
        if result.detail.get("no_room"):
            self.no_room(result.detail["no_room"])
        self._record(step, call_id, name, result)
        self.say(f"  -> {short(result.text.splitlines()[0] if result.text else '')}")
        return result

    def _record(self, step: int, call_id: str, name: str, result: ToolResult) -> None:
        """The call's `tool_result` event (its size and detail) and its transcript line (its text)."""
        self.events.write(
            ev.tool_result(
                step=step,
                id=call_id,
                tool=name,
                is_error=result.is_error,
                result_chars=len(result.text),
                denied=bool(result.denied),
                detail=result.detail,
            )
        )
        self.transcript.add(
            "tool_result",
            step=step,
            id=call_id,
            tool=name,
            text=result.text,
            is_error=result.is_error,
            denied=result.denied or None,
            **result.detail,
        )


def _words_before(content: list[Block], call_id: str) -> str:
    """The model's text in this turn up to the tool_use block `call_id`: what it said it was doing
    (on 5.x models those words come back as thinking blocks)."""
    words = []
    for block in content:
        if block.get("type") == "tool_use" and block.get("id") == call_id:
            break
        if block.get("type") in ("text", "thinking"):
            words.append(block.get("text") or block.get("thinking") or "")
    return "\n".join(w.strip() for w in words if w.strip())


def _for_log(args: object) -> object:
    """A tool's arguments for the event log: each long string cut at EVENT_INPUT_CAP."""
    if isinstance(args, dict):
        return {
            k: (
                v[:EVENT_INPUT_CAP] + f"... ({len(v):,} chars)"
                if isinstance(v, str) and len(v) > EVENT_INPUT_CAP
                else v
            )
            for k, v in args.items()
        }
    return str(args)[:EVENT_INPUT_CAP]
