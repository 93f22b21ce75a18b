"""How close a wake's bill comes to what the prompt cache allows: billed USD against the floor.

The floor of a wake is every token of its conversation written to the cache once and read at the
cache price after that: request i with a prompt of T(i) tokens costs (T(i) - T(i-1)) at the 5-minute
write rate plus T(i-1) at the read rate, and its output at the output rate. The wake: a ~12k-token
mandate, 30 tool-using steps, then max_tokens_per_wake trips (its cap set to what those 30 steps
use) and the wrap-up turn; the real loop and SDK against the fake API (its prompt-cache model:
breakpoints, the 20-block look-back, tool_choice), tools answered by the stand-in sandbox.
Billed is what the fake reported, priced by the ledger at claude-sonnet-5-5's rates. The table
says where the difference goes: writes past the floor (a prefix written again), input not cached
at all, and the wrap-up turn.

    python -m bench.cache_floor

Not here: the wrap-up turn's tool_choice (wrapup_cache.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.wrapup_cache import MODEL, one_wake, replay, usd

STEPS = 30


def main() -> None:
    from orchestrator.records.ledger import load_prices
    from orchestrator.testing.fakeapi import cache_model

    price = load_prices()[MODEL]
    with tempfile.TemporaryDirectory(prefix="wakeloop-bench-floor-") as tmp:
        _, probe = one_wake(Path(tmp) / "probe", cap=10**9, max_steps=STEPS, expect="max_steps")
        # the cap a little under what the 30 steps used (a step is ~13k tokens): it trips at the 30th
        bodies, receipt = one_wake(Path(tmp) / "capped", cap=probe.tokens - 5_000, max_steps=STEPS + 5)
    cache: set[str] = set()
    rows = []
    previous = 0
    for body in bodies:
        read, write, total = cache_model(body, cache)
        rows.append((read, write, total - read - write, total, previous))
        previous = total
    per_m = 1_000_000
    billed = floor = over_write = uncached = 0.0
    for read, write, plain, total, before in rows:
        billed += (read * price.cache_read + write * price.cache_write_5m + plain * price.input) / per_m
        floor += ((total - before) * price.cache_write_5m + before * price.cache_read) / per_m
        over_write += max(0, write - (total - before)) * (price.cache_write_5m - price.cache_read) / per_m
        uncached += plain * (price.input - price.cache_read) / per_m
    read, write, plain, total, before = rows[-1]
    wrap = (read * price.cache_read + write * price.cache_write_5m + plain * price.input) / per_m
    wrap_floor = ((total - before) * price.cache_write_5m + before * price.cache_read) / per_m
    first = rows[0][3] * price.cache_write_5m / per_m
    tools = cache_model({"tools": bodies[0].get("tools", [])}, set())[2] * price.cache_write_5m / per_m
    output = receipt.usage.output_tokens * price.output / per_m  # billed and floor alike
    before = usd(replay(bodies, {"type": "none"})) - usd(replay(bodies, None))
    print(f"a {STEPS}-step capped wake and its wrap-up turn ({len(bodies)} requests), {MODEL} rates")
    print(f"{'':<52} {'USD':>9}")
    for label, value in (
        ("billed (the receipt)", receipt.usd or 0.0),
        ("billed, input side (the fake's usage, re-priced)", billed),
        ("floor: each token written once, then read; + output", floor + output),
        ("billed / floor", (receipt.usd or 0.0) / (floor + output)),
        ("  in both: the first write", first),
        ("  in both: of which the tool definitions", tools),
        ("  in both: output", output),
        ("  past the floor: prefixes written again", over_write),
        ("  past the floor: input never cached", uncached),
        ("  past the floor: the wrap-up turn", wrap - wrap_floor),
        ("  the wrap-up turn with tool_choice none (before)", before),
    ):
        print(f"{label:<52} {value:>9.4f}")


if __name__ == "__main__":
    main()
