"""The event log: `state/events.jsonl`, one JSON object a line (docs/architecture.md §4).

Every line is `{"run_id", "type", "timestamp", "data"}` and is written with a
single `write(2)` on an O_APPEND descriptor the moment it happens, so a wake
killed with -9 loses at most the line being written, and two processes
appending at once never interleave inside a line. Written and read through
safeio/folder.py (no link followed, regular files only, lines and files capped). Reading tolerates a torn
last line. The live file is rotated (renamed, gzipped, later dropped) by
retention.py at the start of a wake; read_history() reads across it all.

Never a secret in it: the API key's value (and every name safeio/secrets.py
lists) is scrubbed from every line before
it is written, whatever field it hides in.

The harness writes records (`write`): each type's fields are declared once
in event_types.py, and every line read back carries its record
(`Event.record`, parsed when first read). `emit` writes free keywords:
only tests use it, to write lines of any shape a reader must survive.

Not here: the event types (event_types.py), what they mean for a wake
(loop.py decides what to record) or how they are shown (views/eventview.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from orchestrator.records import retention
from orchestrator.records.event_types import EventRecord, parse_record
from orchestrator.safeio.jsontext import loads
from orchestrator.safeio.secrets import secret_values

EVENTS_FILE = "events.jsonl"
retention.register_log(EVENTS_FILE)  # rotated, compressed and expired by retention.py
REDACTED = "[redacted]"
Listener = Callable[[Path, "Event"], None]
_listeners: list[Listener] = []  # metrics.py: told of each event after it lands


def listen(fn: Listener) -> None:
    """Call fn(path, event) after every event this process writes, on the writing thread.
    A listener that raises is ignored: counting an event must never cost the wake."""
    if fn not in _listeners:
        _listeners.append(fn)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def secrets_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The values that must never be written anywhere we control (safeio/secrets.py names them)."""
    return secret_values(environ)


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


class EventLog:
    """Appends events for one run to one file."""

    def __init__(self, path: Path, run_id: str, secrets: tuple[str, ...] | None = None):
        self.path = Path(path)
        self.run_id = run_id
        self.secrets = secrets_from_env() if secrets is None else secrets

    def write(self, record: EventRecord) -> Event:
        """Append one event, as its record says (event_types.py)."""
        return self._append(record.type, record.to_data(), record)

    def emit(self, type: str, **data: Any) -> Event:
        """Append a line of any shape (tests); the harness writes records."""
        return self._append(type, data, parse_record(type, data))

    def _append(self, type: str, data: dict[str, Any], record: EventRecord) -> Event:
        event = Event(self.run_id, type, now_iso(), data)
        event.__dict__["record"] = record  # the record it was written from (cached_property's slot)
        line = scrub(json.dumps(event.to_json(), ensure_ascii=False, default=str), self.secrets) + "\n"
        folder, name = retention.holder(self.path)  # never through a link, never into a FIFO
        folder.append(name, line.encode("utf-8"))
        for fn in _listeners:
            try:
                fn(self.path, event)
            except Exception:
                pass
        return event


@dataclass(frozen=True)
class Event:
    """One line: who wrote it, when, its raw `data` (as `wakeloop log` shows it) and its typed record."""

    run_id: str
    type: str
    timestamp: str
    data: dict[str, Any]

    @cached_property
    def record(self) -> EventRecord:
        """Read when first asked for: `wakeloop log` and a line that is only counted never pay for it."""
        return parse_record(self.type, self.data)

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "type": self.type, "timestamp": self.timestamp, "data": self.data}


def read_events(path: Path) -> Iterator[Event]:
    """Every well-formed event of one file in order; a torn or foreign line is skipped."""
    return _parse(retention.iter_lines([Path(path)]))


def read_history(state_dir: Path) -> Iterator[Event]:
    """Every retained event, oldest first: the rotated segments (gzipped or not), then
    the live file. Streams: memory stays flat however long the history."""
    return _parse(retention.iter_lines(retention.history(state_dir, EVENTS_FILE)))


def raw_history(state_dir: Path) -> Iterator[str]:
    """The same lines, as written (`wakeloop log --json`)."""
    return retention.iter_lines(retention.history(state_dir, EVENTS_FILE))


def parse_event(line: str) -> Event | None:
    """One line of the log as an Event, or None for a torn or foreign line."""
    try:
        raw = loads(line)
        data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
        return Event(str(raw["run_id"]), str(raw["type"]), str(raw["timestamp"]), data)
    except (ValueError, KeyError, TypeError):
        return None


def _parse(lines: Iterator[str]) -> Iterator[Event]:
    return (event for event in map(parse_event, lines) if event is not None)
