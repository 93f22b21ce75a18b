"""Run ids as a person types them: any unique prefix of MIN_DIGITS or more hex digits.

A wake's run id is 12 hex digits (wake/loop.py); `wakeloop log` shows the
first 8. Every command that takes one (`log --run`, `transcript --run`,
`log --egress --run`, `diff --run`, `undo --run`) hands what was typed to
`resolve`, the one place that decides what it names: the whole id of the one
wake it starts, or one line saying why not (exit 2): too short, not hex, no
wake of that agent starts with it, or several do (they are named, so the
person picks). A whole id passes as given: the command that reads it says
whether that wake left what it asks for.

The wakes an agent had are read from its state/: its transcripts' names and
the `wake_started` events of its retained log (rotated segments too).

Not here: making run ids (wake/loop.py), the ids' form on a disk (sandbox/disks/layers.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.records.events import parse_event, raw_history
from orchestrator.records.transcript import SUFFIX, runs

MIN_DIGITS = 4  # fewer would name a wake only by luck in a year of them
DIGITS = 12  # a whole run id (wake/loop.py: uuid4().hex[:12])
SHOWN = 8  # candidates named in an ambiguous prefix's line; the rest counted
_HEX = re.compile(r"[0-9a-f]+")
_MARK = '"wake_started"'  # lines worth parsing: a wake's first event names its run id


class RunIdError(ConfigError):
    """What was typed names no one wake: one line, exit 2."""


def known(state_dir: Path) -> list[str]:
    """Every run id of a wake this agent's state/ remembers, sorted, each once."""
    found = {p.name[: -len(SUFFIX)] for p in runs(state_dir)}
    for line in raw_history(state_dir):
        if _MARK in line and (event := parse_event(line)) is not None and event.type == "wake_started":
            found.add(event.run_id)
    return sorted(r for r in found if len(r) == DIGITS and _HEX.fullmatch(r))


def resolve(state_dir: Path, given: str, shown: str = "AGENT_DIR", also: Iterable[str] = ()) -> str:
    """The whole run id `given` names (a unique prefix, MIN_DIGITS or more hex digits), or
    RunIdError. `shown`: the agent folder as the person gave it, for the line's hint; `also`:
    run ids a record of the caller's names beside the wakes' (the egress log's)."""
    typed = given.strip().lower()
    if not (MIN_DIGITS <= len(typed) <= DIGITS and _HEX.fullmatch(typed)):
        raise RunIdError(
            f"not a run id: {given[:40]!r}: give {MIN_DIGITS} to {DIGITS} hex digits of one "
            f"(`wakeloop log {shown}` shows them)"
        )
    if len(typed) == DIGITS:
        return typed
    hits = sorted({r for r in (*known(state_dir), *also) if r.startswith(typed)})
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise RunIdError(f"no wake of {shown} has a run id starting {typed} (`wakeloop log {shown}` shows them)")
    more = f" and {len(hits) - SHOWN} more" if len(hits) > SHOWN else ""
    raise RunIdError(
        f"run id {typed} is ambiguous: {len(hits)} wakes of {shown} start with it "
        f"({', '.join(hits[:SHOWN])}{more}); give more digits"
    )
