"""What a wake's overlay costs per call (issue 22's bar: at most 10 % on runc and on runsc).

    .venv/bin/python -m bench.overlay_cost [--rounds 6] [--block 11] [--runtimes runc,runsc] [--mounts ours,engine]

One agent on its own disk (layered: files/ beside .wakeloop/), one sandbox per
runtime and pool setting (warm: the policy's pool; cold: none), `bash true`
paced like an agent (PACE_S between calls). In each round, --block calls
outside a wake (the box binds the disk's files/) and then --block calls inside
one (begin: the box binds the wake's overlay), then the wake's finish; the
first call of each block is not counted (after a layer change the pool's
containers of the other layer go, and the first call waits for one of this
layer's). Rounds interleave the two so this shared machine's noise lands on
both alike. Medians and p90, and the ratio of the medians. Each setting twice:
with wakeloop's own mounts (KEY.box) and with the engine's (engine_mounts.py:
a broker in a container on a host whose / is private, as under compose here).

Not here: what a wake's end costs (its commit and undo: bench/transaction.py),
the per-call table against `docker exec` and `docker run` (sandbox_overhead.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.common import PACE_S, Stats, cleanup, own_disks, stats
from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.sandbox.engine import DockerSandbox

ROUNDS, BLOCK = 6, 11  # 6 rounds of 11 calls a block: 60 counted calls each way


def timed_call(box: DockerSandbox) -> float:
    time.sleep(PACE_S)
    started = time.perf_counter()
    result = box.run("true", timeout_s=30, max_output_chars=1000)
    if result.exit_code != 0:
        raise SystemExit(f"bench: `true` exited {result.exit_code}: {result.output[-200:]}")
    return (time.perf_counter() - started) * 1000


def measure(
    workspace: Path, policy, warm: int | None, rounds: int, block: int, engine_mounts: bool
) -> tuple[Stats, Stats]:
    """(outside a wake, inside one): each call's milliseconds, the first of each block not counted."""
    box = DockerSandbox(workspace, policy, agent="bench", warm=warm, engine_mounts=engine_mounts)
    if box.disk_root is None:
        raise SystemExit("bench: the agent's disk is not layered here: no wake has an overlay to measure")
    plain: list[float] = []
    layered: list[float] = []
    try:
        for i in range(rounds):
            plain += [timed_call(box) for _ in range(block)][1:]
            box.begin(f"be0c{i:08x}")
            layered += [timed_call(box) for _ in range(block)][1:]
            box.finish()
            print(f"\r{policy.runtime} {'warm' if warm is None else 'cold'}: {i + 1}/{rounds}", end="", file=sys.stderr)
    finally:
        box.close()
        print(file=sys.stderr)
    return stats(plain), stats(layered)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds (default {ROUNDS})")
    parser.add_argument("--block", type=int, default=BLOCK, help=f"calls a block, the first not counted ({BLOCK})")
    parser.add_argument("--runtimes", default="runc,runsc", help="comma-separated (default runc,runsc)")
    parser.add_argument("--mounts", default="ours,engine", help="whose mounts: ours, engine (default both)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="wakeloop-bench-overlay-") as folder:
        tmp = Path(folder)
        own_disks(tmp)
        try:
            agent = load_agent(init_agent(tmp / "agent"))
            for runtime in args.runtimes.split(","):
                policy = replace(agent.policy.sandbox, runtime=runtime)
                for mounts in args.mounts.split(","):
                    for warm, label in ((None, "warm pool"), (0, "cold")):
                        engine = mounts == "engine"
                        plain, layered = measure(agent.workspace, policy, warm, args.rounds, args.block, engine)
                        rows.append((runtime, mounts, label, plain, layered))
        finally:
            left = cleanup(tmp)
    counted, load = args.rounds * (args.block - 1), os.getloadavg()[0]
    print(f"overlay per call: `bash true`, {counted} calls each way, {os.cpu_count()} cores, load {load:.1f}")
    print(f"{'runtime':<8} {'mounts':<7} {'pool':<10} {'outside a wake':>18} {'inside (overlay)':>18} {'ratio':>6}")
    for runtime, mounts, label, plain, layered in rows:
        ratio = layered.median / plain.median
        print(f"{runtime:<8} {mounts:<7} {label:<10} {plain.cell():>18} {layered.cell():>18} {ratio:>6.2f}")
    print(f"containers left behind (removed now): {left}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
