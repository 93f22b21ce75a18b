"""The host's own files in `state/`: the wake lock, state.json, inbox and outbox.

state/ is never mounted into a sandbox, so the agent can neither forge nor
erase what is here. Every write is either atomic (temp file, fsync, rename)
or a single O_APPEND write, so a wake killed with -9 leaves files that parse.

- wake.lock: an flock(2) on the file is the lock; the pid and start time
  written into it are for people. The kernel drops an flock when its process
  dies, so a lock left by a crashed wake is taken over at once, and two wakes
  started together cannot both win.
- state.json: the wake counter and lifetime tokens. Missing or corrupt, it is
  rebuilt from the event log (or reset) with a warning, never a crash: the
  wake counter from the newest retained wake, the lifetime tokens from the
  retained history only (retention.py may have dropped older segments).
- inbox.txt: human messages for the next wake. A wake moves them to
  inbox.taken when it really starts and deletes that after its first model
  call; a wake that fails before (or a kill -9) leaves them to be put back.
- outbox.txt: what the agent sent with send_message; past state.rotate_size the part
  a person has read moves to a segment (retention.py), what is unread stays,
  unless the unread part alone is past rotate_size: then the whole live file
  moves to a segment (read and unread alike come under the one retention rule).

Every file here is read, written and deleted through safeio/folder.py: `state` or
any file in it planted as a link, a FIFO or a device is refused (a corrupt
state.json, say, is then rebuilt), and every read is capped.

Not here: the workspace (sandbox/disks/workspace_reads.py) or the event log's format (events.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.records import retention
from orchestrator.records.event_types import WakeFinished, WakeStarted
from orchestrator.records.events import read_history
from orchestrator.records.receipt import Receipt
from orchestrator.safeio.atomic import locked
from orchestrator.safeio.folder import state_folder
from orchestrator.safeio.jsontext import loads

LOCK_FILE = "wake.lock"
STATE_FILE = "state.json"
INBOX_FILE = "inbox.txt"
INBOX_TAKEN = "inbox.taken"  # drained by a wake that has not yet called the model
INBOX_LOCK = "inbox.lock"  # serialises send / drain / put back
OUTBOX_FILE = "outbox.txt"
LOCK_ATTEMPTS = 5  # retries when a releasing wake unlinks the file under us
MESSAGE_MARK = "--- "  # starts each inbox/outbox entry
STATE_CAP = 1 * 2**20  # bytes of state.json read; ours are under 4 KiB
BOX_CAP = 16 * 2**20  # bytes of inbox or outbox read (the outbox's newest): 4,000 messages
# of send_message's default max_chars


# -- the wake lock --------------------------------------------------------------


@dataclass(frozen=True)
class LockHolder:
    pid: int
    started: str

    @property
    def alive(self) -> bool:
        return self.pid > 0 and _pid_alive(self.pid)

    def describe(self) -> str:
        who = f"pid {self.pid}" if self.pid else "a process that has not written its pid yet"
        return f"{who}, started {self.started}" if self.started else who


class WakeLock:
    """One wake per agent at a time. `acquire()` returns None when we hold the
    lock, else who does; `stale` is the dead holder we took over from, if any."""

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / LOCK_FILE
        self.fd: int | None = None
        self.stale: LockHolder | None = None

    def acquire(self) -> LockHolder | None:
        for _ in range(LOCK_ATTEMPTS):
            fd = state_folder(self.path.parent).open(LOCK_FILE, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _parse_holder(_read_fd(fd))
                os.close(fd)
                return holder
            if not self._still_linked(fd):
                os.close(fd)  # the holder released and unlinked it meanwhile: try the new file
                continue
            previous = _parse_holder(_read_fd(fd))
            self.stale = previous if previous.pid else None
            started = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {started}\n".encode(), 0)
            self.fd = fd
            return None
        return LockHolder(0, "")  # lost every race: someone else is clearly starting

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if self._still_linked(self.fd):
                # before unlocking: nobody locks a file about to vanish
                state_folder(self.path.parent).unlink(LOCK_FILE)
        finally:
            os.close(self.fd)
            self.fd = None

    def _still_linked(self, fd: int) -> bool:
        st = state_folder(self.path.parent).lstat(LOCK_FILE)
        return st is not None and st.st_ino == os.fstat(fd).st_ino


def lock_holder(state_dir: Path) -> LockHolder | None:
    """Who holds the lock right now, for `status`; never takes the lock itself."""
    try:
        fd = state_folder(state_dir).open(LOCK_FILE)
    except OSError:
        return None
    try:
        holder = _parse_holder(_read_fd(fd))
    finally:
        os.close(fd)
    return holder if holder.alive else None


def _read_fd(fd: int) -> str:
    return os.pread(fd, 200, 0).decode("utf-8", "replace")


def _parse_holder(text: str) -> LockHolder:
    parts = text.split()
    try:
        return LockHolder(int(parts[0]), parts[1] if len(parts) > 1 else "")
    except (IndexError, ValueError):
        return LockHolder(0, "")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


# -- state.json -------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    wake: int = 0  # wakes started, the last one included
    tokens_lifetime: int = 0  # input + output + cache tokens, all wakes
    last_receipt: Receipt | None = field(default=None, compare=False)

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "wake": self.wake,
                    "tokens_lifetime": self.tokens_lifetime,
                    "last_receipt": self.last_receipt.to_dict() if self.last_receipt else None,
                },
                indent=2,
            )
            + "\n"
        )


def load_state(state_dir: Path) -> tuple[State, str | None]:
    """The state, and a warning line when it had to be rebuilt."""
    path = Path(state_dir) / STATE_FILE
    try:
        raw = loads(state_folder(state_dir).read_text(STATE_FILE, STATE_CAP))
        return State(
            wake=_count(raw["wake"]),
            tokens_lifetime=_count(raw["tokens_lifetime"]),
            last_receipt=Receipt.from_json(raw.get("last_receipt")),
        ), None
    except FileNotFoundError:
        why = "missing"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = f"unreadable ({type(exc).__name__}: {str(exc)[:80]})"
    state = rebuild_state(state_dir)
    if state.wake == 0 and why == "missing":
        return state, None  # a new agent: nothing to warn about
    return state, (
        f"warning: {path} was {why}; rebuilt from the event log (wake {state.wake}, {state.tokens_lifetime:,} tokens)"
    )


def rebuild_state(state_dir: Path) -> State:
    wake, tokens, last = 0, 0, None
    for event in read_history(Path(state_dir)):  # the retained segments too, oldest first
        record = event.record
        if isinstance(record, WakeStarted):
            wake = max(wake, _count(record.wake))
        elif isinstance(record, WakeFinished):
            tokens += _count(record.tokens)
            last = record.receipt or last
    return State(wake=wake, tokens_lifetime=tokens, last_receipt=last)


def save_state(state_dir: Path, state: State) -> None:
    """Temp file in the same directory, fsync, rename: old or new, never half."""
    state_folder(state_dir).write_atomic(STATE_FILE, state.to_json())


def bump_wake(state_dir: Path, state: State) -> State:
    new = replace(state, wake=state.wake + 1)
    save_state(state_dir, new)
    return new


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a count, got {value!r}")
    return value


# -- inbox and outbox ---------------------------------------------------------------


def _stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _append(path: Path, text: str) -> None:
    state_folder(path.parent).append(path.name, text.encode("utf-8"))


def _read(path: Path, newest: bool = False, since: int = 0) -> str:
    """A message file's text from byte `since`, at most BOX_CAP bytes of it: the first
    (the inbox: oldest first), or with `newest` the last (the outbox: what came last is
    what a person looks for), from a line's start; "" when absent or refused."""
    try:
        fd = state_folder(path.parent).open(path.name)
    except OSError:  # absent, or not ours (a link, a FIFO): nothing to show, nothing taken from it
        return ""
    try:
        size = os.fstat(fd).st_size
        start = max(since, size - BOX_CAP) if newest else since
        data = os.pread(fd, min(BOX_CAP, max(0, size - start)), start)
    finally:
        os.close(fd)
    if start > since:  # cut: from the next line's start, so no body line reads as an entry's mark
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    return data.decode("utf-8", "replace")


