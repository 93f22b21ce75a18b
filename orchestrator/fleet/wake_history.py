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

The index is kept on disk too, in the agent's own state/ (INDEX_FILE,
written whole through safeio/folder.py), so a restarted console reads a
year of history in a stat per file instead of ~0.1 s of parsing per agent.
It is untrusted input (whoever owns the agent folder can write it): read
capped, through no link and only as a file with one name, from the agent's
own state/, so it can only ever describe that agent's page; every entry is
checked (a known file's name, integer keys, at most KEEP rows of plain
values), and anything wrong means the files are read again and the index
written anew. An entry is used only while its file's (size, mtime_ns,
inode) stand; the live file is read on from its offset while its inode does.

Not here: the event format (records/events.py), rendering (console/).
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.records.event_types import WakeFinished
from orchestrator.records.events import EVENTS_FILE, parse_event
from orchestrator.records.retention import LINE_CAP, history, holder, open_text
from orchestrator.safeio.folder import state_folder

MARK = '"wake_finished"'
KEEP = 100  # rows held per file: the newest
ROW_KEYS = (
    "run_id",
    "wake",
    "status",
    "reason",
    "steps",
    "tokens",
    "tool_calls",
    "usd",
    "duration_ms",
    "started_at",
    "model",
    "live",
    "task",
)
INDEX_FILE = "wakes.index.json"  # in state/: the index as the console last left it
INDEX_VERSION = 1
INDEX_CAP = 8 * 2**20  # bytes of INDEX_FILE read; a bigger one is not ours: rebuilt
INDEX_FILES = 10_000  # file entries in one index (retention keeps far fewer segments)
VALUE_CAP = 64 * 2**10  # chars of one string value in an indexed row


@dataclass
class _File:
    key: tuple  # (size, mtime_ns, inode) when read to its end
    offset: int = 0  # the live file: bytes read so far (complete lines only)
    rows: deque = field(default_factory=lambda: deque(maxlen=KEEP))
    count: int = 0

    def add(self, rows) -> None:
        for row in rows:
            if row:
                self.rows.append(row)
                self.count += 1


def row_of(line: str) -> dict | None:
    event = parse_event(line) if MARK in line else None
    if event is None or not isinstance(event.record, WakeFinished):
        return None
    finished, r = event.record, event.record.receipt
    row: dict = (
        dict.fromkeys(ROW_KEYS)
        if r is None
        else {
            "run_id": r.run_id,
            "wake": r.wake,
            "status": r.status,
            "reason": r.reason,
            "steps": r.steps,
            "tokens": r.tokens,
            "tool_calls": r.tool_calls,
            "usd": r.usd,
            "duration_ms": r.duration_ms,
            "started_at": r.started_at,
            "model": r.model,
            "live": r.live,
            "task": r.task,
        }
    )
    row["run_id"] = row["run_id"] or event.run_id
    row["status"] = row["status"] or finished.status or None
    row["finished_at"] = event.timestamp
    return row


