"""How many wakes `serve` runs at once when `--max-concurrent` does not say: fit to the host.

Three limits, the smallest wins, and `serve` says all three in one line:

- the engine: a wake asks for one container per model turn, so it cycles
  through a turn (ENGINE_TURN_S at the least) and a call (the measured
  latency of one create-start-remove, which on a loaded host is seconds).
  By Little's law rate x (turn + latency) wakes keep the engine busy;
  ENGINE_HEADROOM more keeps the next call waiting when turns or calls
  run short. More only lengthens the queue inside the engine, where a call
  could time out. Rate and latency are measured at start (sandbox/rate.py),
  or asked of the broker; past one host, of every node's broker, the rates
  summed and the slowest latency kept.
- memory: each running wake may have one call using its policy's whole
  `sandbox.memory` (warm containers idle in a launcher of ~1 MB), so the
  memory available now, divided by the largest policy's limit.
- cores: the harness's own steps, the calls' CPU and the engine's work
  share them; WAKES_PER_CORE is an estimate, not a measurement.

In process, a fleet that fits the cores and memory limits whole runs
whole, past the engine's limit: that limit keeps a long queue of wakes from
becoming a long queue of calls inside the engine, and a fleet that small
has neither. Held to the engine's K, its last wakes would run alone after
the others, the engine idle between their turns (the fleet bench's 10
agents at K = 7-8: 1.2-1.5x the engine-bound time). Not through a broker:
its host and its caps (max.calls) are not this host's cores and memory.

Not here: measuring the engine (sandbox/rate.py), queueing (scheduler.py).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ENGINE_TURN_S = 1.0  # the shortest model turn (the fleet bench's fake API answers in this)
ENGINE_HEADROOM = 1.5  # x the wakes that just keep the engine busy: the next call is already waiting
WAKES_PER_CORE = 8  # estimated: a wake at 1-s turns is busy on this host a tenth of its time
MIN_WAKES = 1
RATE_CALLS_PER_CORE = 4  # cold calls of `true` the start-up measurement makes, per core
RATE_PARALLEL_PER_CORE = 2  # at once, per core: enough to keep the engine's own threads busy


@dataclass(frozen=True)
class Host:
    cores: int
    memory_available: int  # bytes, /proc/meminfo's MemAvailable
    engine_rate: float | None  # containers created, started and removed per second; None: unknown
    rate_note: str = ""  # why it is unknown, or how it was measured
    engine_latency_s: float = 0.0  # one call's create-start-remove, measured at that rate
    agents: int = 0  # agents under ROOT; 0: not counted


@dataclass(frozen=True)
class Choice:
    wakes: int
    why: str  # one line: every limit, its numbers, and which one bound


def choose(host: Host, box_memory: int) -> Choice:
    """Wakes at once for this host, and why, in one line."""
    limits = {"cores": (host.cores * WAKES_PER_CORE, f"{host.cores} cores x {WAKES_PER_CORE}")}
    if host.memory_available:
        limits["memory"] = (
            host.memory_available // max(box_memory, 1),
            f"{_gib(host.memory_available)} available / {_mib(box_memory)} per call",
        )
    if host.engine_rate:
        cycle = ENGINE_TURN_S + host.engine_latency_s
        limits["engine"] = (
            math.ceil(host.engine_rate * cycle * ENGINE_HEADROOM),
            f"{host.engine_rate:.1f} containers/s{host.rate_note} x ({ENGINE_TURN_S:g} s turn "
            f"+ {host.engine_latency_s:.1f} s a call) x {ENGINE_HEADROOM:g}",
        )
    bound = min(limits, key=lambda name: limits[name][0])
    others = [n for name, (n, _) in limits.items() if name != "engine"]
    if bound == "engine" and limits[bound][0] < host.agents <= min(others):
        limits["agents"] = (host.agents, "all of them: within the cores' and memory's limits")
        bound = "agents"
    wakes = max(MIN_WAKES, limits[bound][0])
    parts = [f"{name} {n} ({how})" for name, (n, how) in limits.items()]
    if not host.engine_rate:
        parts.append(f"engine not measured{host.rate_note}")
    return Choice(
        wakes,
        f"at most {wakes} wake(s) at once, set by {bound}: " + ", ".join(parts) + "; --max-concurrent K to choose",
    )


def measure_host(root: Path, broker: str | None) -> tuple[Host, int]:
    """(this host, the largest `sandbox.memory` of the agents under ROOT). The engine's
    rate is measured under the first agent's policy, or asked of the broker, which
    holds the engine (and measures under its default policy)."""
    from orchestrator.fleet.schedule import agent_dirs
    from orchestrator.policy.agent import load_agent
    from orchestrator.policy.schema import DEFAULT

    policies = []
    for path in agent_dirs(root):
        try:
            policies.append(load_agent(path).policy.sandbox)
        except Exception:  # any failure: serve says why when it schedules it
            continue
    box_memory = max((p.memory for p in policies), default=DEFAULT.sandbox.memory)
    rate, latency, note = _broker_rate(broker) if broker else _engine_rate((policies or [DEFAULT.sandbox])[0])
    # Through a broker the boxes run on its host, under its own caps (max.calls): this host's
    # cores and memory say nothing of them, so the fleet is held to the engine's K there.
    return Host(cores(), memory_available(), rate, note, latency, 0 if broker else len(policies)), box_memory


def _engine_rate(policy) -> tuple[float | None, float, str]:
    from orchestrator.errors import WakeloopError
    from orchestrator.sandbox import rate
    from orchestrator.sandbox.containers.engine_client import connect

    n = cores()
    try:
        measured = rate.measure(connect(), policy, RATE_CALLS_PER_CORE * n, RATE_PARALLEL_PER_CORE * n)
    except WakeloopError as exc:
        return None, 0.0, f": {exc}"
    return measured.per_s, measured.latency_s, f", {measured.calls} cold calls in {measured.seconds:.1f} s,"


def _broker_rate(address: str) -> tuple[float | None, float, str]:
    """The broker's engine's rate; past one host every node's broker's, summed: the fleet's
    engine is all of theirs (a node that does not say adds nothing, and the line says so)."""
    from orchestrator.broker import nodes

    targets = nodes.brokers(address)
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        answers = list(pool.map(_one_broker_rate, targets))
    measured = [a for a in answers if not isinstance(a, str)]
    if not measured:
        return None, 0.0, f": the broker did not say ({answers[0]})"
    calls, seconds = sum(m.calls for m in measured), max(m.seconds for m in measured)
    whose = "the broker's" if len(targets) == 1 else f"{len(measured)} of {len(targets)} nodes' brokers'"
    return (
        sum(m.per_s for m in measured),
        max(m.latency_s for m in measured),
        f", {whose}: {calls} cold calls in {seconds:.1f} s,",
    )


def _one_broker_rate(address: str):
    """One broker's EngineRate, or why it gave none."""
    from orchestrator.broker.client import BrokerClient
    from orchestrator.errors import WakeloopError

    try:
        return BrokerClient(address).rate()
    except WakeloopError as exc:
        return str(exc)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def memory_available(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Bytes the kernel says can be had without swapping; 0 if it does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"
