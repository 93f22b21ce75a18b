"""Everything a user pays for, measured side by side in one run: one table.

    .venv/bin/python bench/run.py [--calls 30] [--runtimes runc,runsc] [--agents 20]

For each runtime (runc, then runsc):

1. bash `true` per call at an agent's pace: a real live wake (the real
   `anthropic` SDK over HTTP to orchestrator/fakeapi.py) whose fake API waits
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
3. Orchestrator overhead per step: a wake against a fake API answering at
   once, its tools answered by a STAND-IN sandbox (a bench-only test double
   that returns a canned SandboxResult without touching Docker); a step's
   overhead is the time between two model calls less the sandbox's time
   (context, registry, events, policy, the ledger's check and record). The
   SDK's own CPU inside the model call is shown beside it, and the two added.
4. Prompt caching: a 10-step wake with a 12k-token mandate, priced by
   ledger.py's table and cost function, against the same wake with the
   cache breakpoints ignored (the control bills every input token uncached).
5. Scale: N agents due at once under `wakeloop serve`'s Scheduler (default
   max concurrent) in a child process; wall time, the child's peak RSS
   (ru_maxrss) and the peak number of sandbox containers alive at once.

Every container the bench makes carries the wakeloop.sandbox label and a
workspace under the bench's temp dir; all of them are removed at the end.

Not here: tests of the pool's promises (tests/test_pool.py). The older
bench/sandbox_overhead.py stays as the quick, sandbox-only comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from orchestrator.policy.agent import init_agent, load_agent  # noqa: E402
from orchestrator.sandbox.engine import LABEL, DockerSandbox, connect  # noqa: E402
from orchestrator.sandbox.box import SandboxResult  # noqa: E402

PACE_S = 0.3                # the fake API's wait before each answer: a model takes at least this
CALLS = 30                  # calls per measured method (medians and p90 need a few dozen)
AGENTS = 20                 # agents due at once in the scale run
SCALE_TOOL_STEPS = 4        # tool calls in each scale wake (3 bash, 1 write_file), then the end
SCALE_TIMEOUT_S = 300       # the scale run gives up after this
OVERHEAD_STEPS = 60         # model steps in the orchestrator-overhead wake
CACHE_STEPS = 10            # model steps in the caching wake (9 tool calls, then the end)
PREFIX_CHARS = 48_000       # the caching wake's mandate: ~12k tokens at fakeapi's 4 chars a token
WRITE_BYTES = 1024          # content of each write_file call
STANDIN_OUTPUT = "x" * 400  # what the stand-in sandbox answers in the caching wake (a typical ls)
SSE_CHUNK = 1 << 20         # characters per SSE delta from the fake API: a block in one delta
SAMPLE_S = 0.1              # how often the scale run counts containers and the child's RSS
TOKEN_CAP = 50_000_000      # the bench's wakes must end on their script, never on the token budget
KEY = "sk-ant-bench-not-a-real-key"

# Targets from issue 7.
MAX_X_EXEC = 1.3            # a pooled call at most this many times a docker exec
MIN_X_RUN = 3.0             # and at least this many times faster than docker run --rm
MAX_OVERHEAD_MS = 5.0       # orchestrator overhead per step, median
MIN_CACHE_SAVING = 0.70     # input-token cost saved by prompt caching
MAX_RSS_MB = 150            # the orchestrator's peak RSS serving AGENTS agents


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

def make_agent(path: Path, policy: dict, mandate: str | None = None, schedule: str | None = None):
    init_agent(path)
    config = path / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    data.update(policy=policy, dry_run=False)
    if schedule:
        data["schedule"] = schedule
    config.write_text(yaml.safe_dump(data))
    if mandate is not None:
        (path / "mandate.md").write_text(mandate)
    return load_agent(path)


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
        from fakeapi import text, tool_use, turn
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
        return [(self.arrived[i + 1] - self.arrived[i] - self.held[i]) * 1000
                for i in range(min(self.calls, len(self.arrived) - 1))]


def bash_true(step: int):
    return "bash", {"command": "true"}


def write_1k(step: int):
    return "write_file", {"path": f"bench/w{step:03d}.txt", "content": "x" * WRITE_BYTES}


def fake_api(responder):
    """orchestrator/fakeapi.py's server, streaming each block in one delta: it sends a
    whole reply at once, as after a model's latency, where the tests' 7-char
    deltas would bill the harness for streaming a reply token by token."""
    from orchestrator import fakeapi
    fakeapi.CHUNK = SSE_CHUNK
    return fakeapi.FakeAPI(then=responder)


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


# -- 1 and 2: per call at an agent's pace ---------------------------------------

@dataclass(frozen=True)
class Paced:
    per_call: Stats         # request to next request, less the API's wait
    mean_ms: float          # the whole wake less every wait, divided by the calls (start-up,
                            # the first cold calls and the journal stub's call included)
    cold: int               # calls that found the pool empty and made their container
    in_box: Stats           # of which inside DockerSandbox.run/write (its duration_ms)


def paced_wake(tmp: Path, runtime: str, tools, calls: int, name: str) -> Paced:
    from orchestrator.wake.loop import wake
    agent = make_agent(tmp / name, {"budget": {"max_steps": calls + 5, "max_tokens_per_wake": TOKEN_CAP},
                                    "sandbox": {"runtime": runtime}})
    script = Script(tools, calls, PACE_S)
    with LiveEnv(fake_api(script)):
        started = time.perf_counter()
        # Made as the loop makes its own, as the wake starts; passed in only to count pool misses.
        with DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name) as box:
            misses = count_misses(box)
            receipt = wake(agent, live=True, sandbox=box)
        whole = time.perf_counter() - started
    check_receipt(receipt, name)
    if receipt.tool_calls != calls:
        raise SystemExit(f"bench: {name}: {receipt.tool_calls} tool calls, expected {calls}")
    from orchestrator.records.events import EVENTS_FILE, read_events
    in_box = [e.data["duration_ms"] for e in read_events(agent.state_dir / EVENTS_FILE)
              if e.type == "tool_result" and "duration_ms" in e.data]
    return Paced(stats(script.gaps_ms()), (whole - sum(script.held)) * 1000 / calls, misses[0],
                 stats(in_box))


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


def timed_ms(cmd: list[str], data: bytes | None = None) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, input=data, capture_output=True)
    elapsed = (time.perf_counter() - started) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd[:3])} failed: {proc.stderr.decode()[:300]}")
    return elapsed


class Reference:
    """The CLI commands the sandbox calls are compared with, and the warm container for exec."""

    def __init__(self, box: DockerSandbox):
        from orchestrator.sandbox.explain import docker_run_flags
        from orchestrator.sandbox.programs import write_argv as box_write_argv
        true_cfg, true_host = box.container_spec(["bash", "-c", "true"], "bench-ref")
        write_argv = box_write_argv("bench/ref.txt")
        write_cfg, write_host = box.container_spec(write_argv, "bench-ref", stdin=True, workdir="/")
        image = true_cfg["image"]
        self.run_true = ["docker", "run", *docker_run_flags(true_cfg, true_host), image, "bash", "-c", "true"]
        self.run_write = ["docker", "run", *docker_run_flags(write_cfg, write_host), image, *write_argv]
        keep = [f for f in docker_run_flags(true_cfg, true_host) if f != "--rm"]
        started = subprocess.run(["docker", "run", "-d", *keep, image, "sleep", "infinity"],
                                 capture_output=True, text=True)
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
    box.pool.wait_ready(box.pool.size, 60)
    idle = idle_cost(box.pool.idle())
    misses = count_misses(box)
    started = time.perf_counter()
    for _ in range(calls):
        result = box.run("true", timeout_s=30, max_output_chars=1000)
        if not result.ok:
            raise SystemExit(f"bench: back-to-back call failed: {result.for_model()}")
    return calls / (time.perf_counter() - started), misses[0], idle


def idle_cost(cids: list[str]) -> str:
    """Containers the idle pool holds and the memory each uses (docker stats)."""
    if not cids:
        return "empty"
    proc = subprocess.run(["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", *cids],
                          capture_output=True, text=True)
    usage = [line.split("/")[0].strip() for line in proc.stdout.splitlines()]
    return f"{len(cids)} containers, {' + '.join(usage) or '? (docker stats said nothing)'}"


# -- 3 and 4: no container -------------------------------------------------------

class StandInSandbox:
    """BENCH-ONLY TEST DOUBLE for the container: answers every call at once with a
    canned SandboxResult, so what is left of a step is the orchestrator's own work."""

    def __init__(self, output: str = ""):
        self.output = output
        self.spent = 0.0

    def _answer(self) -> SandboxResult:
        started = time.perf_counter()
        result = SandboxResult(0, self.output, len(self.output), False, False, False, 0, "standin")
        self.spent += time.perf_counter() - started
        return result

    def run(self, command: str, timeout_s: float, max_output_chars: int) -> SandboxResult:
        return self._answer()

    def write(self, path: str, content: bytes, timeout_s: float = 30, append: bool = False) -> SandboxResult:
        return self._answer()


