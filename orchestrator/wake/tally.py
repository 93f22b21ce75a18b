"""What a wake counts as it goes: its model requests, its tool calls, their tokens. The caps
are checked against it (loop.py), one tool step adds to it (tool_step.py), and the journal
stub and the receipt say it at the end.

Not here: the USD a wake spends (records/ledger.py `Meter`), the receipt (records/receipt.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.records.receipt import Usage


@dataclass
class Tally:
    steps: int = 0  # model requests made (max_steps caps them)
    tool_calls: int = 0  # tool calls run, approved calls run at the wake's start included
    usage: Usage = field(default_factory=Usage)  # every model call's, summed

    @property
    def tokens(self) -> int:
        """input + output + cache-read + cache-creation: what max_tokens_per_wake caps."""
        return self.usage.tokens
