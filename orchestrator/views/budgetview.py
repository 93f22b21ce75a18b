"""What the fleet spent and may spend, as a person reads it: the fleet's budget line and its cost per day.

Not here: the caps (policy/fleetbudget.py), the ledgers and their sum
(records/ledger.py), an agent's own spending line (agent_status.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.policy.fleetbudget import load_fleet_budget
from orchestrator.records.ledger import FLEET_BOOKS

COST_DAYS = 30  # the fleet's cost chart: this many UTC days up to today


def usd_by_day(book, now: datetime, days: int) -> list[tuple[str, float]]:
    """The ledger's USD per UTC day for the `days` days up to `now`, oldest first (0 for none)."""
    dates = [(now - timedelta(days=n)).strftime("%Y-%m-%d") for n in range(days - 1, -1, -1)]
    return [(d, round(book.days[d].usd, 6) if d in book.days else 0.0) for d in dates]


def fleet_budget(root: Path) -> dict:
    """What all agents under ROOT spent today and this month (UTC), against the fleet's caps."""
    try:
        caps = load_fleet_budget(root)
        spent = FLEET_BOOKS.spent(root)
    except ConfigError as exc:  # a bad budget.yaml or ceiling, an unreadable ledger: said, not raised
        return {"error": str(exc)}
    return {
        "usd_today": round(spent.today, 6),
        "usd_month": round(spent.month, 6),
        "unreadable": spent.unreadable,
        "max_usd_per_day": caps.max_usd_per_day or None,
        "max_usd_per_month": caps.max_usd_per_month or None,
        "capped": bool(caps),
        "source": caps.source,
    }


def budget_line(b: dict) -> str:
    if "error" in b:
        return f"fleet budget: {b['error']}"
    of = lambda cap: f" of ${cap:,.2f}" if cap else " (no cap)"
    return (
        f"fleet spend: ${b['usd_today']:.4f} today{of(b['max_usd_per_day'])}, "
        f"${b['usd_month']:.4f} this month{of(b['max_usd_per_month'])}"
        + (f" ({b['source']})" if b["source"] else "; ROOT/budget.yaml would cap all agents together")
        + (f"; {b['unreadable']} agent ledger(s) unreadable, left out of the sum" if b.get("unreadable") else "")
    )
