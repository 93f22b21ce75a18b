"""Many agents due at once under `wakeloop serve`'s Scheduler: wall time, memory, containers.

5. Scale: N agents due at once under `wakeloop serve`'s Scheduler (default
   max concurrent) in a child process; wall time, the child's peak RSS
   (ru_maxrss) and the peak number of sandbox containers alive at once.

The child is this module, run as `-m bench.scale --scale-child ROOT AGENTS`: it
serves ROOT and prints one JSON line, so its RSS is the orchestrator's alone.

Not here: one call's cost (per_call.py), the harness's cost per step
(wake_cost.py), the scheduler's promises (tests/test_scheduler.py).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import KEY, PACE_S, WRITE_BYTES, Script, bench_agent, fake_api, say
from orchestrator.sandbox.containers.engine_client import connect
from orchestrator.sandbox.engine import LABEL
from tests.helpers import REPO

SCALE_TOOL_STEPS = 4  # tool calls in each scale wake (3 bash, 1 write_file), then the end
SCALE_TIMEOUT_S = 300  # the scale run gives up after this
SAMPLE_S = 0.1  # how often the scale run counts containers and the child's RSS


@dataclass(frozen=True)
class Scale:
    agents: int
    done: int
    wall_s: float
    rss_mb: float  # the child's ru_maxrss
    rss_sampled_mb: float  # the highest VmRSS seen from outside, a cross-check
    peak_containers: int
    max_concurrent: int
    failed: tuple[str, ...]  # "agent: status: reason" of each wake that did not end done


def scale_tools(step: int):
    if step == SCALE_TOOL_STEPS - 1:
        return "write_file", {"path": "notes/summary.md", "content": "# Summary\n" + "x" * WRITE_BYTES}
    return "bash", {"command": f"echo step {step} >> notes.txt; wc -l notes.txt; ls"}


def scale(tmp: Path, runtime: str, agents: int) -> Scale:
    from orchestrator.records.state import load_state

    root = tmp / "agents"
    root.mkdir(parents=True)
    for i in range(agents):
        bench_agent(root / f"a{i:02d}", {"sandbox": {"runtime": runtime}}, schedule="1h")
    api = fake_api(Script(scale_tools, SCALE_TOOL_STEPS, PACE_S))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WAKELOOP_")) or k == "WAKELOOP_DISKS"
    }  # common.own_disks
    with api:
        env.update(ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY=KEY)
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.scale", "--scale-child", str(root), str(agents)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        try:
            peak_containers, peak_rss = watch(child, root)
            out, _ = child.communicate()
        finally:
            if child.poll() is None:  # interrupted: its containers go in cleanup()
                child.kill()
                child.wait()
    if child.returncode != 0:
        raise SystemExit(f"bench: the scale child failed (exit {child.returncode}): {out[-500:]}")
    report = json.loads(out.strip().splitlines()[-1])
    receipts = {d.name: load_state(d / "state")[0].last_receipt for d in sorted(root.iterdir()) if d.is_dir()}
    failed = tuple(
        f"{name}: {r.status}: {r.reason}" if r else f"{name}: no receipt"
        for name, r in receipts.items()
        if r is None or r.status != "done"
    )
    for line in failed:
        say(f"scale: {line}")
        name = line.split(":", 1)[0]
        for said in report["lines"]:
            if f" {name}:" in said:  # what serve printed about it
                say(f"scale:   {said}")
    return Scale(
        agents,
        agents - len(failed),
        report["wall_s"],
        report["maxrss_kb"] / 1024,
        peak_rss / 1024,
        peak_containers,
        report["max_concurrent"],
        failed,
    )


def watch(child: subprocess.Popen, root: Path) -> tuple[int, int]:
    """Until the child exits: (most sandbox containers of `root` alive at once, highest VmRSS in kB)."""
    api = connect().api
    peak, rss = 0, 0
    while child.poll() is None:
        found = api.containers(all=True, filters={"label": f"{LABEL}=1"})
        peak = max(peak, sum(1 for c in found if c["Labels"].get("wakeloop.workspace", "").startswith(str(root))))
        rss = max(rss, vm_rss_kb(child.pid))
        time.sleep(SAMPLE_S)
    return peak, rss


def vm_rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def scale_child(root: str, agents: int) -> int:
    """In the child: serve ROOT until `agents` wakes have finished; print one JSON line."""
    from orchestrator.fleet.scheduler import MAX_CONCURRENT, Scheduler

    lines: list[str] = []
    scheduler = Scheduler(Path(root), out=lines.append)
    started = time.perf_counter()
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    deadline = started + SCALE_TIMEOUT_S
    while scheduler.completed < agents and time.perf_counter() < deadline and thread.is_alive():
        time.sleep(SAMPLE_S)
    wall = time.perf_counter() - started
    scheduler.request_stop()
    thread.join(SCALE_TIMEOUT_S)
    print(
        json.dumps(
            {
                "wall_s": wall,
                "completed": scheduler.completed,
                "max_concurrent": MAX_CONCURRENT,
                "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "lines": lines,
            }
        )
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "--scale-child":
        raise SystemExit("usage: scale.py --scale-child ROOT AGENTS (run by bench/run.py, not by hand)")
    raise SystemExit(scale_child(sys.argv[2], int(sys.argv[3])))
