"""When an agent is due, and the last tick handled.

state/schedule.json keeps the last tick handled, so a restart runs a missed
tick once, not once per missed tick, and only if it is late by less than the
agent's interval: a tick missed by more is skipped aloud (scheduler.py says
so and logs `tick_skipped`), not run hours late.

Not here: what a schedule line may say, read once for every command
(policy/schedule_line.py), running wakes (scheduler.py), showing them
(views/fleet_table.py).
"""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.policy.schedule_line import DEFAULT_TZ, Schedule, ScheduleError, parse_schedule
from orchestrator.safeio.atomic import atomic_write
from orchestrator.safeio.folder import state_folder
from orchestrator.safeio.jsontext import loads

SCHEDULE_FILE = "schedule.json"  # in state/: the last tick handled, so a restart runs a missed one once


def utcnow() -> datetime:
    return datetime.now(UTC)


def stamp(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%SZ") if t else "-"


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
    (safeio/folder.py), and the console shows none, so serve wakes none either."""
    try:
        return sorted(p for p in Path(root).iterdir() if not p.is_symlink() and _holds_agent_yaml(p))
    except OSError:
        return []


def _holds_agent_yaml(folder: Path) -> bool:
    try:
        return stat.S_ISREG((folder / "agent.yaml").lstat().st_mode)
    except OSError:
        return False
