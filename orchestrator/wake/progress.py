"""The progress lines a wake says as it goes (`wakeloop wake` prints them; serve logs them):
one line per step, a tool call or a reply cut to fit, its control characters taken out.

Not here: what is recorded (the events, records/events.py; the transcript,
records/transcript.py), which keep the whole text.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.sandbox.containers.output import clean

Say = Callable[[str], None]  # where a wake's progress lines go (`echo` of loop.wake)
PROGRESS_CAP = 160  # chars of a tool call or reply shown on a progress line


def short(text: str) -> str:
    """`text` on one line, cleaned, cut at PROGRESS_CAP."""
    text = clean(" ".join(text.split()))
    return text if len(text) <= PROGRESS_CAP else text[:PROGRESS_CAP] + "..."
