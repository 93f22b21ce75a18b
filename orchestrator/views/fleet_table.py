"""`wakeloop status ROOT`: the fleet's table, one row per agent under ROOT, and the lines above it.

Rows are data (what `--json` prints and the console shows), then one text
table; a cell is cut for the table, never in the data.

Not here: one agent's whole status (agent_status.py), the fleet's spending
(budgetview.py), scheduling (fleet/scheduler.py).
"""

from __future__ import annotations

import textwrap
from datetime import datetime
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.fleet.control import scheduler_note
from orchestrator.fleet.schedule import agent_dirs, next_wake, stamp, utcnow
from orchestrator.policy.agent import load_agent
from orchestrator.records import placement, stopswitch
from orchestrator.records.ledger import LedgerError, read_book
from orchestrator.records.models import lifecycle_warning
from orchestrator.records.state import load_state, lock_holder, unread_outbox
from orchestrator.records.tasks import TaskError, open_tasks
from orchestrator.records.transcript import find_run, read_lines
from orchestrator.sandbox.containers.output import clean
from orchestrator.views.agent_status import health_line, health_status
from orchestrator.views.budgetview import COST_DAYS, budget_line, fleet_budget, usd_by_day
from orchestrator.views.diskview import disk_status

CELL_CHARS = 60  # a table cell is cut to this, at a word boundary; --json has it whole

STATUS_HEADER = [
    "AGENT",
    "MODE",
    "LAST WAKE",
    "RESULT",
    "NEXT WAKE",
    "HEALTH",
    "TOKENS TODAY",
    "TOKENS TOTAL",
    "USD TODAY",
    "USD TOTAL",
    "OPEN TASKS",
    "UNREAD OUTBOX",
]
_ROW_KEYS = [
    "agent",
    "mode",
    "last_wake",
    "result",
    "next_wake",
    "health",
    "tokens_today",
    "tokens_total",
    "usd_today",
    "usd_total",
    "open_tasks",
    "unread_outbox",
]


def fleet_status(root: Path, now: datetime | None = None, load=load_agent) -> list[dict]:
    """One dict per agent under ROOT (a config error is a row that says so).
    `load`: how an agent is loaded (the console passes a cached load_agent)."""
    now = now or utcnow()
    no_scheduler = scheduler_note(root) is not None
    return [fleet_row(path, now, no_scheduler, load) for path in agent_dirs(root)]


def fleet_row(path: Path, now: datetime, no_scheduler: bool, load=load_agent) -> dict:
    """One agent's row of the fleet table."""
    sd = path / "state"
    try:
        agent = load(path)
    except (ConfigError, ValueError) as exc:
        return {
            "agent": path.name,
            "dir_name": path.name,
            "mode": "-",
            "last_wake": "config error",
            "result": str(exc),
            "error": str(exc),
            "state": "config error",
        }
    state, _ = load_state(sd)
    r = state.last_receipt
    nxt = next_wake(path, agent.schedule, now, agent.timezone)
    h = health_status(sd)[0]
    row = {
        "agent": agent.name,
        "mode": "dry" if agent.dry_run else "live",
        "last_wake": _short_time(r.started_at, now) if r else "never",
        "result": f"#{r.wake} {r.status}" if r else "-",
        "next_wake": (
            "fleet stopped"
            if stopswitch.is_stopped(path.parent)
            else "paused"
            if h["paused"]
            else "no scheduler"
            if no_scheduler
            else stamp(nxt)
            if nxt
            else "bad schedule"
        ),
        "next_wake_at": nxt.timestamp() if nxt else None,
        "health": health_line(h),
        "tokens_total": f"{state.tokens_lifetime:,}",
        "unread_outbox": str(unread_outbox(sd)),
        "dir_name": path.name,
        "receipt": r.to_dict() if r else None,
        "health_detail": h,
        "running": current_wake(sd),
        "disk": disk_status(agent),
        "model": agent.model,
        "model_warning": lifecycle_warning(agent.model),
    }
    row["state"] = "running" if row["running"] else "paused" if h["paused"] else "failing" if h["failures"] else "ok"
    row["node"] = placement.read_node(sd) or "-"  # past one host: the node it is placed on
    if not h["paused"] and r and r.status == "skipped_node":
        row["state"] = "unavailable"  # its node's broker does not answer: not failing, waiting
        row["health"] = f"unavailable (node {row['node']} does not answer)"
    try:
        book = read_book(sd)
        day = book.day(now.strftime("%Y-%m-%d"))
        row.update(
            usd_today="unknown" if day.unpriced else f"${day.usd:.4f}",
            usd_total="unknown" if book.lifetime.unpriced else f"${book.lifetime.usd:.4f}",
            tokens_today=f"{day.tokens:,}",
            usd_by_day=usd_by_day(book, now, COST_DAYS),
        )
        row["usd_30d"] = round(sum(usd for _, usd in row["usd_by_day"]), 6)
    except LedgerError:
        row.update(
            usd_today="? (ledger unreadable)", usd_total="? (ledger unreadable)", tokens_today="? (ledger unreadable)"
        )
    try:
        row["open_tasks"] = str(len(open_tasks(sd)))
    except TaskError:
        row["open_tasks"] = "?"
    return row