class TimedModel:
    """The real LiveModel, with the start and end of every call recorded."""

    live = True

    def __init__(self, inner, box: StandInSandbox):
        self.inner, self.name, self.box = inner, inner.name, box
        self.spans: list[tuple[float, float, float]] = []   # (start, end, sandbox time so far)
        self.cpu: list[float] = []      # this thread's CPU in each call: the SDK's own work, in ms

    def call(self, **kwargs):
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return self.inner.call(**kwargs)
        finally:
            self.cpu.append((time.thread_time() - cpu) * 1000)
            self.spans.append((started, time.perf_counter(), self.box.spent))

    def overhead_ms(self) -> list[float]:
        """Per step: end of one model call to the start of the next, less the sandbox's time."""
        return [((b[0] - a[1]) - (b[2] - a[2])) * 1000 for a, b in zip(self.spans, self.spans[1:])]

    def model_ms(self) -> list[float]:
        return [(end - start) * 1000 for start, end, _ in self.spans]


def alternate(step: int):
    return bash_true(step) if step % 2 == 0 else write_1k(step)


@dataclass(frozen=True)
class Overhead:
    loop: Stats             # per step: end of one model call to the start of the next, less the sandbox
    sdk_cpu: Stats          # per model call: this thread's CPU inside LiveModel.call (SDK, JSON, HTTP)
    per_step: Stats         # per step: the two together, the harness's whole cost of a step
    model_rtt: Stats        # per model call, wall: the above plus the fake server's time


