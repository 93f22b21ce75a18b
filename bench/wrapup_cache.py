"""What the wrap-up turn at the token cap costs in cache writes: tool_choice kept (now) or set to none (before).

A wake with a ~12k-token mandate calls a tool every step until max_tokens_per_wake trips, then
gets its one wrap-up turn. The wake runs through the real loop and the real SDK against the fake
API, its tools answered by bench/wake_cost.py's stand-in sandbox (no container). Its recorded
requests are then replayed through the fake's prompt-cache model (testing/fakeapi.py
`cache_model`, which models the documented rule that a changed `tool_choice` invalidates the
cached messages on 5.x) twice: as sent, and with the wrap-up request's `tool_choice` set to
`{"type": "none"}`, as the harness sent it before. The table gives the wrap-up request's cache
writes and reads, and the wake's input-side USD at claude-sonnet-5-5's rates, medians of RUNS wakes.

    python -m bench.wrapup_cache [--runs N]

Not here: the cache floor of a whole wake (wake_cost.py's caching bench is the nearest).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
from pathlib import Path

from bench.common import LiveEnv, Script, bash_true, bench_agent, fake_api
from bench.wake_cost import STANDIN_OUTPUT, StandInSandbox, long_mandate

RUNS = 3
TOKEN_CAP = 150_000  # trips after ~10 steps of a ~12k-token prefix
MODEL = "claude-sonnet-5-5"


def one_wake(tmp: Path, cap: int = TOKEN_CAP, max_steps: int = 60, expect: str = "max_tokens_per_wake", responder=None):
    """(the request bodies of one wake that ends at `expect` (the token cap), in order; its receipt).
    `responder`: the fake API's answers (default: one `bash true` a step, for ever)."""
    from orchestrator.wake.loop import wake

    no_usd_cap = {"max_usd_per_wake": 100, "max_usd_per_day": 1000, "max_usd_per_month": 10000}  # the tokens cap it
    budget = {"max_steps": max_steps, "max_tokens_per_wake": cap, **no_usd_cap}
    agent = bench_agent(tmp, {"budget": budget}, mandate=long_mandate(), model=MODEL)
    api = fake_api(responder or Script(bash_true, 1000, 0.0), one_at_a_time=True)
    with LiveEnv(api):
        receipt = wake(agent, live=True, sandbox=StandInSandbox(STANDIN_OUTPUT, agent.workspace))
    if receipt.status != "budget_stop" or expect not in receipt.reason:
        raise SystemExit(f"bench: the wake ended {receipt.status}: {receipt.reason} (expected {expect})")
    return [r.body for r in api.requests], receipt


def replay(bodies: list[dict], wrap_up_choice: dict | None) -> list[tuple[int, int, int]]:
    """(cache read, cache write, input) per request, the wrap-up one sent with this tool_choice."""
    from orchestrator.testing.fakeapi import cache_model

    cache: set[str] = set()
    out = []
    for i, body in enumerate(bodies):
        if i == len(bodies) - 1:
            body = copy.deepcopy(body)
            body.pop("tool_choice", None)
            if wrap_up_choice:
                body["tool_choice"] = wrap_up_choice
        read, write, total = cache_model(body, cache)
        out.append((read, write, total - read - write))
    return out


def usd(rows: list[tuple[int, int, int]]) -> float:
    from orchestrator.records.ledger import cost_usd, load_prices
    from orchestrator.records.receipt import Usage

    price = load_prices()[MODEL]
    return sum(cost_usd(price, Usage(input_tokens=n, cache_write_5m_tokens=w, cache_read_tokens=r)) for r, w, n in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    results: dict[str, list[tuple[int, int, float]]] = {"kept (now)": [], "none (before)": []}
    steps = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="wakeloop-bench-wrapup-") as tmp:
            bodies, _ = one_wake(Path(tmp) / "capped")
        steps.append(len(bodies))
        for label, choice in (("kept (now)", None), ("none (before)", {"type": "none"})):
            rows = replay(bodies, choice)
            read, write, _ = rows[-1]
            results[label].append((write, read, usd(rows)))
    requests = statistics.median(steps)
    print(f"wrap-up turn of a capped wake ({requests:.0f} requests, {MODEL} rates), medians of {args.runs}")
    print(f"{'wrap-up tool_choice':<20} {'cache write':>12} {'cache read':>11} {'wake input USD':>15}")
    for label, rows in results.items():
        write = statistics.median(r[0] for r in rows)
        read = statistics.median(r[1] for r in rows)
        cost = statistics.median(r[2] for r in rows)
        print(f"{label:<20} {write:>12,.0f} {read:>11,.0f} {cost:>15.4f}")


if __name__ == "__main__":
    main()
