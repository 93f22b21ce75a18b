"""An agent's `schedule:` (or `every:`) and `timezone:` read into a Schedule: one parser, so a
line that `serve` would refuse is refused by every command that loads the agent (policy/agent.py).

A schedule is a cron line of five fields (read by croniter, not by us; croniter's @daily and
the like too) in the agent's `timezone:` (an IANA name, default UTC), or a plain interval
(`every: 30s`, `5m`, `2h`, `1d`). croniter also takes six or seven fields (its sixth is
seconds, at the end, not where other crons put them): refused, so a line means one thing.

Not here: when an agent is due and the last tick handled (fleet/schedule.py), running wakes
(fleet/scheduler.py).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from orchestrator.errors import ConfigError

_EVERY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_S = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
DEFAULT_TZ = "UTC"  # cron lines are read in this zone unless agent.yaml says `timezone:`
MIN_INTERVAL_S = 1.0  # `every: 0.1s` would be a busy loop, not a schedule
CRON_FIELDS = 5  # minute hour day-of-month month day-of-week


class ScheduleError(ConfigError):
    """A schedule that is neither cron nor an interval: one line for the human."""


@dataclass(frozen=True)
class Schedule:
    text: str
    interval_s: float | None = None  # set for `every: 30s`; None for cron
    tz: str = DEFAULT_TZ  # IANA zone a cron line is read in (DST included); times out are UTC

    def next_after(self, t: datetime) -> datetime:
        if self.interval_s is not None:
            return t + timedelta(seconds=self.interval_s)
        local = t.astimezone(ZoneInfo(self.tz))
        after: datetime = croniter(self.text, local).get_next(datetime)  # croniter ships no types
        return after.astimezone(UTC)

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
    fields = text.split()
    if (len(fields) == CRON_FIELDS or fields[:1] and fields[0].startswith("@")) and croniter.is_valid(text):
        return Schedule(text, tz=tz)
    raise ScheduleError(
        f"{text!r} is neither a cron line of five fields (like '*/30 * * * *') nor an interval (like `every: 30s`)"
    )
