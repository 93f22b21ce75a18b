"""Retention: what keeps an agent's state/ bounded over months unattended.

One mechanism for every file under state/ that grows with each wake. A kind
of file registers once, at import, by name:

- a log (`register_log("events.jsonl")`): one live file appended to; when it
  passes `rotate_size` bytes, or its first line is `rotate_days` old, it is
  renamed to `NAME-<UTC stamp>.<ext>` and (with `compress`) gzipped;
  A log may bring its own rotation (the outbox, state.py: only the part a
  person has read leaves the live file, as a segment);
- a folder of finished files (`register_folder("transcripts")`, one file a
  wake, say): each file in it is already a closed segment and is gzipped
  the same way.

Either way, segments older than `keep_days` are deleted, then the oldest
until what is left of that kind fits in `keep_size` (`expire`, the one
expiry rule: transcript.prune applies it to the transcripts with their own
limits, transcript.max_agent_bytes and retention_days). So state/ holds at most
`rotate_size` (plus one wake's lines) live and `keep_size` rotated, per kind,
whatever the schedule.

`enforce()` runs at the start of each wake, with the agent's wake lock held,
so nothing else rotates or compresses at the same time; the only writer
without the lock is a skipped wake's one `skipped_locked` line, which lands
in the live file or the segment just renamed. It costs a stat and a listing
of state/ when there is nothing to do: a wake never reads the history.

Readers that must see the whole retained history (`wakeloop log`, a state
rebuild) iterate `segments()` then the live file, oldest first, streaming;
gzip is read with the same code as plain text (`open_text`).

Not here: what any file holds (events.py, state.py), the policy keys'
validation (policy/schema.py) and their ceiling (policy/ceiling.py).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, Callable, Iterator

DAY_S = 86_400
STAMP = "%Y%m%dT%H%M%S%fZ"          # in a segment's name: when it was rotated, sortable as text
GZ = ".gz"
FIRST_LINE_CAP = 64 * 2**10         # bytes read to learn a live log's age; a longer line is not ours


@dataclass(frozen=True)
class Retention:
    """The policy's `state:` section: how much of state/ an agent keeps."""
    rotate_size: int = 4 * 2**20    # bytes: a live log past this is rotated at the next wake
    rotate_days: float = 1.0        # days: ... or once its first line is this old
    keep_days: float = 90.0         # days: rotated segments older than this are deleted
    keep_size: int = 64 * 2**20     # bytes: then the oldest, until a kind's segments fit in this
    compress: bool = True           # gzip segments (JSON lines shrink about tenfold)


@dataclass(frozen=True)
class Kind:
    """A growing file (or folder of files) under state/ that retention keeps bounded."""
    name: str                       # "events.jsonl" (a log) or "transcripts" (a folder)
    folder: bool = False
    # A log whose live file cannot simply be renamed away (the outbox: only what a
    # person has read may leave it) brings its own rotation; None: _rotate's.
    rotate: Callable[[Path, "Kind", Retention, datetime], list[str]] | None = None

    def stem_ext(self) -> tuple[str, str]:
        stem, dot, ext = self.name.partition(".")
        return stem, dot + ext


KINDS: dict[str, Kind] = {}


def register_log(name: str, rotate: Callable[[Path, Kind, Retention, datetime], list[str]] | None = None) -> Kind:
    KINDS[name] = Kind(name, rotate=rotate)
    return KINDS[name]


def register_folder(name: str) -> Kind:
    KINDS[name] = Kind(name, folder=True)
    return KINDS[name]


# -- reading across segments --------------------------------------------------------

def segments(state_dir: Path, kind: Kind) -> list[Path]:
    """A kind's rotated segments (a folder's files), oldest first."""
    state_dir = Path(state_dir)
    if kind.folder:
        try:
            found = [p for p in (state_dir / kind.name).iterdir()
                     if p.is_file() and not p.is_symlink() and not p.name.startswith(".")]
        except OSError:
            return []
        return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))
    stem, ext = kind.stem_ext()
    return sorted(p for p in state_dir.glob(f"{stem}-*{ext}*")
                  if p.name.endswith((ext, ext + GZ)) and not p.is_symlink())


def history(state_dir: Path, name: str) -> list[Path]:
    """Every retained file of a log, oldest first: its segments, then the live file."""
    return [*segments(state_dir, KINDS[name]), Path(state_dir) / name]