class WakeIndex:
    """Finished wakes per agent, kept between calls and on disk; safe to share between threads."""

    def __init__(self):
        self._files: dict[Path, _File] = {}
        self._loaded: set[Path] = set()  # state dirs whose INDEX_FILE this process has read
        self._lock = threading.Lock()
        self.parsed_lines = 0  # event lines read from the logs (the tests count them)

    def recent(self, state_dir: Path, n: int = KEEP) -> tuple[int, list[dict]]:
        """How many finished wakes the retained history holds, and the newest n of them, oldest first."""
        state_dir = Path(state_dir)
        paths = history(state_dir, EVENTS_FILE)
        total, rows = 0, deque[dict](maxlen=n)
        with self._lock:
            if state_dir not in self._loaded:
                self._loaded.add(state_dir)
                self._files.update(load_index(state_dir, paths))
            before = {p: f.key for p, f in self._files.items() if p.parent == state_dir}
            for path in paths:
                known = self._read(path, live=path.name == EVENTS_FILE)
                if known:
                    total += known.count
                    rows.extend(known.rows)
            gone = [p for p in self._files if p.parent == state_dir and p not in paths]
            for p in gone:  # expired segments, or a live file rotated away
                del self._files[p]
            now = {p: f for p, f in self._files.items() if p.parent == state_dir}
            changed = {p: f.key for p, f in now.items()} != before
            text = dump_index(now) if changed else None
        if text is not None:
            save_index(state_dir, text)
        return total, list(rows)

    def _read(self, path: Path, live: bool) -> _File | None:
        try:
            st = path.stat()
        except OSError:
            return None
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        known = self._files.get(path)
        if known and known.key == key:
            return known
        if not live:
            known = self._files[path] = _File(key)
            try:
                with open_text(path) as f:
                    known.add(map(self._row_of, f))
            except OSError:
                pass
            return known
        if known is None or st.st_size < known.offset or known.key[2] != st.st_ino:  # new, or replaced
            known = self._files[path] = _File(key)
        self._read_on(path, known)
        known.key = key
        return known

    def _row_of(self, line: str) -> dict | None:
        self.parsed_lines += 1
        return row_of(line)

    def _read_on(self, path: Path, known: _File) -> None:
        try:
            folder, name = holder(path)  # safeio/folder.py: no link followed, never a FIFO
            fd = folder.open(name)
        except OSError:
            return
        with os.fdopen(fd, "rb") as f:
            f.seek(known.offset)
            data = f.read(LINE_CAP)  # a look reads at most this: a planted 100 GB file costs no more
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next look
        if end == 0 and len(data) == LINE_CAP:
            end = len(data)  # no line of ours is that long: skipped
        known.offset += end
        known.add(map(self._row_of, data[:end].decode("utf-8", errors="replace").splitlines()))


# -- the index on disk ----------------------------------------------------------------------


def dump_index(files: dict[Path, _File]) -> str:
    entries = [
        {"name": p.name, "key": list(f.key), "offset": f.offset, "count": f.count, "rows": list(f.rows)}
        for p, f in files.items()
    ]
    return json.dumps({"version": INDEX_VERSION, "files": entries}, separators=(",", ":"), default=str)


def save_index(state_dir: Path, text: str) -> None:
    """Written whole or not at all; a console that cannot write it reads the logs again next start."""
    try:
        state_folder(state_dir).write_atomic(INDEX_FILE, text)
    except OSError:
        pass


def load_index(state_dir: Path, paths: list[Path]) -> dict[Path, _File]:
    """The entries of state_dir's INDEX_FILE for files among `paths` (this agent's own), or {} when
    the index is absent, too big, not ours (a link, a FIFO, a hard link) or wrong in any way."""
    try:
        data = json.loads(state_folder(state_dir).read_bytes(INDEX_FILE, INDEX_CAP))
        return _entries(data, {p.name: p for p in paths})
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return {}


def _entries(data: dict, paths: dict[str, Path]) -> dict[Path, _File]:
    if data["version"] != INDEX_VERSION or len(data["files"]) > INDEX_FILES:
        raise ValueError("not this version's index")
    out = {}
    for entry in data["files"]:
        path = paths.get(entry["name"]) if isinstance(entry["name"], str) else None
        key, offset, count, rows = entry["key"], entry["offset"], entry["count"], entry["rows"]
        if not (
            isinstance(key, list)
            and len(key) == 3
            and all(_count(k) for k in key)
            and _count(offset)
            and offset <= key[0]
            and _count(count)
            and isinstance(rows, list)
            and len(rows) <= min(KEEP, count)
        ):
            raise ValueError(f"a bad entry for {entry['name']!r}")
        known = _File(tuple(key), offset)
        known.rows.extend(_row(r) for r in rows)
        known.count = count
        if path is not None:  # a file since expired or never ours: its entry is dropped
            out[path] = known
    return out


def _row(row: dict) -> dict:
    if set(row) != {*ROW_KEYS, "finished_at"} or not all(_plain(v) for v in row.values()):
        raise ValueError("not a row of ours")
    return row


def _count(value) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _plain(value) -> bool:
    return value is None or type(value) in (bool, int, float) or (type(value) is str and len(value) <= VALUE_CAP)
