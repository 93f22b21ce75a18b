"""An agent's wake history: one row per finished wake, from its event log, indexed.

The rows are the receipts in `wake_finished` events, read across the
rotated segments and the live file (records/retention.history), oldest
first. A year of wakes is tens of thousands of event lines, too many to
parse on every page view, so `WakeIndex` keeps, per file, the rows it found
and where it stopped: a rotated segment never changes (its rows are reused
while its size and mtime stand), and the live file is read on from the last
complete line. A page then costs a stat per file and the new lines. Only
the newest KEEP rows of each file are held (and every file's count): a
page shows the newest wakes, and 100 agents with a year of wakes each
would otherwise hold 100,000 rows in serve's memory.

Lines are filtered as bytes before JSON parsing: only those naming
`wake_finished` are parsed.

Not here: the event format (records/events.py), rendering (console/).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.records.events import EVENTS_FILE, parse_event
from orchestrator.records.retention import LINE_CAP, history, holder, open_text

MARK = '"wake_finished"'
KEEP = 100                          # rows held per file: the newest
ROW_KEYS = ("run_id", "wake", "status", "reason", "steps", "tokens", "tool_calls", "usd", "duration_ms",
            "started_at", "model", "live", "task")


@dataclass
class _File:
    key: tuple                      # (size, mtime_ns) when read to its end
    offset: int = 0                 # the live file: bytes read so far (complete lines only)
    rows: deque = field(default_factory=lambda: deque(maxlen=KEEP))
    count: int = 0

    def add(self, rows) -> None:
        for row in rows:
            if row:
                self.rows.append(row)
                self.count += 1


def row_of(line: str) -> dict | None:
    event = parse_event(line) if MARK in line else None
    if event is None or event.type != "wake_finished":
        return None
    receipt = event.data.get("receipt")
    receipt = receipt if isinstance(receipt, dict) else {}
    row = {k: receipt.get(k) for k in ROW_KEYS}
    row["run_id"] = row["run_id"] or event.run_id
    row["status"] = row["status"] or event.data.get("status")
    row["finished_at"] = event.timestamp
    return row


class WakeIndex:
    """Finished wakes per agent, kept between calls; safe to share between threads."""

    def __init__(self):
        self._files: dict[Path, _File] = {}
        self._lock = threading.Lock()

    def recent(self, state_dir: Path, n: int = KEEP) -> tuple[int, list[dict]]:
        """How many finished wakes the retained history holds, and the newest n of them, oldest first."""
        paths = history(Path(state_dir), EVENTS_FILE)
        total, rows = 0, deque[dict](maxlen=n)
        with self._lock:
            for path in paths:
                known = self._read(path, live=path.name == EVENTS_FILE)
                if known:
                    total += known.count
                    rows.extend(known.rows)
            gone = [p for p in self._files if p.parent == Path(state_dir) and p not in paths]
            for p in gone:              # expired segments, or a live file rotated away
                del self._files[p]
        return total, list(rows)

    def _read(self, path: Path, live: bool) -> _File | None:
        try:
            st = path.stat()
        except OSError:
            return None
        key = (st.st_size, st.st_mtime_ns)
        known = self._files.get(path)
        if known and known.key == key:
            return known
        if not live:
            known = self._files[path] = _File(key)
            try:
                with open_text(path) as f:
                    known.add(map(row_of, f))
            except OSError:
                pass
            return known
        if known is None or st.st_size < known.offset:   # new, or replaced since (rotated)
            known = self._files[path] = _File(key)
        self._read_on(path, known)
        known.key = key
        return known

    @staticmethod
    def _read_on(path: Path, known: _File) -> None:
        try:
            folder, name = holder(path)   # records/folder.py: no link followed, never a FIFO
            fd = folder.open(name)
        except OSError:
            return
        with os.fdopen(fd, "rb") as f:
            f.seek(known.offset)
            data = f.read(LINE_CAP)     # a look reads at most this: a planted 100 GB file costs no more
        end = data.rfind(b"\n") + 1     # a half-written last line waits for the next look
        if end == 0 and len(data) == LINE_CAP:
            end = len(data)             # no line of ours is that long: skipped
        known.offset += end
        known.add(map(row_of, data[:end].decode("utf-8", errors="replace").splitlines()))
