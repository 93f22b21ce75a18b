"""Per-call latency of the sandbox against its two reference points.

    .venv/bin/python -m bench.sandbox_overhead [--calls 30] [--runtime runsc]

(1) a wakeloop sandbox call of `true` taking a container from the warm pool
(created and started ahead, used once, removed off the call's path), paced
like an agent: PACE_S between calls, as a model's answer takes at least that;
(2) the same call cold (create, attach, start, wait, remove on the call's
path); (3) `docker run --rm` of the same image and flags through the CLI;
(4) `docker exec` into an already running container, the floor any per-call
design sits on. The four are interleaved call by call so that noise from
this shared machine lands on all of them alike. Then the back-to-back rate
of warm calls with no pause, and what the idle pool holds.

Not here: the full table, a live wake and the harness's own cost (run.py and
the modules it names); the helpers shared with it (common.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.common import PACE_S, as_one_runs_it, idle_cost
from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.sandbox.engine import DockerSandbox
from orchestrator.sandbox.explain import docker_run_flags


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def check(proc: subprocess.CompletedProcess) -> None:
    if proc.returncode != 0:
        raise SystemExit(f"bench: {proc.args[:3]} failed: {proc.stderr.strip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=30, help="calls per method (default 30)")
    parser.add_argument("--runtime", default="runc", help="container runtime (default runc)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        agent = load_agent(init_agent(Path(tmp) / "bench"))
        policy = replace(agent.policy.sandbox, runtime=args.runtime)
        box = DockerSandbox(agent.workspace, policy, agent="bench")
        cold = DockerSandbox(agent.workspace, policy, agent="bench", warm=0)
        config, host = as_one_runs_it(
            *box.container_spec(["/bin/bash", "-c", "true"], "bench", command_env=box.command_env())
        )
        image = [config["image"], *config["command"]]
        run_cmd = ["docker", "run", *docker_run_flags(config, host), *image]
        keep = [flag for flag in docker_run_flags(config, host) if flag != "--rm"]
        warm = subprocess.run(
            ["docker", "run", "-d", *keep, config["image"], "sleep", "infinity"], capture_output=True, text=True
        )
        check(warm)
        warm_id = warm.stdout.strip()
        exec_cmd = ["docker", "exec", warm_id, "bash", "-c", "true"]
        samples = {
            "wakeloop call, warm pool": [],
            "wakeloop call, cold": [],
            "docker run --rm": [],
            "docker exec (warm)": [],
        }
        try:
            for i in range(args.calls):
                time.sleep(PACE_S)
                samples["wakeloop call, warm pool"].append(
                    timed(lambda: box.run("true", timeout_s=30, max_output_chars=1000))
                )
                samples["wakeloop call, cold"].append(
                    timed(lambda: cold.run("true", timeout_s=30, max_output_chars=1000))
                )
                samples["docker run --rm"].append(
                    timed(lambda: check(subprocess.run(run_cmd, capture_output=True, text=True)))
                )
                samples["docker exec (warm)"].append(
                    timed(lambda: check(subprocess.run(exec_cmd, capture_output=True, text=True)))
                )
                print(f"\r{i + 1}/{args.calls} rounds", end="", file=sys.stderr, flush=True)
            box.pool.wait_ready(box.pool.want, 60)
            idle = idle_cost(box.pool.idle())
            started = time.perf_counter()
            for _ in range(args.calls):
                box.run("true", timeout_s=30, max_output_chars=1000)
            rate = args.calls / (time.perf_counter() - started)
        finally:
            subprocess.run(["docker", "rm", "-f", warm_id], capture_output=True)
            box.close()
            cold.close()  # the last holder of the disk: released before the folder goes
        print(file=sys.stderr)

    floor = statistics.median(samples["docker exec (warm)"])
    print(f"sandbox overhead: {args.calls} calls each, {os.cpu_count()} cores, runtime {box.policy.runtime}")
    print(f"{'method':<26} {'median ms':>10} {'p90 ms':>8} {'x exec':>7}")
    for name, values in samples.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        median = statistics.median(values)
        print(f"{name:<26} {median:>10.1f} {p90:>8.1f} {median / floor:>7.2f}")
    print(f"back-to-back warm calls, no pause: {rate:.1f} calls/s")
    print(f"idle pool: {idle}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