def current_wake(sd: Path) -> dict | None:
    """The wake running now (its lock is held by a live process): its run and its step so far,
    from its transcript, the newest. None when no wake runs."""
    holder = lock_holder(sd)
    if holder is None:
        return None
    newest = find_run(sd, None)
    lines = list(read_lines(newest)) if newest else []
    if newest is None or not lines or lines[-1]["type"] == "end" or lines[0]["type"] != "wake":
        return {"run_id": None, "step": 0, "started_at": holder.started, "pid": holder.pid}
    steps = [line["step"] for line in lines if isinstance(line.get("step"), int)]
    return {"run_id": newest.stem, "step": max(steps, default=0), "started_at": lines[0].get("t"), "pid": holder.pid}


def render_fleet(rows: list[dict], root: Path) -> str:
    if not rows:
        return f"no agents under {root}: create one with `wakeloop init {root}/NAME`"
    spread = any(r.get("node", "-") != "-" for r in rows)  # a swarm's agents: one more column, NODE
    keys, header = (_ROW_KEYS + ["node"], STATUS_HEADER + ["NODE"]) if spread else (_ROW_KEYS, STATUS_HEADER)
    cells = [[_cut(str(r.get(k, "-")), CELL_CHARS) for k in keys] for r in rows]
    table = [header, *cells]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    notes = [n for n in (*fleet_notes(root), scheduler_note(root)) if n]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    warned = [clean(f"{r['agent']}: {r['model_warning']}") for r in rows if r.get("model_warning")]  # below the table
    return "\n".join(notes + lines + warned)


def fleet_notes(root: Path) -> list[str]:
    """Lines about the whole fleet, above its table: the switch (ROOT/STOP), and the
    fleet's spending where a budget caps it (ROOT/budget.yaml, or the ceiling)."""
    halted = stopswitch.read(root)
    budget = fleet_budget(root)
    return ([f"STOPPED: {halted.describe()}"] if halted else []) + (
        [budget_line(budget)] if "error" in budget or budget["capped"] else []
    )


def status_table(root: Path) -> str:
    return render_fleet(fleet_status(Path(root)), root)


def _short_time(iso: str | None, now: datetime) -> str:
    try:
        t = datetime.fromisoformat(str(iso).replace("Z", "+00:00"))
    except ValueError:
        return str(iso or "-")
    return stamp(t)


def _cut(text: str, width: int) -> str:
    """At most `width` characters, cut at a word boundary (--json keeps the whole text)."""
    return text if len(text) <= width else textwrap.shorten(text, width, placeholder="...")
