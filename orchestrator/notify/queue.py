"""The durable notification queue: `state/notify/`, written before anyone tries to send.

    state/notify/queue/<ns>-<channel>-<rnd>.json  one notification for one channel, waiting
    state/notify/done.jsonl                  one line per item delivered or given up

An item is a whole file written atomically (atomic.atomic_write), named by
the nanosecond it was queued, so a directory listing sorted by name is the
order to send in, and a crash or kill -9 at any moment leaves each item
either fully queued or not yet queued, never half. An item leaves the queue
only after done.jsonl says what became of it, so the worst a crash does is
send one again: delivery is at least once, and every notification carries a
stable `id` for the receiver to deduplicate on.

Every file here is reached through safeio/folder.py (no link followed,
regular files only, reads capped); done.jsonl is also a log of retention.py's,
rotated and expired by the one rule for state/.

An item names its channel by the channel's key and label (config.py), never
by its URL, address or token: nothing secret is ever written under state/.

Not here: when an item is due and how it is sent (sender.py, channels.py).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.records import retention
from orchestrator.safeio.folder import state_folder
from orchestrator.safeio.jsontext import loads

NOTIFY_DIR = "notify"  # under state/
QUEUE_DIR = "queue"
DONE_FILE = "done.jsonl"
SENDER_LOCK = "sender.lock"  # one sender per agent at a time (serve's, or a standalone wake's)
ITEM_CAP = 1 * 2**20  # bytes of a queued item read; ours are a few KiB
# done.jsonl is a log under the one retention rule (rotated, compressed, expired by retention.py).
retention.register_log(f"{NOTIFY_DIR}/{DONE_FILE}")


# What a receiver gets (outcomes.payload makes it): a JSON object, read back from the queue as written.
Payload = dict[str, Any]


@dataclass(frozen=True)
class Item:
    id: str  # the notification's stable id: the same on every channel and retry
    channel: str  # Channel.key
    label: str  # Channel.label: safe to show
    event: str
    payload: Payload  # what the receiver gets (see outcomes.payload)
    queued_at: float  # epoch seconds
    attempts: int = 0
    next_at: float = 0.0  # not before this (epoch seconds)
    last_error: str = ""
    name: str = field(default="", compare=False)  # the file's name in queue/


def notify_dir(state_dir: Path) -> Path:
    return Path(state_dir) / NOTIFY_DIR


def enqueue(state_dir: Path, item: Item) -> Item:
    name = f"{time.time_ns():020d}-{item.channel}-{os.urandom(3).hex()}.json"  # sorts in queued order
    item = replace(item, name=name)
    state_folder(state_dir).write_atomic(f"{NOTIFY_DIR}/{QUEUE_DIR}/{name}", _dump(item), create_dirs=True)
    return item


def pending(state_dir: Path) -> list[Item]:
    """Every waiting item, in the order queued; a file that does not parse is skipped (and kept)."""
    folder, queue = state_folder(state_dir), f"{NOTIFY_DIR}/{QUEUE_DIR}"
    names = sorted(n for n in folder.files(queue) if n.endswith(".json"))  # regular files, no link
    items = []
    for name in names:
        try:
            raw = loads(folder.read_text(f"{queue}/{name}", ITEM_CAP))
            items.append(Item(**{**raw, "name": name}))
        except (OSError, ValueError, TypeError):
            continue
    return items


def update(state_dir: Path, item: Item) -> None:
    state_folder(state_dir).write_atomic(f"{NOTIFY_DIR}/{QUEUE_DIR}/{item.name}", _dump(item))


def finish(state_dir: Path, item: Item, outcome: str, at: float, detail: str = "") -> None:
    """Record what became of an item (sent | gave_up), then take it off the queue."""
    line = (
        json.dumps(
            {
                "id": item.id,
                "channel": item.channel,
                "label": item.label,
                "event": item.event,
                "outcome": outcome,
                "attempts": item.attempts,
                "at": at,
                "detail": detail,
                "queued_at": item.queued_at,
            },
            ensure_ascii=False,
        )
        + "\n"
    )
    folder = state_folder(state_dir)
    folder.append(f"{NOTIFY_DIR}/{DONE_FILE}", line.encode("utf-8"), fsync=True, create_dirs=True)
    folder.unlink(f"{NOTIFY_DIR}/{QUEUE_DIR}/{item.name}")


def done(state_dir: Path) -> list[dict[str, Any]]:
    """What became of every finished item, oldest first; a torn last line is skipped."""
    out = []
    for line in retention.iter_lines([notify_dir(state_dir) / DONE_FILE]):  # capped, no link, no FIFO
        try:
            out.append(loads(line))
        except ValueError:
            continue
    return out


def _dump(item: Item) -> str:
    data = asdict(item)
    data.pop("name")
    return json.dumps(data, ensure_ascii=False)
