"""A fleet sharing the API's rate limit: N wakes at once against a fake that enforces a token bucket.

    .venv/bin/python -m bench.fleet_limits [--agents 100] [--capacity 10] [--per-s 20] [--modes gate,alone]

N agents, all woken at once as `serve` wakes them (threads of one process, one LiveModel each, the
same key), each wake five model turns (four `bash true`, then the end) answered by the fake API at
once, tools by the stand-in sandbox (bench/wake_cost.py: no container, so the limit is what binds).
The fake refuses a request past its bucket (`capacity` requests, refilled at `per_s` a second) with
a 429 and a `retry-after-ms`, as the API does, and says its limit in `anthropic-ratelimit-requests-*`
headers. The time the limit allows for R requests: (R - capacity) / per_s. Rows:

- gate: as shipped (wake/ratelimit.py: one gate per key, the bucket mirrored, 429s hold everyone);
- alone: the gate turned off in this process, each wake meeting the limit on its own (the SDK's
  retries and backoff only), as before.

Per row: wall time, / the time the limit allows, 429s answered, dead letters.

Not here: the fleet under the real engine (fleet.py).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from bench.common import LiveEnv, Script, bash_true, bench_agent
from bench.wake_cost import StandInSandbox

TURNS = 5  # model turns a wake: four tool calls, then the end
MAX_X_LIMIT = 1.2  # the bound: within 1.2x of the time the limit allows


def run(n: int, capacity: int, per_s: float, gate: bool) -> dict:
    from orchestrator.testing.fakeapi import Bucket, FakeAPI
    from orchestrator.wake import ratelimit
    from orchestrator.wake.loop import wake

    ratelimit._gates.clear()  # a fresh gate for the row: what an earlier row learnt is not this one's
    saved = ratelimit.Gate.wait, ratelimit.Gate.observe
    if not gate:
        ratelimit.Gate.wait = lambda self: 0.0  # type: ignore[method-assign]
        ratelimit.Gate.observe = lambda self, status, headers: None  # type: ignore[method-assign]
    receipts: list = []
    lock = threading.Lock()
    try:
        with tempfile.TemporaryDirectory(prefix="wakeloop-bench-limits-") as tmp:
            agents = [bench_agent(Path(tmp) / f"a{i:03d}", {"budget": {"max_steps": TURNS + 2}}) for i in range(n)]
            bucket = Bucket(capacity, per_s)
            api = FakeAPI(then=Script(bash_true, TURNS - 1, 0.0), bucket=bucket)

            def one(agent) -> None:
                receipt = wake(agent, live=True, sandbox=StandInSandbox("", agent.workspace))
                with lock:
                    receipts.append(receipt)

            with LiveEnv(api):
                bucket.slots, bucket.seen = float(capacity), time.monotonic()  # full at the start
                started = time.perf_counter()
                threads = [threading.Thread(target=one, args=(a,)) for a in agents]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - started
    finally:
        ratelimit.Gate.wait, ratelimit.Gate.observe = saved  # type: ignore[method-assign]
    served = n * TURNS
    allowed = max(0.0, (served - capacity) / per_s)
    dead = [r for r in receipts if r.status != "done"]
    return {
        "mode": "gate" if gate else "alone",
        "wall": wall,
        "allowed": allowed,
        "x": wall / allowed if allowed else float("nan"),
        "refused": bucket.refused,
        "dead": len(dead),
        "why": dead[0].reason if dead else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--capacity", type=int, default=10)
    parser.add_argument("--per-s", type=float, default=20.0)
    parser.add_argument("--modes", default="gate,alone")
    args = parser.parse_args()
    print(
        f"{args.agents} agents x {TURNS} turns against a bucket of {args.capacity}, "
        f"refilled at {args.per_s:g}/s (stand-in sandbox)"
    )
    print(f"{'mode':<6} {'wall s':>7} {'limit s':>8} {'x limit':>8} {'429s':>6} {'dead':>5}  verdict")
    for mode in args.modes.split(","):
        row = run(args.agents, args.capacity, args.per_s, gate=mode == "gate")
        ok = row["dead"] == 0 and row["x"] <= MAX_X_LIMIT
        print(
            f"{row['mode']:<6} {row['wall']:>7.1f} {row['allowed']:>8.1f} {row['x']:>8.2f} {row['refused']:>6} "
            f"{row['dead']:>5}  {'ok' if ok else 'OVER'}{'  (' + row['why'][:80] + ')' if row['why'] else ''}"
        )


if __name__ == "__main__":
    main()