def orchestrator_overhead(tmp: Path, steps: int, profile: Path | None = None) -> Overhead:
    from orchestrator.wake.loop import wake
    from orchestrator.wake.model import LiveModel
    agent = make_agent(tmp, {"budget": {"max_steps": steps + 5, "max_tokens_per_wake": TOKEN_CAP}})
    box = StandInSandbox()
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
    per_step = [gap + cpu for gap, cpu in zip(loop, model.cpu[1:])]  # a step's gap, then its model call
    return Overhead(stats(loop), stats(model.cpu), stats(per_step), stats(model.model_ms()))


@dataclass(frozen=True)
class CacheCost:
    cached_usd: float
    uncached_usd: float
    cached_tokens: dict
    uncached_tokens: dict
    model: str
    cached_receipt_usd: float       # what the wake's receipt says it cost (the loop's Meter): input + output
    uncached_receipt_usd: float

    @property
    def saving(self) -> float:
        return 1 - self.cached_usd / self.uncached_usd


def long_mandate() -> str:
    """A fixed, human-written-looking mandate of about PREFIX_CHARS characters."""
    lines, n = ["# Mandate", ""], 0
    while sum(len(x) + 1 for x in lines) < PREFIX_CHARS:
        n += 1
        lines.append(f"{n}. Keep the catalogue of section {n} current: read the new entries, check "
                     f"each against the sources listed in notes/section-{n}.md, fix what is wrong, "
                     "and record what you changed and why in the journal.")
    return "\n".join(lines) + "\n"


