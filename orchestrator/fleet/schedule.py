"""When an agent is due: cron lines and intervals, and the last tick handled.

A schedule is a cron line (read by croniter, not by us) in the agent's
`timezone:` (an IANA name, default UTC), or a plain interval (`every: 30s`,
`5m`, `2h`, `1d`). state/schedule.json keeps the last tick handled, so a
restart runs a missed tick once, not once per missed tick, and only if it is
late by less than the agent's interval: a tick missed by more is skipped
aloud (scheduler.py says so and logs `tick_skipped`), not run hours late.

Not here: running wakes (scheduler.py), showing them (views/status.py).
"""

from __future__ import annotations

import functools
import json
import re
import stat
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from orchestrator.errors import ConfigError
from orchestrator.records.atomic import atomic_write
from orchestrator.records.folder import state_folder
from orchestrator.records.jsontext import loads

SCHEDULE_FILE = "schedule.json"  # in state/: the last tick handled, so a restart runs a missed one once
_EVERY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_S = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
DEFAULT_TZ = "UTC"  # cron lines are read in this zone unless agent.yaml says `timezone:`
MIN_INTERVAL_S = 1.0  # `every: 0.1s` would be a busy loop, not a schedule


class ScheduleError(ConfigError):
    """A schedule that is neither cron nor an interval: one line for the human."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def stamp(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%SZ") if t else "-"


@dataclass(frozen=True)
class Schedule:
    text: str
    interval_s: float | None = None  # set for `every: 30s`; None for cron
    tz: str = DEFAULT_TZ  # IANA zone a cron line is read in (DST included); times out are UTC

    def next_after(self, t: datetime) -> datetime:
        if self.interval_s is not None:
            return t + timedelta(seconds=self.interval_s)
        local = t.astimezone(ZoneInfo(self.tz))
        return croniter(self.text, local).get_next(datetime).astimezone(timezone.utc)

    def describe(self) -> str:
        if self.interval_s is not None:
            return f"every {self.interval_s:g}s"
        return f"cron '{self.text}'" + (f" ({self.tz})" if self.tz != DEFAULT_TZ else "")


@functools.lru_cache(maxsize=1024)  # a page of 100 agents parses each line once, not per view
def parse_schedule(text: str, tz: str = DEFAULT_TZ) -> Schedule:
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"timezone {tz!r} is not an IANA name such as UTC or Europe/Berlin") from None
    match = _EVERY.match(text)
    if match:
        seconds = float(match.group(1)) * _UNIT_S[(match.group(2) or "").lower()]
        if seconds < MIN_INTERVAL_S:
            raise ScheduleError(f"interval {text!r} is under {MIN_INTERVAL_S:g}s")
        return Schedule(text, seconds, tz)
    if croniter.is_valid(text):
        return Schedule(text, tz=tz)
    raise ScheduleError(
        f"schedule {text!r} is neither a cron line (like '*/30 * * * *') nor an interval (like `every: 30s`)"
    )


def last_tick(state_dir: Path) -> datetime | None:
    try:
        raw = loads(state_folder(state_dir).read_text(SCHEDULE_FILE, 4096))  # no link, never a FIFO
        return datetime.fromisoformat(raw["last_tick"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_tick(state_dir: Path, tick: datetime) -> None:
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(state_dir) / SCHEDULE_FILE, json.dumps({"last_tick": tick.isoformat()}) + "\n")


def first_due(schedule: Schedule, last: datetime | None, now: datetime) -> datetime:
    """When an agent is next due, seen fresh (at start, or when added or changed).
    A tick missed since `last` is due now, once. A never-woken interval agent is
    due now; a never-woken cron agent waits for its next tick."""
    if last is None:
        return now if schedule.interval_s is not None else schedule.next_after(now)
    missed = schedule.next_after(last)  # in the past when a tick was missed: due at once...
    return schedule.next_after(now) if misfired(schedule, missed, now) else missed


def misfired(schedule: Schedule, tick: datetime, now: datetime) -> bool:
    """...unless it is late by more than the agent's interval: then it is skipped, not run hours late."""
    return now - tick > schedule.next_after(tick) - tick


def next_wake(
    agent_dir: Path, schedule_text: str, now: datetime | None = None, tz: str = DEFAULT_TZ
) -> datetime | None:
    """For `status`: when serve would next wake this agent (None: bad schedule)."""
    try:
        schedule = parse_schedule(schedule_text, tz)
    except ScheduleError:
        return None
    now = now or utcnow()
    return max(first_due(schedule, last_tick(Path(agent_dir) / "state"), now), now)


def agent_dirs(root: Path) -> list[Path]:
    """Folders directly under ROOT that hold agent.yaml, by name. A link (the folder or
    its agent.yaml) is no agent: wakeloop follows no link into or out of an agent folder
    (records/folder.py), and the console shows none, so serve wakes none either."""
    try:
        return sorted(p for p in Path(root).iterdir() if not p.is_symlink() and _holds_agent_yaml(p))
    except OSError:
        return []


def _holds_agent_yaml(folder: Path) -> bool:
    try:
        return stat.S_ISREG((folder / "agent.yaml").lstat().st_mode)
    except OSError:
        return False
