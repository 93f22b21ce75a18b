"""The dollar ledger: prices as data, cost from real usage, caps checked before a call.

The unit tests pin the arithmetic; the wake tests drive the real loop with the
real `anthropic` SDK against orchestrator/testing/fakeapi.py and prove that a call whose
worst case would cross a USD cap is never sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.policy.agent import load_agent
from orchestrator.policy.schema import Budget
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.ledger import (
    PRICES_ENV,
    LedgerError,
    Meter,
    Usage,
    check_caps,
    cost_usd,
    load_prices,
    price_for,
    read_book,
    record,
    table_entry,
    worst_case_usd,
)
from orchestrator.testing.fakeapi import FAKE_KEY, text, tool_use, turn, usage
from tests.helpers import REPO, set_policy

KEY = FAKE_KEY


# -- prices and arithmetic ----------------------------------------------------------


def test_every_shipped_price_has_all_five_rates_and_a_source():
    prices = load_prices(environ={})
    assert "claude-sonnet-5-5" in prices and "claude-haiku-4-5" in prices
    for name, p in prices.items():
        assert p.source.startswith("https://"), name
        if p.unpriced:
            assert price_for(name, prices) is None, name
            continue
        for rates in (p, p.long_prompt) if p.long_prompt else (p,):
            assert rates.output > rates.input > rates.cache_read > 0, name
            assert rates.cache_write_1h > rates.cache_write_5m > rates.input, name


def sdk_models() -> set[str]:
    """Every model id the installed `anthropic` SDK names (its ModelParam literal)."""
    from typing import get_args

    from anthropic.types.model_param import ModelParam

    return {m for arg in get_args(ModelParam) for m in get_args(arg) if isinstance(m, str)}


def test_every_model_the_installed_sdk_lists_is_priced_or_knowingly_not():
    """The next SDK upgrade that adds a model fails here, not in a user's first wake."""
    prices = load_prices(environ={})
    known = sdk_models()
    assert "claude-sonnet-5-5" in known  # the SDK is the one the issue was written against, or newer
    missing = sorted(m for m in known if table_entry(m, prices) is None)
    assert not missing, f"add these to orchestrator/records/prices.json (priced, or `unpriced` with why): {missing}"


def test_todays_lineup_is_priced_at_the_published_rates():
    prices = load_prices(environ={})
    rates = {m: (p.input, p.output, p.cache_write_5m, p.cache_write_1h, p.cache_read) for m, p in prices.items()}
    assert rates["claude-sonnet-5-5"] == (2, 10, 2.5, 4, 0.10)
    assert rates["claude-opus-5-5"] == (4, 20, 5, 8, 0.20)
    assert rates["claude-fable-5-1"] == (10, 50, 12.5, 20, 0.25)
    assert rates["claude-haiku-4-5"] == (1, 5, 1.25, 2, 0.10)
    assert price_for("claude-haiku-4-5-20251001", prices) == prices["claude-haiku-4-5"]
    assert prices["claude-mythos-preview"].unpriced and price_for("claude-mythos-preview", prices) is None


def test_haiku_5_5_above_100k_prompt_tokens_bills_the_whole_request_at_the_long_band():
    p = load_prices(environ={})["claude-haiku-5-5"]
    short = Usage(input_tokens=50_000, output_tokens=1_000, cache_read_tokens=50_000)  # 100,000: not above
    assert cost_usd(p, short) == pytest.approx((50_000 * 0.10 + 1_000 * 0.50 + 50_000 * 0.01) / 1e6)
    long = Usage(input_tokens=1, output_tokens=1_000, cache_read_tokens=50_000, cache_write_5m_tokens=50_000)
    assert cost_usd(p, long) == pytest.approx((1 * 0.50 + 1_000 * 2.50 + 50_000 * 0.05 + 50_000 * 0.625) / 1e6)
    assert worst_case_usd(p, 200_000, 1_000) == pytest.approx(1.1 * (200_000 * 0.625 + 1_000 * 2.50) / 1e6)


def test_inference_geo_us_multiplies_every_rate_where_the_table_says_so():
    prices = load_prices(environ={})
    u = Usage(input_tokens=1_000_000, output_tokens=1_000_000, cache_read_tokens=1_000_000)
    assert cost_usd(prices["claude-sonnet-5-5"], u, "us") == pytest.approx(1.1 * (2 + 10 + 0.10))
    assert cost_usd(prices["claude-sonnet-5-5"], u, "global") == pytest.approx(2 + 10 + 0.10)
    assert cost_usd(prices["claude-haiku-4-5"], u, "us") == pytest.approx(1 + 5 + 0.10)  # before 4.6: no geo


