"""Per-call latency of the sandbox against its two reference points.

    .venv/bin/python bench/sandbox_overhead.py [--calls 30]

(1) a wakeloop sandbox call of `true` (a fresh container, created, attached,
started, waited for and removed); (2) `docker run --rm` of the same image and
flags through the CLI; (3) `docker exec` into an already running container,
the floor any per-call design sits on. The three are interleaved call by call
so that noise from this shared machine lands on all of them alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.agent import init_agent, load_agent  # noqa: E402
from orchestrator.sandbox import DockerSandbox, docker_run_args  # noqa: E402


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
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        agent = load_agent(init_agent(Path(tmp) / "bench"))
        box = DockerSandbox(agent.workspace, agent.policy.sandbox, agent="bench")
        config, host = box.container_spec(["bash", "-c", "true"], "bench")
        run_cmd = ["docker", "run", "--rm", *docker_run_args(config, host)]
        warm = subprocess.run(["docker", "run", "-d", *docker_run_args(
            {**config, "command": ["sleep", "infinity"]}, host)], capture_output=True, text=True)
        check(warm)
        warm_id = warm.stdout.strip()
        exec_cmd = ["docker", "exec", warm_id, "bash", "-c", "true"]
        samples = {"wakeloop sandbox call": [], "docker run --rm": [], "docker exec (warm)": []}
        try:
            for i in range(args.calls):
                samples["wakeloop sandbox call"].append(
                    timed(lambda: box.run("true", timeout_s=30, max_output_chars=1000)))
                samples["docker run --rm"].append(
                    timed(lambda: check(subprocess.run(run_cmd, capture_output=True, text=True))))
                samples["docker exec (warm)"].append(
                    timed(lambda: check(subprocess.run(exec_cmd, capture_output=True, text=True))))
                print(f"\r{i + 1}/{args.calls} rounds", end="", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["docker", "rm", "-f", warm_id], capture_output=True)
        print(file=sys.stderr)

    floor = statistics.median(samples["docker exec (warm)"])
    print(f"sandbox overhead: {args.calls} calls each, {os.cpu_count()} cores, runtime {box.policy.runtime}")
    print(f"{'method':<24} {'median ms':>10} {'p90 ms':>8} {'x exec':>7}")
    for name, values in samples.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        median = statistics.median(values)
        print(f"{name:<24} {median:>10.1f} {p90:>8.1f} {median / floor:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
