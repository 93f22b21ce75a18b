"""What the bench's measurements share: constants, numbers, agents, the fake API, the docker CLI.

Stats (a table cell's median and p90), bench_agent (a live agent on disk with
the policy a measurement needs), Script (what the fake API answers, and when each
request came), LiveEnv (the base URL and key a live wake reads), timed_ms and
idle_cost (the docker CLI), as_one_runs_it (a box's settings as a person's
`docker run` has them), and cleanup of every container the bench made.

Not here: the measurements (per_call.py, wake_cost.py, scale.py), the table
and the command line (run.py), the fake API itself (orchestrator/testing/fakeapi.py),
what the tests share too (tests/helpers/: make_agent, REPO, scrubbed_env).

Run from the checkout as modules of this package (`python -m bench.run`), so
`bench.*` and `tests.helpers` import as packages; orchestrator is the one
installed (`pip install -e .`).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.policy.agent import Agent, load_agent
from orchestrator.sandbox.containers.engine_client import connect
from orchestrator.sandbox.disks import disk, disk_attach, disk_survey
from orchestrator.sandbox.egress import netns
from orchestrator.sandbox.engine import LABEL
from tests.helpers import make_agent

PACE_S = 0.3  # the fake API's wait before each answer: a model takes at least this
WRITE_BYTES = 1024  # content of each write_file call
SSE_CHUNK = 1 << 20  # characters per SSE delta from the fake API: a block in one delta
TOKEN_CAP = 50_000_000  # the bench's wakes must end on their script, never on the token budget
KEY = "sk-ant-bench-not-a-real-key"


# -- numbers -------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    median: float
    p90: float
    n: int

    def cell(self, unit: str = "ms") -> str:
        return f"{self.median:.1f} / {self.p90:.1f} {unit}"


def stats(samples: list[float]) -> Stats:
    p90 = statistics.quantiles(samples, n=10)[-1] if len(samples) > 1 else samples[0]
    return Stats(statistics.median(samples), p90, len(samples))


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# -- agents and the fake API ---------------------------------------------------

BENCH_DISK = "256m"  # each agent's workspace disk: its size costs nothing per call, and
# hundreds of agents must fit the host's room for disks (disk._check_room)


def bench_agent(path: Path, policy: dict, **options) -> Agent:
    """The live agent at PATH, loaded: `policy` on the bench's disk size unless it names one;
    options as make_agent's (mandate, schedule)."""
    policy = {**policy, "sandbox": {"disk": BENCH_DISK, **policy.get("sandbox", {})}}
    return load_agent(make_agent(path.parent, path.name, policy=policy, live=True, **options))


def step_of(body: dict) -> int:
    """Which model step a request is (0-based): the assistant turns it already holds."""
    return sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")


class Script:
    """A fake-API responder: `calls` tool calls, then an end_turn; each answer
    after `pace_s`. Stateless per request (the step is read from the body), so
    many agents can share one server. Records when each request arrived and
    how long it was held."""

    def __init__(self, tools, calls: int, pace_s: float):
        self.tools, self.calls, self.pace_s = tools, calls, pace_s
        self.arrived: list[float] = []
        self.held: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, rec):
        from orchestrator.testing.fakeapi import text, tool_use, turn

        arrived = time.perf_counter()
        step = step_of(rec.body)
        if self.pace_s:
            time.sleep(self.pace_s)
        with self._lock:
            self.arrived.append(arrived)
            self.held.append(time.perf_counter() - arrived)
        if step >= self.calls:
            return turn(text("Done for this wake."))
        name, args = self.tools(step)
        return turn(tool_use(name, args))

    def gaps_ms(self) -> list[float]:
        """Per tool call: request to next request, less the time the API held the first."""
        return [
            (self.arrived[i + 1] - self.arrived[i] - self.held[i]) * 1000
            for i in range(min(self.calls, len(self.arrived) - 1))
        ]


def bash_true(step: int):
    return "bash", {"command": "true"}


def write_1k(step: int):
    return "write_file", {"path": f"bench/w{step:03d}.txt", "content": "x" * WRITE_BYTES}


def fake_api(responder, one_at_a_time: bool = False, bucket=None):
    """orchestrator/testing/fakeapi.py's server, streaming each block in one delta: it sends a
    whole reply at once, as after a model's latency, where the tests' 7-char
    deltas would bill the harness for streaming a reply token by token.
    `one_at_a_time`: for one wake's requests, answered on the server's thread (FakeAPI).
    `bucket`: a fakeapi.Bucket, the API's requests limit it enforces (429 past it)."""
    from orchestrator.testing import fakeapi

    fakeapi.CHUNK = SSE_CHUNK
    return fakeapi.FakeAPI(then=responder, one_at_a_time=one_at_a_time, bucket=bucket)


class LiveEnv:
    """ANTHROPIC_BASE_URL and a fake key for this process while a fake API runs."""

    def __init__(self, api):
        self.api = api

    def __enter__(self):
        self.api.__enter__()
        self.saved = {k: os.environ.get(k) for k in ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")}
        os.environ.update(ANTHROPIC_BASE_URL=self.api.url, ANTHROPIC_API_KEY=KEY)
        return self.api

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.api.__exit__(*exc)


def check_receipt(receipt, what: str) -> None:
    if receipt.status != "done":
        raise SystemExit(f"bench: {what}: the wake ended {receipt.status}: {receipt.reason}")


# -- the docker CLI and the bench's containers ----------------------------------


def timed_ms(cmd: list[str], data: bytes | None = None) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, input=data, capture_output=True)
    elapsed = (time.perf_counter() - started) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd[:3])} failed: {proc.stderr.decode()[:300]}")
    return elapsed


def idle_cost(cids: list[str]) -> str:
    """Containers the idle pool holds and the memory each uses (docker stats)."""
    if not cids:
        return "empty"
    proc = subprocess.run(
        ["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", *cids], capture_output=True, text=True
    )
    usage = [line.split("/")[0].strip() for line in proc.stdout.splitlines()]
    return f"{len(cids)} containers, {' + '.join(usage) or '? (docker stats said nothing)'}"


def own_disks(tmp: Path) -> None:
    """The bench's agents' workspace disks go under its temp dir (children inherit it)."""
    os.environ[disk.DISKS_ENV] = str(tmp / "disks")


def cleanup(tmp: Path) -> int:
    """Remove every sandbox container (and holder) whose workspace is under the bench's temp dir,
    then the disks of its agents (unmounted, detached, deleted)."""
    client = connect()
    gone = 0
    for c in client.api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        if c["Labels"].get("wakeloop.workspace", "").startswith(str(tmp)):
            client.api.remove_container(c["Id"], force=True)
            gone += 1
    gone += netns.leftovers(client, tmp)  # the gVisor boxes' namespace holders
    if disk.disks_dir() == tmp / "disks":
        for key in disk_survey.keys():
            disk_attach.release(client, key, delete=True, force=True)
    return gone


def as_one_runs_it(config: dict, host: dict) -> tuple[dict, dict]:
    """A box's settings as a person's `docker run` gives them: under gVisor our boxes join one
    empty namespace (sandbox/egress/netns.py), where `--network none` makes one per container."""
    if host["network_mode"].startswith("container:" + netns.PREFIX):
        host = {**host, "network_mode": "none"}
        config = {**config, "hostname": "sandbox"}
    return config, host