def test_usage_reads_thinking_tokens_as_a_part_of_output():
    u = Usage.from_api({"input_tokens": 3, "output_tokens": 50, "output_tokens_details": {"thinking_tokens": 40}})
    assert (u.output_tokens, u.thinking_tokens, u.tokens) == (50, 40, 53)
    assert Usage.from_json(u.to_json()) == u


def test_a_dated_snapshot_uses_its_undated_price_and_an_unknown_model_has_none():
    prices = load_prices(environ={})
    assert price_for("claude-sonnet-4-5-20250929", prices) == prices["claude-sonnet-4-5"]
    assert price_for("claude-imaginary-9", prices) is None


def test_cost_counts_each_kind_of_token_at_its_own_rate():
    p = load_prices(environ={})["claude-sonnet-4-6"]  # 3 / 15 / 3.75 / 6 / 0.30 per MTok
    u = Usage(
        input_tokens=1_000_000,
        output_tokens=100_000,
        cache_write_5m_tokens=200_000,
        cache_write_1h_tokens=100_000,
        cache_read_tokens=1_000_000,
    )
    assert cost_usd(p, u) == pytest.approx(3.0 + 1.5 + 0.75 + 0.6 + 0.30)


def test_usage_from_the_api_splits_cache_writes_by_ttl():
    raw = {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_input_tokens": 7,
        "cache_creation_input_tokens": 30,
        "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 20},
    }
    assert Usage.from_api(raw) == Usage(10, 5, 10, 20, 7)
    # Without the breakdown every write is a 5-minute write, the API's default.
    assert Usage.from_api({"input_tokens": 1, "cache_creation_input_tokens": 9}) == Usage(1, 0, 9, 0, 0)


def test_worst_case_is_every_input_token_written_to_the_cache_plus_max_tokens_of_output():
    p = load_prices(environ={})["claude-haiku-4-5"]  # no inference_geo before 4.6
    assert worst_case_usd(p, 100_000, 4096) == pytest.approx((100_000 * 1.25 + 4096 * 5) / 1e6)
    assert worst_case_usd(p, 100_000, 0, cache_ttl="1h") == pytest.approx(100_000 * 2 / 1e6)
    geo = load_prices(environ={})["claude-sonnet-4-6"]  # the dearest geography: 1.1x
    assert worst_case_usd(geo, 100_000, 4096) == pytest.approx(1.1 * (100_000 * 3.75 + 4096 * 15) / 1e6)


def test_a_prices_file_in_the_environment_overrides_and_adds_models(tmp_path):
    override = tmp_path / "prices.json"
    override.write_text(
        json.dumps(
            {
                "models": {
                    "claude-sonnet-4-6": {
                        "input": 1,
                        "output": 2,
                        "cache_write_5m": 1,
                        "cache_write_1h": 1,
                        "cache_read": 0.1,
                        "source": "our contract, 2026",
                    },
                    "my-proxy-model": {
                        "input": 9,
                        "output": 9,
                        "cache_write_5m": 9,
                        "cache_write_1h": 9,
                        "cache_read": 9,
                        "source": "internal",
                    },
                }
            }
        )
    )
    prices = load_prices(environ={PRICES_ENV: str(override)})
    assert prices["claude-sonnet-4-6"].output == 2 and prices["my-proxy-model"].input == 9
    assert prices["claude-haiku-4-5"].output == 5  # untouched entries stay


def test_a_bad_prices_file_is_one_line_naming_the_key(tmp_path):
    bad = tmp_path / "prices.json"
    bad.write_text(json.dumps({"models": {"m": {"input": "cheap"}}}))
    with pytest.raises(LedgerError, match=r"models\.m\.input"):
        load_prices(environ={PRICES_ENV: str(bad)})


def test_a_usd_cap_on_a_model_without_a_price_refuses_with_one_line():
    with pytest.raises(LedgerError, match="max_usd_per_day is set but model 'claude-imaginary-9' has no known price"):
        check_caps(
            "claude-imaginary-9", Budget(max_usd_per_wake=0, max_usd_per_day=1.0), load_prices(environ={}), "p.yaml"
        )
    unpriced = ("claude-imaginary-9", load_prices(environ={}), "p.yaml")
    with pytest.raises(LedgerError, match="max_usd_per_wake is set .* or set budget.allow_unpriced: true"):
        check_caps(unpriced[0], Budget(), *unpriced[1:])  # capped by default
    assert check_caps(unpriced[0], Budget(allow_unpriced=True), *unpriced[1:]) is None
    assert (
        check_caps(unpriced[0], Budget(max_usd_per_wake=0, max_usd_per_day=0, max_usd_per_month=0), *unpriced[1:])
        is None
    )


