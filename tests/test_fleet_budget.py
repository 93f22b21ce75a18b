"""Budgets across the month and the fleet: `budget.max_usd_per_month`, ROOT/budget.yaml, the ceiling's bounds.

The arithmetic is pinned on ledgers written as the harness writes them; the
wakes drive the real loop with the real `anthropic` SDK against
orchestrator/testing/fakeapi.py, with priced usage, and prove that a call whose worst
case would pass a fleet cap is never sent, and the receipt names the cap.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.policy.fleetbudget import BUDGET_FILE, load_fleet_budget
from orchestrator.policy.schema import Budget, PolicyError
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.ledger import FleetCaps, Meter, load_prices, read_book, record
from orchestrator.testing.fakeapi import text, tool_use, turn, usage
from orchestrator.views.budgetview import fleet_budget
from orchestrator.views.fleet_table import fleet_notes
from tests.helpers import set_policy, today

MODEL = "claude-sonnet-4-6"  # $3 / $15 per million input / output tokens
LIGHT = {"sandbox": {"disk": "none", "pool": 0}}


def write_ledger(state_dir: Path, days: dict[str, float]) -> None:
    """A ledger.json as record() writes it, with spending on the given UTC days."""
    state_dir.mkdir(parents=True, exist_ok=True)
    rows = {d: {"usd": usd, "tokens": 1, "calls": 1, "unpriced": 0} for d, usd in days.items()}
    (state_dir / "ledger.json").write_text(
        json.dumps(
            {
                "version": 1,
                "days": rows,
                "lifetime": {"usd": sum(days.values()), "tokens": len(days), "calls": len(days), "unpriced": 0},
            }
        )
    )


def last_month() -> str:
    first = datetime.now(UTC).replace(day=1)
    return (first - timedelta(days=1)).strftime("%Y-%m-%d")


# -- the month, one agent ------------------------------------------------------------


def test_the_month_cap_counts_this_months_days_and_not_last_months(tmp_path):
    write_ledger(tmp_path, {last_month(): 500.0, today(): 0.98})
    assert read_book(tmp_path).month() == pytest.approx(0.98)
    prices = load_prices(environ={})
    over = Meter(tmp_path, MODEL, Budget(max_usd_per_day=0, max_usd_per_month=1.0), prices).check(1000, 2000)
    assert over and over.cap == "max_usd_per_month" and "$0.9800 spent this month (UTC)" in over.reason
    assert Meter(tmp_path, MODEL, Budget(max_usd_per_day=0, max_usd_per_month=2.0), prices).check(1000, 1000) is None


# -- ROOT/budget.yaml ----------------------------------------------------------------


def test_the_fleet_caps_add_up_every_agents_ledger_and_see_new_spending(tmp_path):
    root = tmp_path / "agents"
    for name, usd in (("a", 0.40), ("b", 0.50), ("c", 0.0)):
        write_ledger(root / name / "state", {today(): usd, last_month(): 100.0})
    caps = FleetCaps(root, max_usd_per_day=1.0, max_usd_per_month=50.0, source=str(root / BUDGET_FILE))
    meter = Meter(root / "c" / "state", MODEL, Budget(), load_prices(environ={}), fleet=caps)
    assert meter.check(1000, 1000) is None  # $0.90 + ~$0.02 < $1
    record(root / "a" / "state", 0.09, 10)  # another agent spends: seen at once
    over = meter.check(1000, 1000)
    assert over and over.cap == "fleet.max_usd_per_day"
    assert "$0.9900 spent today (UTC) by the 3 agent(s)" in over.reason and "budget.yaml" in over.reason
    month = Meter(
        root / "c" / "state",
        MODEL,
        Budget(),
        load_prices(environ={}),
        fleet=FleetCaps(root, max_usd_per_month=0.95, source="x"),
    ).check(1000, 1000)
    assert month and month.cap == "fleet.max_usd_per_month"  # last month's $300 is not this month's


def test_a_budget_file_is_checked_and_bounded_by_the_ceiling_with_file_line_key(tmp_path):
    root = tmp_path / "agents"
    root.mkdir()
    assert not load_fleet_budget(root, environ={})  # no file, no ceiling: no fleet cap
    ceiling = tmp_path / "ceiling.yaml"
    ceiling.write_text("max:\n  fleet_usd_per_day: 100\n  fleet_usd_per_month: 1000\n")
    env = {"WAKELOOP_CEILING": str(ceiling)}
    caps = load_fleet_budget(root, environ=env)  # no file: the ceiling's are the caps
    assert (caps.max_usd_per_day, caps.max_usd_per_month) == (100, 1000) and str(ceiling) in caps.source
    budget = root / BUDGET_FILE
    budget.write_text("max_usd_per_day: 20\nmax_usd_per_month: 300\n")
    caps = load_fleet_budget(root, environ=env)
    assert (caps.max_usd_per_day, caps.max_usd_per_month, caps.source) == (20, 300, str(budget))
    for body, line, why in (
        ("max_usd_per_day: 20\nmax_usd_per_mnth: 300\n", 2, "unknown key"),
        ("max_usd_per_day: 20\nmax_usd_per_month: 3000\n", 2, "is over the ceiling's max.fleet_usd_per_month"),
        ("max_usd_per_day: 0\n", 1, "0 (no cap) is over the ceiling"),
        ("max_usd_per_day: lots\n", 1, "expected USD as a number"),
    ):
        budget.write_text(body)
        with pytest.raises(PolicyError, match=rf"^{re.escape(str(budget))}:{line}: \w+: (\$[\d,.]+ )?{re.escape(why)}"):
            load_fleet_budget(root, environ=env)


@pytest.mark.docker
def test_a_wake_stopped_by_the_fleets_day_cap_ends_budget_stop_naming_it(tmp_path, fake_api):
    from orchestrator.wake.loop import wake

    root = tmp_path / "agents"
    other, mine = init_agent(root / "other"), init_agent(root / "mine")
    set_policy(mine, {**LIGHT, "budget": {"max_output_tokens": 1000}}, model=MODEL)
    record(other / "state", 0.009, 100)  # the rest of the fleet, today
    (root / BUDGET_FILE).write_text("max_usd_per_day: 0.04   # all agents, USD\n")
    # The first call's worst case (~$0.01 of input + 1000 output tokens at $15/MTok) fits under
    # $0.04 with $0.009 spent; it reports $0.033, so the second call's would pass the cap.
    api = fake_api(
        [turn(tool_use("bash", {"command": "echo one"}), usage=usage(input_tokens=1000, output_tokens=2000))],
        then=turn(text("never reached")),
    )
    receipt = wake(load_agent(mine), live=True)

    assert len(api.requests) == 1, "the fake API saw a call the fleet's cap should have stopped"
    assert receipt.status == "budget_stop"
    assert receipt.reason.startswith(f"fleet.max_usd_per_day: {root / BUDGET_FILE}:") and "$0.0400" in receipt.reason
    stop = [e for e in read_events(mine / "state" / EVENTS_FILE) if e.type == "budget_stop"]
    assert stop and stop[0].data["cap"] == "fleet.max_usd_per_day"
    assert fleet_budget(root)["usd_today"] == pytest.approx(0.009 + (1000 * 3 + 2000 * 15) / 1e6)


def test_a_wake_the_fleets_month_cannot_afford_is_blocked_and_status_says_so(tmp_path, fake_api):
    from orchestrator.wake.loop import wake

    root = tmp_path / "agents"
    other, mine = init_agent(root / "other"), init_agent(root / "mine")
    set_policy(mine, LIGHT, model=MODEL)
    write_ledger(other / "state", {today(): 9.99})
    (root / BUDGET_FILE).write_text("max_usd_per_month: 10\n")
    api = fake_api(then=turn(text("never reached")))
    receipt = wake(load_agent(mine), live=True)
    assert receipt.status == "blocked" and receipt.reason.startswith("fleet.max_usd_per_month:")
    assert api.requests == []
    (line,) = fleet_notes(root)
    assert line.startswith("fleet spend: $9.9900 today (no cap), $9.9900 this month of $10.00 (")
