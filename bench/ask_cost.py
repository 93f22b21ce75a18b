"""What approve.rules network_host costs: per call, and per approved call.

    .venv/bin/python -m bench.ask_cost [--n 30] [--grants 3]

Two allowlist boxes for the same list (hosts never dialled), one whose policy asks
about other hosts (`sandbox.ask_hosts`, as a network_host rule sets it): after every
bash call it has its proxy print a mark and reads the proxy's log back to that mark
(network.asked), to learn which hosts were asked about. `--n` calls of `true` each,
taken in turn from the one box and the other (side by side on a noisy host), pooled
as an agent's calls are. Then `--grants` approved calls (DockerSandbox._granted_run):
each makes a proxy, network and netns holder of its own, runs one cold call through
them and removes them; beside as many cold calls of the plain box. Medians and p90.

Not here: the proxy's cost per request (egress_proxy.py), a call's own (per_call.py).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import docker

from bench.common import Stats, say, stats
from orchestrator.policy.schema import SandboxPolicy
from orchestrator.sandbox.egress import network
from orchestrator.sandbox.engine import DockerSandbox

LISTED, ASKED = "listed.wakeloop-bench.test", "asked.wakeloop-bench.test"


def _box(client, root: Path, name: str, ask: tuple[str, ...], pool: int) -> DockerSandbox:
    workspace = root / name
    workspace.mkdir(mode=0o777)
    workspace.chmod(0o777)  # the box's user is not this process's
    policy = replace(SandboxPolicy(), network="allowlist", disk=0, pool=pool, allow_hosts=(LISTED,), ask_hosts=ask)
    return DockerSandbox(workspace, policy, agent=name, client=client)


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def _side_by_side(a, b, n: int) -> tuple[Stats, Stats]:
    first, second = [], []
    for _ in range(n):
        first.append(_timed(a))
        second.append(_timed(b))
    return stats(first), stats(second)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ask_cost")
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--grants", type=int, default=3)
    args = parser.parse_args(argv)
    client = docker.from_env()
    root = Path(tempfile.mkdtemp(prefix="ask-bench-"))
    boxes: list[DockerSandbox] = []
    try:
        plain, asking = (_box(client, root, "plain", (), 2), _box(client, root, "asking", ("asked.*",), 2))
        boxes += [plain, asking]
        for box in boxes:
            box.run("true", timeout_s=60, max_output_chars=100)  # each proxy up, each pool warm
        calls = _side_by_side(
            lambda: plain.run("true", timeout_s=60, max_output_chars=100),
            lambda: asking.run("true", timeout_s=60, max_output_chars=100),
            args.n,
        )
        cold = _box(client, root, "cold", ("asked.*",), 0)
        boxes.append(cold)
        grants = _side_by_side(
            lambda: cold.run("true", timeout_s=60, max_output_chars=100),
            lambda: cold.run("true", timeout_s=60, max_output_chars=100, grant_hosts=(ASKED,)),
            args.grants,
        )
    finally:
        for box in boxes:
            box.close()
        network.shutdown(client, {b._egress().key for b in boxes}, shared=False)
    say("done")
    print("| call | n | p50 / p90 | x the plain call p50 |")
    print("| --- | ---: | --- | ---: |")
    rows = [
        ("allowlist, pooled", calls[0], calls[0]),
        ("allowlist + network_host rule, pooled", calls[1], calls[0]),
        ("allowlist, cold", grants[0], grants[0]),
        ("approved call with a host granted (own proxy set)", grants[1], grants[0]),
    ]
    for name, row, base in rows:
        print(f"| {name} | {row.n} | {row.cell()} | {row.median / base.median:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
