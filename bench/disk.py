"""What the workspace's own disk (sandbox.disk) costs: per call, and when a wake starts.

Side by side in one run, per runtime, interleaved call by call so the
machine's drift falls on all alike:

- a call (`true`, from a warm pool, timed from outside `DockerSandbox.run`)
  on an agent whose workspace is its disk (a volume on a loop device),
  on one whose workspace is a plain folder (`sandbox.disk: none`, a bind
  mount), and `docker exec` into a warm container of the same image and
  flags (the product's promise: a call costs at most 1.3x that);
- a wake's start (making the DockerSandbox, no pool): the first, which
  makes the image (mkfs), then each later one, which finds it attached.

    python -m bench.disk [--calls 40] [--runtimes runc,runsc]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Stats, bench_agent, cleanup, own_disks, say, stats, timed_ms
from bench.per_call import Reference
from orchestrator.sandbox.disks import disk_attach
from orchestrator.sandbox.engine import DockerSandbox

CALLS = 40
STARTS = 10
POOL_READY_S = 60


def timed_call(box: DockerSandbox) -> float:
    box.pool.wait_ready(box.pool.want, POOL_READY_S)  # the warm path: a pooled container waits
    started = time.perf_counter()
    result = box.run("true", timeout_s=30, max_output_chars=1000)
    elapsed = (time.perf_counter() - started) * 1000
    if not result.ok:
        raise SystemExit(f"bench: a call failed: {result.for_model()}")
    return elapsed


def timed_start(agent, policy) -> float:
    started = time.perf_counter()
    DockerSandbox(agent.workspace, policy, agent=agent.name, warm=0).close()
    return (time.perf_counter() - started) * 1000


def measure(tmp: Path, runtime: str, calls: int) -> dict[str, Stats]:
    with_disk = bench_agent(tmp / f"disk-{runtime}", {"sandbox": {"runtime": runtime}})
    folder = bench_agent(tmp / f"folder-{runtime}", {"sandbox": {"runtime": runtime, "disk": "none"}})
    first = timed_start(with_disk, with_disk.policy.sandbox)  # mkfs, losetup, volume, mount
    starts = {"disk": [], "folder": []}
    for _ in range(min(STARTS, calls)):  # a smoke run (--calls 2) stays short
        starts["disk"].append(timed_start(with_disk, with_disk.policy.sandbox))
        starts["folder"].append(timed_start(folder, folder.policy.sandbox))
    samples = {"disk": [], "folder": [], "exec": []}
    boxes = {
        name: DockerSandbox(a.workspace, a.policy.sandbox, agent=a.name)
        for name, a in (("disk", with_disk), ("folder", folder))
    }
    reference = Reference(boxes["disk"])
    try:
        for i in range(calls):
            if i % 10 == 0:
                say(f"{runtime}: call {i + 1} of {calls}")
            samples["disk"].append(timed_call(boxes["disk"]))
            samples["folder"].append(timed_call(boxes["folder"]))
            samples["exec"].append(timed_ms(reference.exec_true))
    finally:
        reference.close()
        for box in boxes.values():
            box.close()
    return {
        "call, disk": stats(samples["disk"]),
        "call, folder": stats(samples["folder"]),
        "docker exec": stats(samples["exec"]),
        "first start, disk": stats([first]),
        "start, disk": stats(starts["disk"]),
        "start, folder": stats(starts["folder"]),
    }


def table(results: dict[str, dict[str, Stats]]) -> str:
    lines = ["| runtime | what | median / p90 | n | ratio |", "| --- | --- | --- | --- | --- |"]
    for runtime, r in results.items():
        against = {"call, disk": ("call, folder", "docker exec"), "start, disk": ("start, folder",)}
        for what, s in r.items():
            ratios = ", ".join(f"{s.median / r[o].median:.2f}x {o}" for o in against.get(what, ()))
            lines.append(f"| {runtime} | {what} | {s.cell()} | {s.n} | {ratios} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=CALLS, help=f"calls per kind (default {CALLS})")
    parser.add_argument("--runtimes", default="runc,runsc", help="comma-separated (default runc,runsc)")
    args = parser.parse_args()
    reason = disk_attach.unavailable()
    if reason:
        raise SystemExit(f"bench: {reason}")
    tmp = Path(tempfile.mkdtemp(prefix="wakeloop-bench-disk-")).resolve()
    own_disks(tmp)
    results = {}
    try:
        for runtime in args.runtimes.split(","):
            results[runtime] = measure(tmp, runtime, args.calls)
    finally:
        cleanup(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