def test_a_usd_cap_of_0_in_a_policy_file_is_no_cap_as_documented_and_a_negative_one_is_one_line(tmp_path):
    from orchestrator.policy.load import PolicyError, load_policy

    caps = ("max_usd_per_wake", "max_usd_per_day", "max_usd_per_month")
    (tmp_path / "p.yaml").write_text("version: 1\nbudget:\n" + "".join(f"  {cap}: 0\n" for cap in caps))
    budget = load_policy(tmp_path / "p.yaml").budget
    assert [getattr(budget, cap) for cap in caps] == [0, 0, 0]
    record(tmp_path, 10**6, 1)  # a million dollars spent today: no cap, so nothing stops the next call
    assert Meter(tmp_path, "claude-sonnet-4-6", budget, load_prices(environ={})).check(10**6, 10**5) is None
    (tmp_path / "p.yaml").write_text("version: 1\nbudget:\n  max_usd_per_day: -1\n")
    with pytest.raises(
        PolicyError, match=r"p.yaml:3: budget.max_usd_per_day: expected USD .* at least 0 \(0: no cap\)"
    ):
        load_policy(tmp_path / "p.yaml")


def test_the_book_keeps_today_and_lifetime(tmp_path):
    record(tmp_path, 0.25, 1000)
    book = record(tmp_path, 0.5, 500)
    assert book.day().usd == pytest.approx(0.75) and book.day().tokens == 1500 and book.day().calls == 2
    assert read_book(tmp_path).lifetime.usd == pytest.approx(0.75)


def test_a_broken_ledger_stops_spending_under_a_day_cap_and_is_left_as_found(tmp_path):
    prices = load_prices(environ={})
    (tmp_path / "ledger.json").write_text("{not json")
    with pytest.raises(LedgerError, match="ledger.json is unreadable"):
        read_book(tmp_path)  # never an empty book: that resets the day cap
    capped = Meter(tmp_path, "claude-sonnet-4-6", Budget(max_usd_per_day=100.0), prices)
    assert "today's spending is unknown" in capped.check(input_tokens=10, max_tokens=10).reason
    uncapped = Meter(
        tmp_path, "claude-sonnet-4-6", Budget(max_usd_per_wake=100.0, max_usd_per_day=0, max_usd_per_month=0), prices
    )
    assert uncapped.check(input_tokens=10, max_tokens=10) is None
    uncapped.record(Usage(input_tokens=10, output_tokens=10))
    assert (tmp_path / "ledger.json").read_text() == "{not json"


def test_the_meter_stops_on_the_day_cap_from_earlier_wakes(tmp_path):
    prices = load_prices(environ={})
    record(tmp_path, 0.99, 1)  # spent earlier today
    meter = Meter(tmp_path, "claude-sonnet-4-6", Budget(max_usd_per_day=1.0), prices)
    reason = meter.check(input_tokens=1000, max_tokens=1000).reason
    assert reason and reason.startswith("max_usd_per_day") and "$0.9900 spent today" in reason
    assert Meter(tmp_path, "claude-sonnet-4-6", Budget(max_usd_per_day=2.0), prices).check(1000, 1000) is None


def test_a_dry_run_meter_counts_tokens_but_bills_nothing(tmp_path):
    meter = Meter(tmp_path, "claude-imaginary-9", Budget(max_usd_per_wake=0.01), {}, billed=False)
    assert meter.check(10**9, 10**6) is None
    assert meter.record(Usage(input_tokens=100, output_tokens=10)) == 0
    assert read_book(tmp_path).day().tokens == 110


# -- whole wakes against the fake API ------------------------------------------------


