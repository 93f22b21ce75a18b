"""What the egress record costs: appending a wake's decisions, and reading them back.

    .venv/bin/python -m bench.egress_cost [--lines 10000] [--repeat 9]

A wake's end sums its run's decisions into the receipt (records/egress.summarize),
reading the live egress log: here `--lines` decisions of other runs plus ten
of its own, all in the live file (the worst case: rotate_size is 4 MB, about
14,000 decisions), then the same lines gzipped as one rotated segment (what
retention leaves after a day) with ten live. The console's wake page reads a
run's decisions across the whole history; `log --egress` parses every line.
Appending is one write(2) for a wake's batch. This host's state/ filesystem,
no engine.

Not here: the proxy's own cost per connection (the egress slice's bench).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.common import Stats, stats
from orchestrator.records import egress
from orchestrator.records.retention import Retention, enforce

LINES = 10_000
REPEAT = 9
RUN = "0123456789ab"


def decision(run_id: str, n: int) -> dict:
    return {
        "time": "2026-12-02T01:00:00.000Z",
        "run_id": run_id,
        "host": "api.github.com",
        "port": 443,
        "method": "GET",
        "path": f"/repos/octo/hello/pulls/{n}",
        "decision": "allow" if n % 7 else "deny",
        "rule": "allow GET /repos/**",
        "intercepted": True,
        "credential": "GH_TOKEN",
        "bytes_up": 420,
        "bytes_down": 18_000,
    }


def timed(call, repeat: int) -> Stats:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return stats(samples)


def fill(state: Path, lines: int) -> Stats:
    """The history: `lines` decisions of other runs, appended a wake's hundred at a time."""
    state.mkdir(parents=True)
    samples = []
    for start in range(0, lines, 100):
        batch = [decision(f"{n // 100:012x}", n) for n in range(start, min(start + 100, lines))]
        began = time.perf_counter()
        egress.append(state, batch, secrets=())
        samples.append((time.perf_counter() - began) * 1000)
    egress.append(state, [decision(RUN, n) for n in range(10)], secrets=())
    return stats(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=LINES)
    parser.add_argument("--repeat", type=int, default=REPEAT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wakeloop-bench-egress-") as tmp:
        state = Path(tmp) / "agent" / "state"
        appended = fill(state, args.lines)
        size = (state / egress.EGRESS_FILE).stat().st_size
        live = timed(lambda: egress.summarize(state, RUN), args.repeat)
        every = timed(lambda: sum(1 for _ in egress.read(state)), args.repeat)
        rotated_at = datetime.now(UTC) + timedelta(seconds=1)
        enforce(state, Retention(rotate_size=1), rotated_at)
        egress.append(state, [decision(RUN, n) for n in range(10)], secrets=())
        rotated = timed(lambda: egress.summarize(state, RUN), args.repeat)
        page = timed(lambda: egress.total(egress.of_run(state, RUN)), args.repeat)
        started = rotated_at + egress.ROTATION_MARGIN + timedelta(seconds=1)
        page_since = timed(lambda: egress.total(egress.of_run(state, RUN, started=started)), args.repeat)
    print(f"egress.jsonl: {args.lines:,} decisions of other runs + 10 of the wake's, {size:,} bytes")
    print(f"append, per batch of 100 decisions, median / p90: {appended.cell()}")
    print(f"summarize (a wake's end), all in the live file, median / p90: {live.cell()}")
    print(f"summarize after a rotation (the history gzipped, 10 live), median / p90: {rotated.cell()}")
    print(f"one run's decisions across the whole gzipped history, median / p90: {page.cell()}")
    print(f"the same, given when the run began (the console's wake page), median / p90: {page_since.cell()}")
    print(f"read and parse every line (log --egress), median / p90: {every.cell()}")


if __name__ == "__main__":
    main()
