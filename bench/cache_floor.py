"""How close a wake's bill comes to what the prompt cache allows: billed USD against the floor.

The floor of a wake is every token of its conversation written to the cache once and read at the
cache price after that: request i with a prompt of T(i) tokens costs (T(i) - T(i-1)) at the 5-minute
write rate plus T(i-1) at the read rate, and its output at the output rate. Each wake: a ~12k-token
mandate, 30 tool-using steps, then max_tokens_per_wake trips (its cap set just under what those 30
steps use) and the wrap-up turn; the real loop and SDK against the fake API (its prompt-cache model:
breakpoints, the 20-block look-back, tool_choice before the messages), tools answered by the stand-in
sandbox. Billed is the receipt's USD at claude-sonnet-5-5's rates. Columns:

- 1 call a step: one `bash true` a step;
- 12 calls a step: twelve parallel calls a step (24 blocks with their results, past the look-back);
- 12, 1 breakpoint: the same with the second message breakpoint turned off (wake/model.py
  LOOKBACK_MARGIN), as the harness sent it before.

Rows say where the difference goes: prefixes written again, input never cached, the wrap-up turn;
and, in both bill and floor, the first write (the tool definitions in it) and the output.

    python -m bench.cache_floor

Not here: the wrap-up turn's tool_choice (wrapup_cache.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.common import step_of
from bench.wrapup_cache import MODEL, one_wake, replay, usd

STEPS = 30
PARALLEL = 12


def parallel(rec):
    from orchestrator.testing.fakeapi import text, tool_use, turn

    if step_of(rec.body) > STEPS + 5:
        return turn(text("done"))
    return turn(*(tool_use("bash", {"command": "true"}) for _ in range(PARALLEL)))


def measure(tmp: Path, responder=None) -> dict:
    from orchestrator.records.ledger import load_prices
    from orchestrator.testing.fakeapi import cache_model

    price = load_prices()[MODEL]
    _, probe = one_wake(tmp / "probe", cap=10**9, max_steps=STEPS, expect="max_steps", responder=responder)
    # the cap a little under what the 30 steps used (a step is ~13k tokens): it trips at the 30th
    bodies, receipt = one_wake(tmp / "capped", cap=probe.tokens - 5_000, max_steps=STEPS + 5, responder=responder)
    cache: set[str] = set()
    per_m = 1_000_000
    out = dict.fromkeys(("floor", "again", "uncached", "wrap"), 0.0)
    before = 0
    for n, body in enumerate(bodies):
        read, write, total = cache_model(body, cache)
        plain = total - read - write
        billed = (read * price.cache_read + write * price.cache_write_5m + plain * price.input) / per_m
        floor = ((total - before) * price.cache_write_5m + before * price.cache_read) / per_m
        out["floor"] += floor
        out["again"] += max(0, write - (total - before)) * (price.cache_write_5m - price.cache_read) / per_m
        out["uncached"] += plain * (price.input - price.cache_read) / per_m
        if n == len(bodies) - 1:
            out["wrap"] = billed - floor
        before = total
    out["output"] = receipt.usage.output_tokens * price.output / per_m
    out["floor"] += out["output"]
    out["billed"] = receipt.usd or 0.0
    out["first"] = cache_model(bodies[0], set())[2] * price.cache_write_5m / per_m
    out["tools"] = cache_model({"tools": bodies[0].get("tools", [])}, set())[2] * price.cache_write_5m / per_m
    out["none_before"] = usd(replay(bodies, {"type": "none"})) - usd(replay(bodies, None))
    out["requests"] = len(bodies)
    return out


def main() -> None:
    from orchestrator.wake import model

    columns = {}
    with tempfile.TemporaryDirectory(prefix="wakeloop-bench-floor-") as tmp:
        columns["1 call a step"] = measure(Path(tmp) / "one")
        columns[f"{PARALLEL} calls a step"] = measure(Path(tmp) / "many", parallel)
        saved = model.LOOKBACK_MARGIN
        model.LOOKBACK_MARGIN = -(10**9)  # never a second breakpoint: as before
        try:
            columns[f"{PARALLEL}, 1 breakpoint"] = measure(Path(tmp) / "before", parallel)
        finally:
            model.LOOKBACK_MARGIN = saved
    print(f"{STEPS}-step capped wakes and their wrap-up turn, USD at {MODEL}'s rates")
    print(f"{'':<44}" + "".join(f"{name:>20}" for name in columns))
    rows = (
        ("requests", "requests", "{:>20.0f}"),
        ("billed (the receipt)", "billed", "{:>20.4f}"),
        ("floor: each token written once, then read", "floor", "{:>20.4f}"),
        ("billed / floor", None, "{:>20.2f}"),
        ("  past the floor: prefixes written again", "again", "{:>20.4f}"),
        ("  past the floor: input never cached", "uncached", "{:>20.4f}"),
        ("  past the floor: the wrap-up turn", "wrap", "{:>20.4f}"),
        ("  in both: the first write", "first", "{:>20.4f}"),
        ("  in both: of it, the tool definitions", "tools", "{:>20.4f}"),
        ("  in both: output", "output", "{:>20.4f}"),
        ("a wrap-up with tool_choice none would add", "none_before", "{:>20.4f}"),
    )
    for label, key, fmt in rows:
        values = [c["billed"] / c["floor"] if key is None else c[key] for c in columns.values()]
        print(f"{label:<44}" + "".join(fmt.format(v) for v in values))


if __name__ == "__main__":
    main()
