"""What the harness does after a model turn, by its stop reason, and the notes it sends the model.

- end_turn, stop_sequence: the model is done; the wake ends (`done`).
- tool_use: run every tool_use block in order, answer each, continue.
  (tool_use with no tool_use block is treated as the end.)
- pause_turn: the API paused a long turn; as documented, the assistant turn
  is sent back as is, with nothing added, and the model continues it.
- max_tokens: the reply hit max_output_tokens. Complete tool_use blocks in it
  are run and answered (one with a cut, unusable input gets an is_error
  result) and the wake continues; with no tool_use block, the harness asks
  the model to continue in shorter steps (`continue_note`). max_steps bounds either way.
- refusal: the model declined for safety reasons; carrying on would only ask
  again, so it is a dead letter for a human to look at, its reason naming
  `stop_details.category` (and the API's explanation).
- model_context_window_exceeded: the conversation filled the model's context
  window; a dead letter whose reason says so (and how big the last prompt was).
- any value we do not know: dead letter.

The wrap-up turn: when max_tokens_per_wake is spent, `wrap_up` adds the note that asks for the
journal entry and says no tool will run (loop.py makes that one last request).

Not here: the loop that acts on them (loop.py), the reply's parsing (model.py).
"""

from __future__ import annotations

from typing import Literal

from orchestrator.wake.model import Message, Turn
from orchestrator.wake.progress import short

Action = Literal["end", "tools", "pause", "cut", "dead"]
END: Action = "end"
TOOLS: Action = "tools"
PAUSE: Action = "pause"
CUT: Action = "cut"
DEAD: Action = "dead"
STOP_REASONS: dict[str, Action] = {
    "end_turn": END,
    "stop_sequence": END,
    "tool_use": TOOLS,
    "pause_turn": PAUSE,
    "max_tokens": CUT,
    "refusal": DEAD,
    "model_context_window_exceeded": DEAD,
}

BUDGET_NOTE = (
    "[harness] The token budget for this wake ({used:,} of {cap:,} tokens) is spent. "
    "Call no more tools: none will run. Reply with your journal entry for this wake (what you "
    "did, what you learned, what comes next); the harness appends your reply to "
    "memory/journal/{day}.md. Then stop."
)
CONTINUE_NOTE = (
    "[harness] Your last reply was cut at the output limit of {limit:,} tokens. "
    "Continue where you stopped, in smaller steps."
)


def action(turn: Turn) -> Action:
    """What comes after `turn`: END for tool_use with no tool_use block too, DEAD for a stop
    reason the harness does not know."""
    act = STOP_REASONS.get(turn.stop_reason, DEAD)
    return END if act == TOOLS and not turn.tool_uses else act


def dead_stop(turn: Turn) -> str:
    """A dead letter's reason for a stop the harness does not continue from, named truly."""
    if turn.stop_reason == "refusal":
        said = f": {short(turn.refusal_explanation)}" if turn.refusal_explanation else ""
        return f"refusal: the model declined (stop_details.category: {turn.refusal_category or 'none given'}){said}"
    if turn.stop_reason == "model_context_window_exceeded":
        return (
            f"model_context_window_exceeded: the conversation ({turn.usage.prompt_tokens:,} tokens of prompt) "
            "filled the model's context window; a shorter mandate or memory, or fewer steps a wake, leave room"
        )
    return f"the model stopped with stop_reason {turn.stop_reason!r}, which the harness does not continue from"


def continue_note(limit: int) -> Message:
    """The user message after a reply cut at the output limit with no tool call in it."""
    return {"role": "user", "content": [{"type": "text", "text": CONTINUE_NOTE.format(limit=limit)}]}


def wrap_up(messages: list[Message], used: int, cap: int, day: str) -> None:
    """The wrap-up turn's note: no more tools, the journal entry as the reply."""
    _add_user_text(messages, BUDGET_NOTE.format(used=used, cap=cap, day=day))


def _add_user_text(messages: list[Message], text: str) -> None:
    """Add a text block to the last user message (after its tool results), or a new user message."""
    last = messages[-1]
    if last["role"] == "user" and isinstance(last["content"], list):
        last["content"] = [*last["content"], {"type": "text", "text": text}]
    else:
        messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