@pytest.mark.docker
def test_a_call_whose_worst_case_crosses_the_wake_cap_is_never_sent(agent_dir, fake_api):
    from orchestrator.wake.loop import wake

    # Worst case of one call at sonnet-4-6 prices: input (a few thousand tokens at
    # $3.75/MTok, ~$0.01) + 1000 output tokens at $15/MTok ($0.015): ~$0.025.
    # The first call fits under $0.05; it reports 2,000 output tokens ($0.03), so
    # the second call's worst case would pass the cap and must not be made.
    set_policy(agent_dir, {"budget": {"max_usd_per_wake": 0.05, "max_output_tokens": 1000}}, model="claude-sonnet-4-6")
    api = fake_api(
        [turn(tool_use("bash", {"command": "echo one"}), usage=usage(input_tokens=1000, output_tokens=2000))],
        then=turn(text("never reached")),
    )
    receipt = wake(load_agent(agent_dir), live=True)

    assert len(api.requests) == 1, "the fake API saw a call the cap should have stopped"
    assert receipt.status == "budget_stop"
    assert "max_usd_per_wake" in receipt.reason and "$0.0500" in receipt.reason
    events = list(read_events(agent_dir / "state" / EVENTS_FILE))
    stop = [e for e in events if e.type == "budget_stop"]
    assert stop and stop[0].data.get("cap") == "max_usd_per_wake"
    book = read_book(agent_dir / "state")
    assert book.day().usd == pytest.approx((1000 * 3 + 2000 * 15) / 1e6)  # reconciled from real usage
    assert book.lifetime.calls == 1


def test_a_wake_the_day_cap_cannot_afford_is_blocked_and_exits_1(agent_dir, fake_api):
    set_policy(agent_dir, {"budget": {"max_usd_per_day": 0.01}}, model="claude-sonnet-4-6")
    record(agent_dir / "state", 0.0099, 100)  # today's earlier spending
    api = fake_api(then=turn(text("never reached")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAKELOOP_")}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "wake", str(agent_dir), "--live"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )

    assert done.returncode == 1, done.stderr
    receipt = json.loads(done.stdout.strip().splitlines()[-1])
    assert receipt["status"] == "blocked" and "max_usd_per_day" in receipt["reason"]
    assert api.requests == []
    assert "blocked" in [e.type for e in read_events(agent_dir / "state" / EVENTS_FILE)]


def test_a_usd_cap_on_an_unpriced_model_refuses_to_start_with_one_line(agent_dir):
    set_policy(agent_dir, {"budget": {"max_usd_per_wake": 1}}, model="claude-imaginary-9")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WAKELOOP_", "ANTHROPIC_"))}
    env["ANTHROPIC_API_KEY"] = KEY
    env["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"  # never reached: refused before any call
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "wake", str(agent_dir), "--live"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no known price" in lines[0] and "Traceback" not in done.stderr


def test_a_cost_with_unpriced_calls_is_unknown_in_status_and_the_digest_never_zero(agent_dir):
    from orchestrator.notify.outcomes import digest
    from orchestrator.policy.schema import Budget
    from orchestrator.records.events import EventLog
    from orchestrator.records.ledger import Meter, Usage, read_book
    from orchestrator.views.agent_status import agent_status, render_agent_status

    agent = load_agent(agent_dir)
    meter = Meter(agent.state_dir, "model-with-no-price", Budget(allow_unpriced=True), {})
    meter.record(Usage(input_tokens=1000, output_tokens=200))
    assert read_book(agent.state_dir).day().unpriced == 1
    text = render_agent_status(agent_status(agent))
    assert "unknown (1 call(s) at no known price" in text and "$0.0000 today" not in text
    EventLog(agent.state_dir / EVENTS_FILE, "r1").emit(
        "wake_finished", receipt={"status": "done", "model": "model-with-no-price", "live": True, "usd": None}
    )
    day = read_events(agent.state_dir / EVENTS_FILE).__next__().timestamp[:10]
    assert "unknown (no price) model-with-no-price" in digest(agent.state_dir, agent.name, day)["text"]


def test_an_unreadable_ledger_is_left_out_of_the_fleet_sum_not_a_stop_for_every_agent(tmp_path):
    """Any agent folder's owner can write its own ledger: a corrupt one must not stop the fleet
    (its own agent's day and month caps refuse on it, as test_ledger's unreadable test shows)."""
    from orchestrator.records.ledger import LEDGER_FILE, FleetBooks, record

    for name in ("a", "b"):
        (tmp_path / name / "state").mkdir(parents=True)
    record(tmp_path / "a" / "state", 1.5, 10, priced=True)
    (tmp_path / "b" / "state" / LEDGER_FILE).write_text("{not json")
    spent = FleetBooks().spent(tmp_path)
    assert (spent.today, spent.agents, spent.unreadable) == (1.5, 1, 1)
