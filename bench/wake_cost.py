"""What the harness itself costs a wake, with no container: per step, and in input tokens.

3. Orchestrator overhead per step: a wake against a fake API answering at
   once, its tools answered by a STAND-IN sandbox (a bench-only test double
   that returns a canned SandboxResult without touching Docker); a step's
   overhead is the time between two model calls less the sandbox's time
   (context, registry, events, policy, the ledger's check and record). The
   SDK's own CPU inside the model call is shown beside it, and the two added.
4. Prompt caching: a 10-step wake with a 12k-token mandate, priced by
   ledger.py's table and cost function, against the same wake with the
   cache breakpoints ignored (the control bills every input token uncached).

Not here: a tool call in a real container (per_call.py), many agents at
once (scale.py), the prices themselves (orchestrator/records/ledger.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.common import (
    KEY,
    TOKEN_CAP,
    LiveEnv,
    Script,
    Stats,
    bash_true,
    bench_agent,
    check_receipt,
    fake_api,
    stats,
    write_1k,
)
from orchestrator.sandbox.box import SandboxResult
from orchestrator.sandbox.change_set import Settled, WakeChanges
from orchestrator.sandbox.disks.workspace_reads import HostFiles

OVERHEAD_STEPS = 60  # model steps in the orchestrator-overhead wake
CACHE_STEPS = 10  # model steps in the caching wake (9 tool calls, then the end)
PREFIX_CHARS = 48_000  # the caching wake's mandate: ~12k tokens at fakeapi's 4 chars a token
STANDIN_OUTPUT = "x" * 400  # what the stand-in sandbox answers in the caching wake (a typical ls)


class StandInSandbox:
    """BENCH-ONLY TEST DOUBLE for the container: answers every call at once with a
    canned SandboxResult, so what is left of a step is the orchestrator's own work."""

    def __init__(self, output: str = "", workspace: Path | None = None):
        self.output = output
        self.spent = 0.0
        self.workspace = workspace  # read as a wake reads it on a host (workspace_reads.HostFiles)

    def _answer(self) -> SandboxResult:
        started = time.perf_counter()
        result = SandboxResult(0, self.output, len(self.output), False, False, False, 0, "standin")
        self.spent += time.perf_counter() - started
        return result

    def run(self, command: str, timeout_s: float, max_output_chars: int) -> SandboxResult:
        return self._answer()

    def write(self, path: str, content: bytes, timeout_s: float = 30, append: bool = False) -> SandboxResult:
        return self._answer()

    def files(self) -> HostFiles:
        return HostFiles(self.workspace)

    def wind_down(self) -> None:
        """Nothing made ahead."""

    def begin(self, run_id: str) -> Settled:
        """No disk, so no transaction (sandbox/wakes/wake_layer.py)."""
        return Settled()

    def finish(self, protect: tuple[str, ...] = (), protect_git: bool = True) -> WakeChanges:
        return WakeChanges("")

    def egress_decisions(self) -> list[dict]:
        return []  # no network, no proxy

    def close(self) -> None:
        """Nothing held."""


class TimedModel:
    """The real LiveModel, with the start and end of every call recorded."""

    live = True

    def __init__(self, inner, box: StandInSandbox):
        self.inner, self.name, self.box = inner, inner.name, box
        self.spans: list[tuple[float, float, float]] = []  # (start, end, sandbox time so far)
        self.cpu: list[float] = []  # this thread's CPU in each call: the SDK's own work, in ms

    def call(self, **kwargs):
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return self.inner.call(**kwargs)
        finally:
            self.cpu.append((time.thread_time() - cpu) * 1000)
            self.spans.append((started, time.perf_counter(), self.box.spent))

    def overhead_ms(self) -> list[float]:
        """Per step: end of one model call to the start of the next, less the sandbox's time."""
        return [((b[0] - a[1]) - (b[2] - a[2])) * 1000 for a, b in zip(self.spans, self.spans[1:], strict=False)]

    def model_ms(self) -> list[float]:
        return [(end - start) * 1000 for start, end, _ in self.spans]


def alternate(step: int):
    return bash_true(step) if step % 2 == 0 else write_1k(step)


@dataclass(frozen=True)
class Overhead:
    loop: Stats  # per step: end of one model call to the start of the next, less the sandbox
    sdk_cpu: Stats  # per model call: this thread's CPU inside LiveModel.call (SDK, JSON, HTTP)
    per_step: Stats  # per step: the two together, the harness's whole cost of a step
    model_rtt: Stats  # per model call, wall: the above plus the fake server's time