def without_cache(script: Script):
    """A responder billing every input token uncached, as if no breakpoint were sent."""
    from orchestrator.fakeapi import CHARS_PER_TOKEN, strip_cache_control, cache_model, usage

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
        agent = make_agent(tmp / label, {"budget": {"max_steps": CACHE_STEPS + 2, "max_tokens_per_wake": TOKEN_CAP}}, mandate=long_mandate())
        script = Script(bash_true, CACHE_STEPS - 1, 0.0)
        api = fake_api(script if label == "cached" else without_cache(script))
        with LiveEnv(api):
            receipt = wake(agent, live=True, sandbox=StandInSandbox(STANDIN_OUTPUT))
        check_receipt(receipt, f"caching ({label})")
        if receipt.steps != CACHE_STEPS:
            raise SystemExit(f"bench: caching ({label}): {receipt.steps} steps, expected {CACHE_STEPS}")
        receipts[label] = receipt
    price = price_for(agent.model, load_prices())
    if price is None:
        raise SystemExit(f"bench: no price for {agent.model} in the ledger's table")

    def input_cost(r) -> float:  # input side only: output tokens are the same either way
        return cost_usd(price, Usage(input_tokens=r.input_tokens, cache_write_5m=r.cache_creation_tokens,
                                     cache_read=r.cache_read_tokens))

    def tokens(r) -> dict:
        return {"input": r.input_tokens, "cache_read": r.cache_read_tokens,
                "cache_write": r.cache_creation_tokens}
    cached, uncached = receipts["cached"], receipts["uncached"]
    return CacheCost(input_cost(cached), input_cost(uncached), tokens(cached), tokens(uncached), agent.model,
                     getattr(cached, "usd", float("nan")), getattr(uncached, "usd", float("nan")))


# -- 5: scale --------------------------------------------------------------------

@dataclass(frozen=True)
class Scale:
    agents: int
    done: int
    wall_s: float
    rss_mb: float           # the child's ru_maxrss
    rss_sampled_mb: float   # the highest VmRSS seen from outside, a cross-check
    peak_containers: int
    max_concurrent: int
    failed: tuple[str, ...]         # "agent: status: reason" of each wake that did not end done


def scale_tools(step: int):
    if step == SCALE_TOOL_STEPS - 1:
        return "write_file", {"path": "notes/summary.md", "content": "# Summary\n" + "x" * WRITE_BYTES}
    return "bash", {"command": f"echo step {step} >> notes.txt; wc -l notes.txt; ls"}