def _entry(header: str, text: str) -> str:
    """One inbox/outbox entry. Body lines are indented, so no text, however
    crafted, can start a line with MESSAGE_MARK and forge an entry of its own."""
    body = "\n".join(f"  {line}" for line in text.rstrip().splitlines())
    return f"{MESSAGE_MARK}{header}\n{body}\n"


def send_message_to_agent(state_dir: Path, text: str) -> None:
    """`wakeloop send`: queue a human message for the next wake."""
    with locked(state_dir, INBOX_LOCK):
        _append(Path(state_dir) / INBOX_FILE, _entry(_stamp(), text))


def peek_inbox(state_dir: Path) -> str:
    """What the next wake would drain, without draining it."""
    state_dir = Path(state_dir)
    with locked(state_dir, INBOX_LOCK):
        return _read(state_dir / INBOX_TAKEN) + _read(state_dir / INBOX_FILE)


def drain_inbox(state_dir: Path) -> str:
    """Move queued messages (and any a killed wake left taken) to inbox.taken."""
    state_dir = Path(state_dir)
    inbox, taken = state_dir / INBOX_FILE, state_dir / INBOX_TAKEN
    folder = state_folder(state_dir)
    with locked(state_dir, INBOX_LOCK):
        if folder.is_file(INBOX_FILE):
            if folder.is_file(INBOX_TAKEN):
                _append(taken, _read(inbox))
                folder.unlink(INBOX_FILE)
            else:
                folder.rename(INBOX_FILE, INBOX_TAKEN)
        return _read(taken)