def orchestrator_overhead(tmp: Path, steps: int, profile: Path | None = None) -> Overhead:
    from orchestrator.wake.loop import wake
    from orchestrator.wake.model import LiveModel

    agent = bench_agent(tmp, {"budget": {"max_steps": steps + 5, "max_tokens_per_wake": TOKEN_CAP}})
    box = StandInSandbox(workspace=agent.workspace)
    with LiveEnv(fake_api(Script(alternate, steps - 1, 0.0))):
        model = TimedModel(LiveModel(agent.model, KEY), box)  # the SDK reads the base URL now
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            receipt = profiler.runcall(wake, agent, live=True, sandbox=box, model=model)
            profiler.dump_stats(profile)
        else:
            receipt = wake(agent, live=True, sandbox=box, model=model)
    check_receipt(receipt, "orchestrator overhead")
    loop = model.overhead_ms()
    per_step = [gap + cpu for gap, cpu in zip(loop, model.cpu[1:], strict=True)]  # a step's gap, then its model call
    return Overhead(stats(loop), stats(model.cpu), stats(per_step), stats(model.model_ms()))


@dataclass(frozen=True)
class CacheCost:
    cached_usd: float
    uncached_usd: float
    cached_tokens: dict
    uncached_tokens: dict
    model: str
    cached_receipt_usd: float  # what the wake's receipt says it cost (the loop's Meter): input + output
    uncached_receipt_usd: float

    @property
    def saving(self) -> float:
        return 1 - self.cached_usd / self.uncached_usd


def long_mandate() -> str:
    """A fixed, human-written-looking mandate of about PREFIX_CHARS characters."""
    lines, n = ["# Mandate", ""], 0
    while sum(len(x) + 1 for x in lines) < PREFIX_CHARS:
        n += 1
        lines.append(
            f"{n}. Keep the catalogue of section {n} current: read the new entries, check "
            f"each against the sources listed in notes/section-{n}.md, fix what is wrong, "
            "and record what you changed and why in the journal."
        )
    return "\n".join(lines) + "\n"


def without_cache(script: Script):
    """A responder billing every input token uncached, as if no breakpoint were sent."""
    from orchestrator.testing.fakeapi import CHARS_PER_TOKEN, cache_model, strip_cache_control, usage

    def respond(rec):
        reply = script(rec)
        _, _, total = cache_model(strip_cache_control(rec.body), set())
        out = max(1, len(json.dumps(reply.content)) // CHARS_PER_TOKEN)
        return replace(reply, usage=usage(input_tokens=total, output_tokens=out))

    return respond


def caching(tmp: Path) -> CacheCost:
    from orchestrator.records.ledger import Usage, cost_usd, load_prices, price_for
    from orchestrator.wake.loop import wake

    receipts = {}
    for label in ("cached", "uncached"):
        budget = {"max_steps": CACHE_STEPS + 2, "max_tokens_per_wake": TOKEN_CAP}
        agent = bench_agent(tmp / label, {"budget": budget}, mandate=long_mandate())
        script = Script(bash_true, CACHE_STEPS - 1, 0.0)
        api = fake_api(script if label == "cached" else without_cache(script))
        with LiveEnv(api):
            receipt = wake(agent, live=True, sandbox=StandInSandbox(STANDIN_OUTPUT, agent.workspace))
        check_receipt(receipt, f"caching ({label})")
        if receipt.steps != CACHE_STEPS:
            raise SystemExit(f"bench: caching ({label}): {receipt.steps} steps, expected {CACHE_STEPS}")
        receipts[label] = receipt
    price = price_for(agent.model, load_prices())
    if price is None:
        raise SystemExit(f"bench: no price for {agent.model} in the ledger's table")

    def input_cost(r) -> float:  # input side only: output tokens are the same either way
        return cost_usd(
            price,
            Usage(
                input_tokens=r.usage.input_tokens,
                cache_write_5m_tokens=r.usage.cache_write_tokens,
                cache_read_tokens=r.usage.cache_read_tokens,
            ),
        )

    def tokens(r) -> dict:
        return {
            "input": r.usage.input_tokens,
            "cache_read": r.usage.cache_read_tokens,
            "cache_write": r.usage.cache_write_tokens,
        }

    cached, uncached = receipts["cached"], receipts["uncached"]
    return CacheCost(
        input_cost(cached),
        input_cost(uncached),
        tokens(cached),
        tokens(uncached),
        agent.model,
        getattr(cached, "usd", float("nan")),
        getattr(uncached, "usd", float("nan")),
    )
