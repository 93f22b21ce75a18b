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
gzip is read with the same code as plain text (`open_text`), a line at most
LINE_CAP and a file at most FILE_CAP bytes (after gunzip): a planted 100 GB
sparse log or a gzip bomb costs no more than that.

Every file is reached through safeio/folder.py from the agent folder: no link is
followed (state/, a kind's folder, a segment), only regular files are read,
compressed, renamed or deleted, and only those named as this kind's
segments: retention never deletes a file it did not make, nor one outside
state/. A segment larger than FILE_CAP is deleted without being
compressed or read (no file of ours is that big; gzip of a planted sparse
file would hold the wake for minutes).

Not here: what any file holds (events.py, state.py), the policy keys'
validation (policy/load.py) and their ceiling (policy/ceiling.py), the
walk itself (safeio/folder.py).
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestrator.safeio.folder import Folder, capped_lines, state_folder
from orchestrator.safeio.jsontext import loads

DAY_S = 86_400
STAMP = "%Y%m%dT%H%M%S%fZ"  # in a segment's name: when it was rotated, sortable as text
GZ = ".gz"
FIRST_LINE_CAP = 64 * 2**10  # bytes read to learn a live log's age; a longer line is not ours
LINE_CAP = 8 * 2**20  # bytes: no line we write is longer (events, done.jsonl, transcripts)
FILE_CAP = 256 * 2**20  # bytes read of one retained file (after gunzip); a live log rotates
# at rotate_size, which the schema holds to MAX_ROTATE_SIZE below it
MAX_ROTATE_SIZE = FILE_CAP // 2  # the most state.rotate_size may be: room for a wake's lines past it


@dataclass(frozen=True)
class Retention:
    """The policy's `state:` section: how much of state/ an agent keeps."""

    rotate_size: int = 4 * 2**20  # bytes: a live log past this is rotated at the next wake
    rotate_days: float = 1.0  # days: ... or once its first line is this old
    keep_days: float = 90.0  # days: rotated segments older than this are deleted
    keep_size: int = 64 * 2**20  # bytes: then the oldest, until a kind's segments fit in this
    compress: bool = True  # gzip segments (JSON lines shrink about tenfold)


@dataclass(frozen=True)
class Kind:
    """A growing file (or folder of files) under state/ that retention keeps bounded."""

    name: str  # "events.jsonl" (a log), "notify/done.jsonl", or "transcripts" (a folder)
    folder: bool = False
    # A log whose live file cannot simply be renamed away (the outbox: only what a
    # person has read may leave it) brings its own rotation; None: _rotate's.
    rotate: Callable[[Path, Kind, Retention, datetime], list[str]] | None = None

    def stem_ext(self) -> tuple[str, str]:
        stem, dot, ext = self.file.partition(".")
        return stem, dot + ext

    @property
    def where(self) -> str:
        """The folder under state/ holding the live file and its segments ("." for state/ itself)."""
        return self.name if self.folder else (self.name.rpartition("/")[0] or ".")

    @property
    def file(self) -> str:
        return self.name.rpartition("/")[2]

    def is_segment(self, name: str) -> bool:
        """Whether a file name is one of this kind's rotated segments (the only files it deletes)."""
        if self.folder:
            return not name.startswith(".")
        stem, ext = self.stem_ext()
        return name.startswith(f"{stem}-") and name.endswith((ext, ext + GZ))


KINDS: dict[str, Kind] = {}


def register_log(name: str, rotate: Callable[[Path, Kind, Retention, datetime], list[str]] | None = None) -> Kind:
    KINDS[name] = Kind(name, rotate=rotate)
    return KINDS[name]


def register_folder(name: str) -> Kind:
    KINDS[name] = Kind(name, folder=True)
    return KINDS[name]


# -- reading across segments --------------------------------------------------------


def segments(state_dir: Path, kind: Kind) -> list[Path]:
    """A kind's rotated segments (a folder's files), oldest first: regular files only,
    never through a link."""
    found = state_folder(state_dir).files(kind.where)
    folder = Path(state_dir) / kind.where
    if kind.folder:
        return [
            folder / n
            for n, _ in sorted(
                ((n, st) for n, st in found.items() if kind.is_segment(n)), key=lambda e: (e[1].st_mtime_ns, e[0])
            )
        ]
    return sorted(folder / n for n in found if kind.is_segment(n))


def history(state_dir: Path, name: str) -> list[Path]:
    """Every retained file of a log, oldest first: its segments, then the live file."""
    return [*segments(state_dir, KINDS[name]), Path(state_dir) / name]


def holder(path: Path) -> tuple[Folder, str]:
    """The folder holding `path` and its name, walked without following a link from the agent
    folder down: `state` itself included (a reader that skips load_agent, the console's wake
    page, must not read another agent's transcripts through a linked state/)."""
    path = Path(path)
    for up in path.parents:
        if up.name == "state":  # the nearest: AGENT/state/transcripts/x.jsonl -> AGENT, (state, transcripts)
            return Folder(up.parent, ("state", *path.parent.relative_to(up).parts)), path.name
    return Folder(path.parent.parent, (path.parent.name,)), path.name


@contextmanager
def open_text(path: Path, line_cap: int | None = None, file_cap: int | None = None) -> Iterator[Iterator[str]]:
    """A segment or live file's lines as text, gzipped or not; never through a link,
    never a FIFO or device; a line over line_cap is skipped, and no more than
    file_cap bytes are read. A context manager: the descriptor is closed when the block ends."""
    folder, name = holder(path)
    line_cap, file_cap = line_cap or LINE_CAP, file_cap or FILE_CAP
    with folder.reader(name) as raw:
        if name.endswith(GZ):
            with gzip.GzipFile(fileobj=raw) as unzipped:
                yield _text(capped_lines(unzipped, line_cap, file_cap))
        else:
            yield _text(capped_lines(raw, line_cap, file_cap))


def _text(lines: Iterator[bytes]) -> Iterator[str]:
    return (line.decode("utf-8", "replace") for line in lines)


# -- keeping it bounded -----------------------------------------------------------


def enforce(state_dir: Path, rules: Retention, now: datetime | None = None) -> list[str]:
    """Rotate, compress and expire every registered kind in `state_dir`; what was done,
    one line each. The caller holds the agent's wake lock."""
    now = now or datetime.now(UTC)
    done: list[str] = []
    for kind in KINDS.values():
        if not kind.folder:
            done += (kind.rotate or _rotate)(Path(state_dir), kind, rules, now)
        done += _drop_oversized(Path(state_dir), kind)
        if rules.compress:
            done += [_compress(p) for p in segments(state_dir, kind) if not p.name.endswith(GZ)]
        done += _expire(Path(state_dir), kind, rules, now)
    return done


def _rotate(state_dir: Path, kind: Kind, rules: Retention, now: datetime) -> list[str]:
    live = state_dir / kind.name
    st = state_folder(state_dir).lstat(kind.name)
    if st is None or not stat.S_ISREG(st.st_mode):
        return []  # absent, or not ours (a link, a FIFO): its writers refuse it too
    size = st.st_size
    too_big = size >= rules.rotate_size
    too_old = size > 0 and _age_days(live, now) >= rules.rotate_days
    if not (too_big or too_old):
        return []
    target = segment_name(kind, now)
    state_folder(state_dir).rename(kind.name, target)
    return [f"rotated {kind.name} ({size:,} bytes, {'size' if too_big else 'age'}) to {target}"]


def segment_name(kind: Kind, now: datetime) -> str:
    """A new segment's path under state/: NAME-<UTC stamp>.<ext>, beside the live file."""
    stem, ext = kind.stem_ext()
    where = "" if kind.where == "." else kind.where + "/"
    return f"{where}{stem}-{now.strftime(STAMP)}{ext}"


def _drop_oversized(state_dir: Path, kind: Kind) -> list[str]:
    """Segments over FILE_CAP are not ours (a live file rotates long before): deleted
    unread, uncompressed (gzip of a planted 100 GB sparse file would hold the wake)."""
    big = {p: size for p in segments(state_dir, kind) if (size := _size(p)) > FILE_CAP}
    return [
        f"dropped {p.name} ({size:,} bytes, over {FILE_CAP:,}: not one of ours)"
        for p, size in big.items()
        if _unlink(p)
    ]


def _size(path: Path) -> int:
    folder, name = holder(path)
    st = folder.lstat(name)
    return st.st_size if st is not None else 0


def _age_days(live: Path, now: datetime) -> float:
    """Days since the live log's first line was written (its "timestamp" field, or "time": the
    egress record's); an unreadable first line counts as new, so it rotates by size alone."""
    try:
        with open_text(live, FIRST_LINE_CAP, FIRST_LINE_CAP + 1) as lines:
            first = loads(next(lines))
        stamp = first["timestamp"] if "timestamp" in first else first["time"]
        then = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        return (now - then).total_seconds() / DAY_S  # a planted stamp without a zone: TypeError
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return 0.0


def _compress(path: Path) -> str:
    """PATH -> PATH.gz, written aside and renamed, so a crash leaves one or the other whole."""
    folder, name = holder(path)
    partial = f".{name}{GZ}.partial"
    folder.unlink(partial)  # a crash's leftover
    out = folder.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with folder.reader(name) as src, os.fdopen(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as dst:
        shutil.copyfileobj(src, dst)
    folder.rename(partial, name + GZ)
    folder.unlink(name)
    return f"compressed {name}"


def _expire(state_dir: Path, kind: Kind, rules: Retention, now: datetime) -> list[str]:
    gone = expire(segments(state_dir, kind), rules.keep_days, rules.keep_size, now)
    return [f"dropped {len(gone)} {kind.name} segment(s) past the retention"] if gone else []


def expire(
    oldest_first: list[Path], keep_days: float, keep_bytes: int, now: datetime, spare: frozenset[Path] = frozenset()
) -> dict[Path, int]:
    """The one expiry rule of state/, for every kind (the event log's segments here,
    the transcripts with their own limits): files last written over `keep_days`
    ago go, then the oldest until the rest fit in `keep_bytes`. `spare` never go
    (a wake's own, still open). Returns what went, with its size."""
    cutoff = (now - timedelta(days=keep_days)).timestamp()
    seen = {p: st for p in oldest_first if (st := holder(p)[0].lstat(p.name)) is not None}
    oldest_first = [p for p in oldest_first if p in seen]
    sizes = {p: seen[p].st_size for p in oldest_first}
    gone = [p for p in oldest_first if p not in spare and seen[p].st_mtime < cutoff]
    kept = [p for p in oldest_first if p not in gone]
    total = sum(sizes[p] for p in kept)
    for p in [p for p in kept if p not in spare]:
        if total <= keep_bytes:
            break
        total -= sizes[p]
        gone.append(p)
    gone = [p for p in gone if _unlink(p)]  # a regular file, never through a link
    return {p: sizes[p] for p in gone}


def _unlink(path: Path) -> bool:
    folder, name = holder(path)
    return folder.unlink(name)


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
            with open_text(path) as lines:
                yield from lines
        except OSError:  # vanished (expired meanwhile), or not ours (a link, a FIFO): skipped
            continue