@contextmanager
def open_text(path: Path) -> Iterator[IO[str]]:
    """A segment or live file for reading as text, gzipped or not; never follows a
    symlink. A context manager: the descriptor is closed when the block ends."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as raw:
        if path.name.endswith(GZ):
            with gzip.GzipFile(fileobj=raw) as unzipped:
                yield io.TextIOWrapper(unzipped, encoding="utf-8", errors="replace")
        else:
            yield io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


# -- keeping it bounded -----------------------------------------------------------

def enforce(state_dir: Path, rules: Retention, now: datetime | None = None) -> list[str]:
    """Rotate, compress and expire every registered kind in `state_dir`; what was done,
    one line each. The caller holds the agent's wake lock."""
    now = now or datetime.now(timezone.utc)
    done: list[str] = []
    for kind in KINDS.values():
        if not kind.folder:
            done += (kind.rotate or _rotate)(Path(state_dir), kind, rules, now)
        if rules.compress:
            done += [_compress(p) for p in segments(state_dir, kind) if not p.name.endswith(GZ)]
        done += _expire(Path(state_dir), kind, rules, now)
    return done


def _rotate(state_dir: Path, kind: Kind, rules: Retention, now: datetime) -> list[str]:
    live = state_dir / kind.name
    try:
        size = live.lstat().st_size
    except FileNotFoundError:
        return []
    too_big = size >= rules.rotate_size
    too_old = size > 0 and _age_days(live, now) >= rules.rotate_days
    if not (too_big or too_old):
        return []
    stem, ext = kind.stem_ext()
    target = state_dir / f"{stem}-{now.strftime(STAMP)}{ext}"
    os.rename(live, target)
    return [f"rotated {kind.name} ({size:,} bytes, {'size' if too_big else 'age'}) to {target.name}"]


def _age_days(live: Path, now: datetime) -> float:
    """Days since the live log's first line was written (its "timestamp" field);
    an unreadable first line counts as new, so it rotates by size alone."""
    try:
        with open_text(live) as f:
            first = json.loads(f.readline(FIRST_LINE_CAP))
        then = datetime.fromisoformat(str(first["timestamp"]).replace("Z", "+00:00"))
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    return (now - then).total_seconds() / DAY_S


def _compress(path: Path) -> str:
    """PATH -> PATH.gz, written aside and renamed, so a crash leaves one or the other whole."""
    target = path.with_name(path.name + GZ)
    partial = path.with_name(f".{path.name}{GZ}.partial")
    with open(path, "rb") as src, gzip.open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(partial, 0o600)
    os.rename(partial, target)
    path.unlink()
    return f"compressed {path.name}"


def _expire(state_dir: Path, kind: Kind, rules: Retention, now: datetime) -> list[str]:
    gone = expire(segments(state_dir, kind), rules.keep_days, rules.keep_size, now)
    return [f"dropped {len(gone)} {kind.name} segment(s) past the retention"] if gone else []


def expire(oldest_first: list[Path], keep_days: float, keep_bytes: int, now: datetime,
           spare: frozenset[Path] = frozenset()) -> dict[Path, int]:
    """The one expiry rule of state/, for every kind (the event log's segments here,
    the transcripts with their own limits): files last written over `keep_days`
    ago go, then the oldest until the rest fit in `keep_bytes`. `spare` never go
    (a wake's own, still open). Returns what went, with its size."""
    cutoff = (now - timedelta(days=keep_days)).timestamp()
    sizes = {p: p.stat().st_size for p in oldest_first}
    gone = [p for p in oldest_first if p not in spare and p.stat().st_mtime < cutoff]
    kept = [p for p in oldest_first if p not in gone]
    total = sum(sizes[p] for p in kept)
    for p in [p for p in kept if p not in spare]:
        if total <= keep_bytes:
            break
        total -= sizes[p]
        gone.append(p)
    for path in gone:
        path.unlink(missing_ok=True)
    return {p: sizes[p] for p in gone}


def usage(state_dir: Path) -> int:
    """Bytes of every regular file under state/ (for status and the bench)."""
    total = 0
    for root, _dirs, files in os.walk(state_dir):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def iter_lines(paths: list[Path]) -> Iterator[str]:
    """Every line of these files in order; a file that vanished (expired meanwhile) is skipped."""
    for path in paths:
        try:
            with open_text(path) as f:
                yield from f
        except FileNotFoundError:
            continue