def commit_inbox(state_dir: Path) -> None:
    """The model has seen the messages: they are gone from the queue."""
    with locked(state_dir, INBOX_LOCK):
        state_folder(state_dir).unlink(INBOX_TAKEN)


def restore_inbox(state_dir: Path) -> None:
    """The wake died before the model saw them: back to the head of the queue."""
    state_dir = Path(state_dir)
    inbox, taken = state_dir / INBOX_FILE, state_dir / INBOX_TAKEN
    folder = state_folder(state_dir)
    with locked(state_dir, INBOX_LOCK):
        if not folder.is_file(INBOX_TAKEN):
            return
        folder.write_atomic(INBOX_FILE, _read(taken) + _read(inbox))
        folder.unlink(INBOX_TAKEN)


def count_messages(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith(MESSAGE_MARK))


def split_messages(text: str) -> list[dict[str, Any]]:
    """Inbox or outbox text as [{"header", "text"}], the inverse of _entry."""
    messages: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith(MESSAGE_MARK):
            messages.append({"header": line[len(MESSAGE_MARK) :], "text": ""})
        elif messages:
            body = line[2:] if line.startswith("  ") else line
            messages[-1]["text"] += ("\n" if messages[-1]["text"] else "") + body
    return messages


def append_outbox(state_dir: Path, text: str, wake: int) -> None:
    """send_message: host side, in state/, where the agent cannot touch it."""
    _append(Path(state_dir) / OUTBOX_FILE, _entry(f"{_stamp()} wake {wake}", text))


def read_outbox(state_dir: Path) -> str:
    """The outbox's text: its last BOX_CAP bytes, the newest messages."""
    return _read(Path(state_dir) / OUTBOX_FILE, newest=True)


OUTBOX_READ = "outbox.read"  # in state/: bytes of outbox.txt a person has already seen


def unread_outbox(state_dir: Path) -> int:
    """Messages in outbox.txt past the size recorded when `wakeloop outbox` last showed it."""
    st = state_folder(state_dir).lstat(OUTBOX_FILE)
    size, seen = (st.st_size if st is not None else 0), _seen(state_dir)
    if seen > size:
        seen = 0  # the outbox was cleared since: all of it is new
    return count_messages(_read(Path(state_dir) / OUTBOX_FILE, newest=True, since=seen))


def mark_outbox_read(state_dir: Path) -> None:
    """`wakeloop outbox` showed everything up to here."""
    st = state_folder(state_dir).lstat(OUTBOX_FILE)
    state_folder(state_dir).write_atomic(OUTBOX_READ, f"{st.st_size if st is not None else 0}\n")


def _seen(state_dir: Path) -> int:
    """Bytes of outbox.txt a person has seen (outbox.read); 0 when absent or not a count."""
    try:
        return max(0, int(state_folder(state_dir).read_text(OUTBOX_READ, 64).strip() or 0))
    except (OSError, ValueError):
        return 0


def _rotate_outbox(state_dir: Path, kind: retention.Kind, rules: retention.Retention, now: datetime) -> list[str]:
    """retention.py's rotation of outbox.txt: past rotate_size, the part a person has
    seen (`wakeloop outbox`) moves to a segment, which retention then compresses
    and expires; what is unread stays, unless it alone is past rotate_size (nobody
    reads this outbox): then all of it moves, so the unread part is bounded too.
    Runs under the wake lock, at a wake's start. Nothing is read whole: the live
    file is renamed to the segment, and the unread tail (under rotate_size) copied back."""
    folder = state_folder(state_dir)
    st = folder.lstat(OUTBOX_FILE)
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size < rules.rotate_size:
        return []
    size, seen = st.st_size, _seen(state_dir)
    seen = seen if seen <= size else 0  # cleared since: all of it is unread
    target = retention.segment_name(kind, now)
    folder.rename(OUTBOX_FILE, target)
    folder.write_atomic(OUTBOX_READ, "0\n")
    if size - seen >= rules.rotate_size:
        return [
            f"rotated outbox.txt ({size:,} bytes, {size - seen:,} of them unread, over state.rotate_size) to {target}"
        ]
    fd = folder.open(target, os.O_RDWR)
    try:
        folder.write_atomic(OUTBOX_FILE, os.pread(fd, size - seen, seen))
        os.ftruncate(fd, seen)
    finally:
        os.close(fd)
    return [f"rotated the {seen:,} bytes of outbox.txt already read to {target}"]


retention.register_log(OUTBOX_FILE, rotate=_rotate_outbox)
