"""What approvals add: to every tool call, to a held call, and to every wake's start.

    .venv/bin/python -m bench.approvals_cost [--n 200]

Every call is matched against the policy's approve: rules before its handler
(policy/schema.py Approve.asks): shown with no rules and with 64 (the most a
policy may have), none matching. A held call is filed (records/approvals.py
ask: the lock, a read of the open ones, one file written atomically) instead
of a container: shown with none open and with 31 open (one under the cap).
Every live wake takes the decided ones at its start (take): shown with no
approvals folder, and with 31 told ones kept. All on this host's state/
filesystem, no engine, side by side in one run.

Not here: the approved call's own run (a tool call like any other: per_call.py).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import Stats, stats
from orchestrator.policy.schema import MAX_APPROVE_RULES, Approve, ApproveRule
from orchestrator.records import approvals

N = 200
CALL = {"command": "pytest -q tests/ 2>&1 | tail -40"}


def timed(fn, n: int) -> Stats:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return stats(samples)


def match_cost(rules: int, n: int) -> Stats:
    approve = Approve(
        tuple(ApproveRule("bash", match=(f"git push-{i}*", f"*terraform apply-{i}*")) for i in range(rules))
    )
    return timed(lambda: [approve.asks("bash", CALL) for _ in range(100)], n)  # per 100 calls


def ask_cost(state_dir: Path, open_already: int, n: int) -> Stats:
    for i in range(open_already):
        approvals.ask(state_dir, "bash", {"command": f"git push {i}"}, "r", "words", "bench", 3600)
    kept = set(approvals.state_folder(state_dir).files(approvals.APPROVALS_DIR))

    def one():
        asked = approvals.ask(
            state_dir, "bash", {"command": f"git push {time.perf_counter_ns()}"}, "r", "words", "bench", 3600
        )
        approvals.state_folder(state_dir).unlink(f"{approvals.APPROVALS_DIR}/{asked.approval.id}.json")

    result = timed(one, n)
    assert set(approvals.state_folder(state_dir).files(approvals.APPROVALS_DIR)) == kept
    return result


def take_cost(state_dir: Path, told: int, n: int) -> Stats:
    for i in range(told):
        a = approvals.ask(state_dir, "bash", {"command": f"git push {i}"}, "r", "words", "bench", 3600).approval
        approvals.finish(state_dir, approvals.decide(state_dir, a.id, False, "bench"), "bench")
    return timed(lambda: approvals.take(state_dir, "bench", frozenset({"bash"})), n)


def state(tmp: str, name: str) -> Path:
    folder = Path(tmp) / name / "state"
    folder.mkdir(parents=True, mode=0o700)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=N)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wakeloop-bench-approvals-") as tmp:
        rows = [
            ("match, per 100 calls, no rules", match_cost(0, args.n)),
            (f"match, per 100 calls, {MAX_APPROVE_RULES} rules", match_cost(MAX_APPROVE_RULES, args.n)),
            ("a held call filed, none open", ask_cost(state(tmp, "a0"), 0, args.n)),
            (
                f"a held call filed, {approvals.MAX_OPEN - 1} open",
                ask_cost(state(tmp, "a31"), approvals.MAX_OPEN - 1, args.n),
            ),
            ("a wake's start, no approvals", take_cost(state(tmp, "t0"), 0, args.n)),
            ("a wake's start, 31 told ones kept", take_cost(state(tmp, "t31"), 31, args.n)),
        ]
    for what, s in rows:
        print(f"{what:<40} median / p90: {s.cell()}")


if __name__ == "__main__":
    main()
