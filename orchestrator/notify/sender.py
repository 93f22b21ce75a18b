"""The sender: delivers what is due in an agent's queue, in order per channel, until it is sent or given up.

Rules, each in one place below:

- Order: items go out in the order queued, per channel. While a channel's
  oldest item waits for its retry, the items behind it wait too, so a
  receiver that was down gets everything, once each, in order.
- Backoff: the n-th failed attempt of an item waits BASE_S * 2**(n-1),
  capped at CAP_S, so a receiver back after an hour hears within CAP_S.
- Give up: a failed attempt on an item older than its channel's
  give_up_after (default 24h) ends it; done.jsonl and the events say so,
  and `status` counts it.
- One sender per agent at a time: a non-blocking flock on
  state/notify/sender.lock. serve's thread and a standalone wake's pass
  never deliver the same item at once; the loser just returns.
- Agents apart: under serve each agent's pass runs on a worker of its own,
  so a receiver that stalls (see channels.py's HTTP_DEADLINE_S) delays its
  own agent's notifications only.

Time is passed in (`now`, epoch seconds), never read here: tests drive the
backoff through hours without waiting.

Not here: what a delivery does (channels.py), the files (queue.py).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.notify import queue
from orchestrator.notify.channels import DeliveryError, deliver
from orchestrator.notify.config import Channel
from orchestrator.records import event_types as ev
from orchestrator.records.events import EVENTS_FILE, EventLog
from orchestrator.records.retention import holder

BASE_S = 5.0  # first retry after a failed attempt
CAP_S = 600.0  # longest wait between attempts: a receiver back is heard within this
SERVE_POLL_S = 2.0  # how often serve's sender looks at every agent's queue
SENDER_WORKERS = 8  # agents delivering at once: a slow receiver holds one worker, not all


def retry_after(attempts: int) -> float:
    return min(CAP_S, BASE_S * 2.0 ** max(0, attempts - 1))


@dataclass
class Report:
    sent: list[str] = field(default_factory=list)  # "label: answer"
    failed: list[str] = field(default_factory=list)  # "label: error (retry in Ns)"
    gave_up: list[str] = field(default_factory=list)
    waiting: int = 0  # items still queued after this pass
    busy: bool = False  # another sender holds the lock


def send_due(
    state_dir: Path,
    channels: tuple[Channel, ...],
    *,
    now: float,
    environ: Mapping[str, str] = os.environ,
    send: Callable[[Channel, queue.Payload, Mapping[str, str]], str] = deliver,
) -> Report:
    """One pass over the agent's queue: every item that is due, tried once."""
    report = Report()
    folder = queue.notify_dir(state_dir)
    if not (folder / queue.QUEUE_DIR).is_dir():
        return report
    with _SenderLock(folder) as mine:
        if not mine:
            report.busy = True
            return report
        by_key = {c.key: c for c in channels}
        held: set[str] = set()  # channels whose older item is still waiting: the rest of theirs wait
        for item in queue.pending(state_dir):
            if item.channel in held:
                continue
            channel = by_key.get(item.channel)
            if channel is None:
                _give_up(state_dir, item, now, "its channel is no longer in agent.yaml or notify.yaml", report)
            elif item.next_at > now:
                held.add(item.channel)
            else:
                _attempt(state_dir, channel, item, now, environ, send, report, held)
        report.waiting = len(queue.pending(state_dir))
    return report


def _attempt(
    state_dir: Path,
    channel: Channel,
    item: queue.Item,
    now: float,
    environ: Mapping[str, str],
    send: Callable[[Channel, queue.Payload, Mapping[str, str]], str],
    report: Report,
    held: set[str],
) -> None:
    item = replace(item, attempts=item.attempts + 1)
    try:
        answer = send(channel, item.payload, environ)
    except DeliveryError as exc:
        error = str(exc)
        if now - item.queued_at >= channel.give_up_after_s:
            _give_up(state_dir, item, now, f"still failing after {channel.give_up_after_s / 3600:g}h: {error}", report)
            return
        wait = retry_after(item.attempts)
        queue.update(state_dir, replace(item, next_at=now + wait, last_error=error))
        _event(
            state_dir,
            item,
            ev.NotifyFailed(
                id=item.id, channel=item.label, event=item.event, attempts=item.attempts, error=error, retry_in_s=wait
            ),
        )
        report.failed.append(f"{item.label}: {error} (retry in {wait:g}s)")
        held.add(item.channel)
        return
    queue.finish(state_dir, item, "sent", now, answer)
    _event(
        state_dir,
        item,
        ev.NotifySent(id=item.id, channel=item.label, event=item.event, attempts=item.attempts, answer=answer),
    )
    report.sent.append(f"{item.label}: {answer}")


def _give_up(state_dir: Path, item: queue.Item, now: float, why: str, report: Report) -> None:
    queue.finish(state_dir, item, "gave_up", now, why)
    _event(
        state_dir,
        item,
        ev.NotifyGaveUp(id=item.id, channel=item.label, event=item.event, attempts=item.attempts, error=why),
    )
    report.gave_up.append(f"{item.label}: {why}")


def _event(state_dir: Path, item: queue.Item, record: ev.EventRecord) -> None:
    EventLog(Path(state_dir) / EVENTS_FILE, str(item.payload.get("run_id") or "notify")).write(record)


class _SenderLock:
    """A non-blocking flock: yields True when this process is the agent's sender now."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / queue.SENDER_LOCK

    def __enter__(self) -> bool:
        folder, name = holder(self.path)  # safeio/folder.py: state/notify/ walked, no link followed
        self.fd = folder.open(name, os.O_RDWR | os.O_CREAT, create_dirs=True)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


# -- serve's sender ------------------------------------------------------------------


class SenderThread(threading.Thread):
    """Under `serve`: every SERVE_POLL_S, one pass over every agent's queue under ROOT.
    `agents()` lists (state_dir, channels) fresh each pass, so agent.yaml edits apply.

    Each agent's pass runs on a worker of its own (at most SENDER_WORKERS at once, and never two
    for one agent): a receiver that is slow, or one an agent folder's author made slow on
    purpose, holds that agent's notifications only, never every other agent's."""

    def __init__(
        self,
        agents: Callable[[], list[tuple[Path, tuple[Channel, ...]]]],
        say: Callable[[str], None],
        stop: threading.Event,
        poll_s: float = SERVE_POLL_S,
    ) -> None:
        super().__init__(name="notify-sender", daemon=True)
        self.agents, self.say, self.stop, self.poll_s = agents, say, stop, poll_s
        self._busy: set[Path] = set()
        self._lock = threading.Lock()

    def run(self) -> None:
        with ThreadPoolExecutor(SENDER_WORKERS, thread_name_prefix="notify-send") as pool:
            while not self.stop.is_set():
                try:
                    for state_dir, channels in self.agents():
                        with self._lock:
                            if state_dir in self._busy:
                                continue
                            self._busy.add(state_dir)
                        pool.submit(self._one, state_dir, channels)
                except Exception as exc:  # the sender must outlive any one agent's oddity, and say so
                    self.say(f"notify sender: {type(exc).__name__}: {exc}")
                self.stop.wait(self.poll_s)

    def _one(self, state_dir: Path, channels: tuple[Channel, ...]) -> None:
        try:
            report = send_due(state_dir, channels, now=time.time())
            for line in report.gave_up:
                self.say(f"{Path(state_dir).parent.name}: notification given up: {line}")
        except Exception as exc:  # one agent's oddity costs its own pass, never the sender
            self.say(f"notify sender: {Path(state_dir).parent.name}: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._busy.discard(state_dir)