def scale(tmp: Path, runtime: str, agents: int) -> Scale:
    from orchestrator.records.state import load_state
    root = tmp / "agents"
    root.mkdir(parents=True)
    for i in range(agents):
        make_agent(root / f"a{i:02d}", {"sandbox": {"runtime": runtime}}, schedule="1h")
    api = fake_api(Script(scale_tools, SCALE_TOOL_STEPS, PACE_S))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WAKELOOP_"))}
    with api:
        env.update(ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY=KEY)
        child = subprocess.Popen([sys.executable, __file__, "--scale-child", str(root), str(agents)],
                                 stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
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
    receipts = {d.name: load_state(d / "state")[0].last_receipt or {} for d in sorted(root.iterdir())}
    failed = tuple(f"{name}: {r.get('status', 'no receipt')}: {r.get('reason', '')}"
                   for name, r in receipts.items() if r.get("status") != "done")
    for line in failed:
        say(f"scale: {line}")
        name = line.split(":", 1)[0]
        for said in report["lines"]:
            if f" {name}:" in said:  # what serve printed about it
                say(f"scale:   {said}")
    return Scale(agents, agents - len(failed), report["wall_s"], report["maxrss_kb"] / 1024,
                 peak_rss / 1024, peak_containers, report["max_concurrent"], failed)


def watch(child: subprocess.Popen, root: Path) -> tuple[int, int]:
    """Until the child exits: (most sandbox containers of `root` alive at once, highest VmRSS in kB)."""
    api = connect().api
    peak, rss = 0, 0
    while child.poll() is None:
        found = api.containers(all=True, filters={"label": f"{LABEL}=1"})
        peak = max(peak, sum(1 for c in found
                             if c["Labels"].get("wakeloop.workspace", "").startswith(str(root))))
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
    print(json.dumps({"wall_s": wall, "completed": scheduler.completed, "max_concurrent": MAX_CONCURRENT,
                      "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "lines": lines}))
    return 0


# -- one runtime, then the table ---------------------------------------------------

def measure(tmp: Path, runtime: str, calls: int, agents: int) -> dict:
    out: dict = {"load": os.getloadavg()[0]}
    agent = make_agent(tmp / "ref", {"sandbox": {"runtime": runtime}})
    ref = Reference(DockerSandbox(agent.workspace, agent.policy.sandbox, agent="bench-ref", warm=0))
    refs = References([], [], [], [])
    try:
        say(f"{runtime}: docker exec / docker run references, first half")
        ref.rounds(calls // 2, refs)
        say(f"{runtime}: bash `true` wake at {PACE_S * 1000:.0f} ms pace, {calls} calls")
        out["bash"] = paced_wake(tmp, runtime, bash_true, calls, "bash-wake")
        say(f"{runtime}: write_file wake at {PACE_S * 1000:.0f} ms pace, {calls} calls")
        out["write"] = paced_wake(tmp, runtime, write_1k, calls, "write-wake")
        say(f"{runtime}: docker exec / docker run references, second half")
        ref.rounds(calls - calls // 2, refs)
    finally:
        ref.close()
    say(f"{runtime}: back-to-back sandbox calls and the idle pool")
    with DockerSandbox(agent.workspace, agent.policy.sandbox, agent="bench-pool") as box:
        out["rate"], out["rate_cold"], out["idle"] = back_to_back(box, calls)
    out["exec_true"], out["run_true"] = stats(refs.exec_true), stats(refs.run_true)
    out["exec_write"], out["run_write"] = stats(refs.exec_write), stats(refs.run_write)
    say(f"{runtime}: orchestrator overhead ({OVERHEAD_STEPS} steps, stand-in sandbox)")
    out["overhead"] = orchestrator_overhead(tmp / "overhead", OVERHEAD_STEPS)
    say(f"{runtime}: prompt caching ({CACHE_STEPS}-step wake, {PREFIX_CHARS // 4:,}-token mandate)")
    out["cache"] = caching(tmp / "cache")
    say(f"{runtime}: scale: {agents} agents due at once")
    out["scale"] = scale(tmp, runtime, agents)
    out["load"] = f"{out['load']:.1f} -> {os.getloadavg()[0]:.1f}"
    return out


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def ratio(value: float, ok: bool) -> str:
    return f"{value:.2f}x {verdict(ok)}"


def rows_for(r: dict) -> list[tuple[str, str, str]]:
    """(what, target, value) for one runtime; the same rows in the same order for every runtime."""
    rows = [("load average (1 min), start -> end", "", r["load"])]
    for tool, paced, exec_s, run_s in (("bash true", r["bash"], r["exec_true"], r["run_true"]),
                                       ("write_file 1 KiB", r["write"], r["exec_write"], r["run_write"])):
        x_exec = paced.per_call.median / exec_s.median
        x_run = run_s.median / paced.per_call.median
        rows += [
            (f"{tool}: wakeloop call at agent pace", "",
             f"{paced.per_call.cell()}, {paced.cold}/{paced.per_call.n} cold"),
            ("  of which inside the sandbox call", "", paced.in_box.cell()),
            ("  whole wake less the waits, per call", "", f"{paced.mean_ms:.0f} ms mean"),
            (f"{tool}: docker exec into a warm container", "", exec_s.cell()),
            (f"{tool}: docker run --rm", "", run_s.cell()),
            ("  call / exec", f"<= {MAX_X_EXEC}x", ratio(x_exec, x_exec <= MAX_X_EXEC)),
            ("  docker run / call", f">= {MIN_X_RUN:g}x", ratio(x_run, x_run >= MIN_X_RUN)),
        ]
    oh, c, s = r["overhead"], r["cache"], r["scale"]
    rows += [
        ("back-to-back sandbox calls, no pause", "", f"{r['rate']:.1f} calls/s, {r['rate_cold']} cold"),
        ("idle pool holds", "", r["idle"]),
        ("orchestrator overhead per step: loop", f"< {MAX_OVERHEAD_MS:g} ms median",
         f"{oh.loop.cell()} {verdict(oh.loop.median < MAX_OVERHEAD_MS)}"),
        ("  SDK client CPU per model call", "", oh.sdk_cpu.cell()),
        # The SDK's CPU is part of the model call, which the target leaves out; shown, not judged.
        ("  loop + SDK client CPU per step", "", oh.per_step.cell()),
        ("  model call to an instant fake API, wall", "", oh.model_rtt.cell()),
        (f"input cost, {CACHE_STEPS}-step wake, caching", "", f"${c.cached_usd:.4f}"),
        ("  tokens read / written / uncached", "", f"{c.cached_tokens['cache_read']:,} / "
         f"{c.cached_tokens['cache_write']:,} / {c.cached_tokens['input']:,}"),
        (f"input cost, {CACHE_STEPS}-step wake, no caching", "",
         f"${c.uncached_usd:.4f} ({c.uncached_tokens['input']:,} tokens)"),
        ("  whole wake per its receipt, caching / not", "",
         f"${c.cached_receipt_usd:.4f} / ${c.uncached_receipt_usd:.4f}"),
        ("  saving on input", f">= {MIN_CACHE_SAVING * 100:.0f} %",
         f"{c.saving * 100:.1f} % {verdict(c.saving >= MIN_CACHE_SAVING)}"),
        (f"scale: {s.agents} agents due at once, finished", "all",
         f"{s.done}/{s.agents} {verdict(s.done == s.agents)}"),
        ("  wall time", "", f"{s.wall_s:.1f} s"),
        ("  peak orchestrator RSS (ru_maxrss)", f"< {MAX_RSS_MB} MB",
         f"{s.rss_mb:.0f} MB {verdict(s.rss_mb < MAX_RSS_MB)}"),
        ("  peak live sandbox containers", "", str(s.peak_containers)),
    ]
    return rows


def table(results: dict, calls: int) -> str:
    runtimes = list(results)
    per = {rt: rows_for(results[rt]) for rt in runtimes}
    first = per[runtimes[0]]
    head = ["measure", "target", *runtimes]
    body = [[what, target, *[per[rt][i][2] for rt in runtimes]] for i, (what, target, _) in enumerate(first)]
    widths = [max(len(row[j]) for row in [head, *body]) for j in range(len(head))]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    scale = results[runtimes[0]]["scale"]
    failed = [f"  {rt} scale: {line}" for rt in runtimes for line in results[rt]["scale"].failed]
    return "\n".join([
        f"wakeloop bench: {os.cpu_count()} cores; median / p90 over {calls} calls; "
        f"fake API pace {PACE_S * 1000:.0f} ms",
        fmt(head), fmt(["-" * w for w in widths]), *map(fmt, body), *failed,
        "cold: the call found the pool empty and created its own container. exec and run: the docker CLI,",
        "same image and flags. Overhead: a STAND-IN sandbox (bench-only test double, no container) and a",
        f"fake API answering at once, {OVERHEAD_STEPS} steps. Caching: prices from ledger.py for "
        f"{results[runtimes[0]]['cache'].model}; the control bills every input token uncached.",
        f"Scale: `serve`'s Scheduler (max concurrent {scale.max_concurrent}) in a child process, "
        f"{SCALE_TOOL_STEPS} tool calls per wake at {PACE_S * 1000:.0f} ms pace.",
    ])


def cleanup(tmp: Path) -> int:
    """Remove every sandbox container whose workspace is under the bench's temp dir."""
    api = connect().api
    gone = 0
    for c in api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        if c["Labels"].get("wakeloop.workspace", "").startswith(str(tmp)):
            api.remove_container(c["Id"], force=True)
            gone += 1
    return gone


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--scale-child":
        return scale_child(sys.argv[2], int(sys.argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=CALLS, help=f"calls per method (default {CALLS})")
    parser.add_argument("--runtimes", default="runc,runsc", help="comma-separated (default runc,runsc)")
    parser.add_argument("--agents", type=int, default=AGENTS, help=f"agents in the scale run (default {AGENTS})")
    parser.add_argument("--profile", metavar="FILE", help="only profile the orchestrator-overhead wake (cProfile)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wakeloop-bench-")).resolve()
    results = {}
    started = time.perf_counter()
    try:
        if args.profile:
            oh = orchestrator_overhead(tmp / "overhead", OVERHEAD_STEPS, Path(args.profile))
            print(f"orchestrator overhead per step: {oh.per_step.cell()} (loop {oh.loop.cell()}, "
                  f"SDK CPU {oh.sdk_cpu.cell()}); cProfile stats in {args.profile}")
            return 0
        for runtime in args.runtimes.split(","):
            results[runtime] = measure(tmp / runtime, runtime, args.calls, args.agents)
    finally:
        left = cleanup(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(results, args.calls))
    print(f"whole bench {time.perf_counter() - started:.0f} s; sandbox containers of the bench "
          f"still there at the end (removed now): {left}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
