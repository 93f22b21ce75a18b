"""What one tool call costs in a live wake at an agent's pace, beside the docker CLI.

1. bash `true` per call at an agent's pace: a real live wake (the real
   `anthropic` SDK over HTTP to orchestrator/testing/fakeapi.py) whose fake API waits
   PACE_S before every answer; one call's figure is the time between two
   requests less that wait (model latency), so it holds the tool call in
   a pooled container plus the harness's own work for the step. Beside it
   `docker exec` into a warm container and `docker run --rm` with the same
   image and flags, through the docker CLI, half of those rounds before the
   wakes and half after so drift on this shared machine falls on both.
   Then the back-to-back rate of sandbox calls with no pause, and what the
   idle pool holds (containers, memory).
2. write_file the same way (the sandbox's own write script with 1 KiB on
   stdin, against `docker exec -i` and `docker run --rm -i` of the same).

Not here: how the two halves of the references wrap the wakes (run.py's
measure), the harness's cost with no container at all (wake_cost.py), many
agents at once (scale.py), the quick sandbox-only comparison
(sandbox_overhead.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    PACE_S,
    TOKEN_CAP,
    WRITE_BYTES,
    LiveEnv,
    Script,
    Stats,
    as_one_runs_it,
    bench_agent,
    check_receipt,
    fake_api,
    idle_cost,
    stats,
    timed_ms,
)
from orchestrator.sandbox.engine import DockerSandbox


@dataclass(frozen=True)
class Paced:
    per_call: Stats  # request to next request, less the API's wait
    mean_ms: float  # the whole wake less every wait, divided by the calls (start-up,
    # the first cold calls and the journal stub's call included)
    cold: int  # calls that found the pool empty and made their container
    waited: int | None  # calls that found nothing ready (waited for a refill, or cold);
    # None: the code measured does not count them (an older checkout)
    in_box: Stats  # of which inside DockerSandbox.run/write (its duration_ms)


def paced_wake(tmp: Path, runtime: str, tools, calls: int, name: str, files: int = 0, pace_s: float = PACE_S) -> Paced:
    """`files`: that many empty files in the workspace (on its own disk) before the wake,
    as a working agent's would hold: what a call costs may grow with them. `pace_s`: the
    fake model's time to answer each request."""
    from orchestrator.wake.loop import wake

    agent = bench_agent(
        tmp / name,
        {"budget": {"max_steps": calls + 5, "max_tokens_per_wake": TOKEN_CAP}, "sandbox": {"runtime": runtime}},
    )
    fill(agent.workspace, files)
    script = Script(tools, calls, pace_s)
    with LiveEnv(fake_api(script, one_at_a_time=True)):  # one wake: no thread of the fake's per request
        started = time.perf_counter()
        # Made as the loop makes its own, as the wake starts; passed in only to count pool misses.
        with DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, ahead_at_begin=True) as box:
            misses = count_misses(box)
            receipt = wake(agent, live=True, sandbox=box)
            waited = getattr(box.pool, "waits", None)
        whole = time.perf_counter() - started
    check_receipt(receipt, name)
    if receipt.tool_calls != calls:
        raise SystemExit(f"bench: {name}: {receipt.tool_calls} tool calls, expected {calls}")
    from orchestrator.records.events import EVENTS_FILE, read_events

    in_box = [
        e.data["duration_ms"]
        for e in read_events(agent.state_dir / EVENTS_FILE)
        if e.type == "tool_result" and "duration_ms" in e.data
    ]
    return Paced(stats(script.gaps_ms()), (whole - sum(script.held)) * 1000 / calls, misses[0], waited, stats(in_box))


def fill(workspace: Path, files: int, per_folder: int = 100) -> None:
    """`files` empty files in folders of `per_folder`, owned as the workspace is."""
    st = workspace.stat()
    for i in range(files):
        folder = workspace / "files" / str(i // per_folder)
        if i % per_folder == 0:
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, st.st_uid, st.st_gid)
            os.chown(folder.parent, st.st_uid, st.st_gid)
        path = folder / str(i)
        path.touch()
        os.chown(path, st.st_uid, st.st_gid)


def count_misses(box: DockerSandbox) -> list[int]:
    """Instrument this one box: how many takes found the pool empty (a cold call)."""
    misses, take = [0], box.pool.take

    def counted():
        cid = take()
        misses[0] += cid is None
        return cid

    box.pool.take = counted
    return misses


@dataclass
class References:
    """docker exec into a warm container and docker run --rm, same image and flags, via the CLI."""

    exec_true: list[float]
    run_true: list[float]
    exec_write: list[float]
    run_write: list[float]


class Reference:
    """The CLI commands the sandbox calls are compared with, and the warm container for exec."""

    def __init__(self, box: DockerSandbox):
        from orchestrator.sandbox.containers.programs import write_argv as box_write_argv
        from orchestrator.sandbox.explain import docker_run_flags

        true_cfg, true_host = as_one_runs_it(*box.container_spec(["bash", "-c", "true"], "bench-ref"))
        write_argv = box_write_argv("bench/ref.txt")
        write_cfg, write_host = as_one_runs_it(*box.container_spec(write_argv, "bench-ref", stdin=True, workdir="/"))
        image = true_cfg["image"]
        self.run_true = ["docker", "run", *docker_run_flags(true_cfg, true_host), image, "bash", "-c", "true"]
        self.run_write = ["docker", "run", *docker_run_flags(write_cfg, write_host), image, *write_argv]
        keep = [f for f in docker_run_flags(true_cfg, true_host) if f != "--rm"]
        started = subprocess.run(
            ["docker", "run", "-d", *keep, image, "sleep", "infinity"], capture_output=True, text=True
        )
        if started.returncode != 0:
            raise SystemExit(f"bench: cannot start the exec reference container: {started.stderr.strip()}")
        self.cid = started.stdout.strip()
        self.exec_true = ["docker", "exec", self.cid, "bash", "-c", "true"]
        self.exec_write = ["docker", "exec", "-i", "-w", "/", self.cid, *write_argv]

    def rounds(self, n: int, into: References) -> None:
        data = b"x" * WRITE_BYTES
        for _ in range(n):  # interleaved call by call: noise lands on all four alike
            into.exec_true.append(timed_ms(self.exec_true))
            into.run_true.append(timed_ms(self.run_true))
            into.exec_write.append(timed_ms(self.exec_write, data))
            into.run_write.append(timed_ms(self.run_write, data))

    def close(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.cid], capture_output=True)


def back_to_back(box: DockerSandbox, calls: int) -> tuple[float, int, str]:
    """(calls per second with no pause, how many went cold, what the full idle pool holds)."""
    if box.pool is None:
        return 0.0, calls, "no pool"
    box.pool.wait_ready(box.pool.want, 60)
    idle = idle_cost(box.pool.idle())
    misses = count_misses(box)
    started = time.perf_counter()
    for _ in range(calls):
        result = box.run("true", timeout_s=30, max_output_chars=1000)
        if not result.ok:
            raise SystemExit(f"bench: back-to-back call failed: {result.for_model()}")
    return calls / (time.perf_counter() - started), misses[0], idle
