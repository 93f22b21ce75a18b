"""What one box costs the host's CPU, made, run and removed: the whole machine's busy time.

    .venv/bin/python -m bench.box_cpu [--calls 10] [--runtimes runc,runsc]

Cold calls of `true` (warm=0: each makes its box, runs it, removes it) one after
another, and the host's busy CPU time (/proc/stat: every process, the engine and
the kernel included) over them, per call. Under gVisor twice, alternated call by
call: with its boxes in one empty namespace, as wakeloop runs them
(sandbox/egress/netns.py), and with the engine making one per box, as before. On two
cores at an agent's fastest pace this is the budget every call shares with the
boxes made for the next ones (docs/benchmarks.md). Run it on a quiet host: any
other work on the machine is counted too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from bench.common import bench_agent, cleanup, own_disks, stats
from orchestrator.sandbox.egress import netns
from orchestrator.sandbox.engine import DockerSandbox

TICK = os.sysconf("SC_CLK_TCK")


def busy_s() -> float:
    """The host's CPU seconds not idle, since boot (all cores)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK  # less idle and iowait


@contextmanager
def own_namespaces(on: bool):
    """`on`: every box gets the engine's namespace, as before netns.py."""
    kept = netns.own_stack
    if on:
        netns.own_stack = lambda client, runtime: False  # type: ignore[assignment]
    try:
        yield
    finally:
        netns.own_stack = kept  # type: ignore[assignment]


def measure(tmp: Path, calls: int, runtimes: list[str]) -> list[tuple[str, list[float], list[float]]]:
    agent = bench_agent(tmp / "box-cpu", {})
    # (runtime, whether each box gets the engine's namespace): runc's always do
    ways = [way for way in (("runc", True), ("runsc", False), ("runsc", True)) if way[0] in runtimes]
    boxes = {}
    for runtime, engines in ways:
        with own_namespaces(engines):
            policy = replace(agent.policy.sandbox, runtime=runtime)
            boxes[runtime, engines] = DockerSandbox(agent.workspace, policy, agent="box-cpu", warm=0)
    cpu: dict = {way: [] for way in ways}
    wall: dict = {way: [] for way in ways}
    try:
        for way in ways:
            boxes[way].run("true", timeout_s=60, max_output_chars=100)  # the holder made, caches warm
        for _ in range(calls):
            for way in ways:  # alternated call by call: noise lands on each alike
                before, started = busy_s(), time.monotonic()
                boxes[way].run("true", timeout_s=60, max_output_chars=100)
                wall[way].append(time.monotonic() - started)
                cpu[way].append(busy_s() - before)
    finally:
        for box in boxes.values():
            box.close()
    names = {False: "one per sandbox (netns.py)", True: "the engine's, one per box"}
    return [(f"{rt}: {names[engines]}", cpu[rt, engines], wall[rt, engines]) for rt, engines in ways]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10, help="cold calls per row (default 10)")
    parser.add_argument("--runtimes", default="runc,runsc", help="comma-separated (default runc,runsc)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wakeloop-bench-")).resolve()
    own_disks(tmp)
    try:
        rows = measure(tmp, args.calls, args.runtimes.split(","))
    finally:
        left = cleanup(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'box, network namespace':48} {'host CPU-s per call p50 / p90':>30} {'wall p50 / p90':>18}")
    for name, cpu, wall in rows:
        c, w = stats(cpu), stats(wall)
        print(f"{name:48} {c.median:>20.3f} / {c.p90:.3f} {w.median:>10.3f} / {w.p90:.3f} s")
    print(f"{args.calls} cold calls of `true` per row, alternated; containers left and removed: {left}")


if __name__ == "__main__":
    main()
