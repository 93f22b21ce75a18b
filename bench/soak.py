"""A soak: N dry-run agents waking every second under one `wakeloop serve` for a while.

    .venv/bin/python -m bench.soak [--agents 20] [--seconds 600] [--sample-s 5]
    .venv/bin/python -m bench.soak --standin --agents 50 --until-wakes 10000
    .venv/bin/python -m bench.soak --shape one-call --until-wakes 10000 --seconds 3000

What months unattended would show, compressed: `serve` runs as the CLI runs
it (`python -m orchestrator serve ROOT`, a child of this process), every
agent on `every: 1s`, dry run (the scripted model drives real sandbox calls,
no API). Every `sample_s` the child's RSS, open descriptors and threads are
read from /proc. At the end: the first and last quarter's averages and the
peaks, bytes of `state/` per wake, wakes per second and failures (any wake
that did not end `done`; must be 0). A flat line is the promise: what the
first quarter holds, the last holds too.

The quarters are taken after the warm-up (until every agent has finished
one wake: its disk is made, every lazily imported module loaded); the
peaks include it.

`--standin` measures the orchestrator alone over many more wakes: the same
Scheduler and wake loop in a child, each call answered at once by the
bench's stand-in sandbox (wake_cost.StandInSandbox), so ten thousand wakes
take minutes, not hours. It is how "RSS after 10,000 wakes within 10 % of
RSS after 1,000" is measured; the engine's side of a wake is what the real
soak covers.

`--shape one-call` keeps serve (the CLI, a child) and the engine but
makes each wake as small as a wake can be: live against the bench's fake
Messages API (in this process, answered at once, zero tokens billed),
one bash call that appends to today's journal (so no harness stub, which
would be a second call), then end_turn. One container per wake instead of
the dry run's four, so 10,000 wakes fit in well under an hour here, and
every wake still goes through serve's scheduler, the SDK's HTTP, the
sandbox and the records. With `--until-wakes` the table gives serve's
RSS and descriptors at every 1,000th wake and the change from wake 1,000.

Ticks that come while an agent's wake still runs are skipped by the
scheduler (one wake per agent at a time), so wakes/s is what the host
sustains, not agents x 1/s.

Every container and disk the soak makes lives under its own temp dir and
is removed at the end, whatever happens.

Not here: the one-off measurements (run.py and its modules), the
scheduler's promises (tests/test_scheduler.py); the in-suite short soak is
tests/test_soak.py, which calls soak() below.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.common import KEY, cleanup, fake_api, say, step_of
from tests.helpers import REPO, scrubbed_env

AGENTS = 20  # agents under one serve, each due every second
SECONDS = 600  # how long serve runs: about ten minutes here, with the set-up
SAMPLE_S = 5.0  # how often the child's RSS, descriptors and threads are read
MAX_CONCURRENT = 4  # serve's default K
STOP_GRACE_S = 90  # after SIGTERM, how long serve gets to end its wakes cleanly
MILESTONE = 1_000  # with --until-wakes: RSS and descriptors at every this many wakes
TRACE_ENV = "WAKELOOP_SOAK_TRACE"  # --trace DIR: the stand-in child traces its allocations into DIR
TRACE_EVERY = 500  # wakes between tracemalloc snapshots (--trace-every)
TRACE_FRAMES = 8  # frames kept per allocation: enough to see whose call made it
PROBE_ENV = "WAKELOOP_SOAK_PROBE"  # --probe FILE: the stand-in child writes what holds its memory into FILE
PROBE_EVERY = 250  # wakes between probes (--probe-every)
PROBE_TYPES = 12  # object types per probe line: the ones with the most live objects
FLAT_WITHIN = 0.05  # the bar: after the first MILESTONE wakes, RSS stays within 5 %
SHAPES = ("dry", "one-call")
# the one-call wake's command: appends to today's journal (the container's clock is UTC, as the
# harness's day is), so the wake leaves its own trace and the harness writes no stub
ONE_CALL = 'mkdir -p memory/journal && echo "- soak wake at $(date -u +%T)" >> memory/journal/$(date -u +%F).md'


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since serve started
    rss_kb: int
    fds: int
    threads: int
    wakes: int  # wakes finished so far, from serve's own lines


@dataclass
class Soak:
    agents: int
    seconds: float
    samples: list[Sample] = field(default_factory=list)
    wakes: int = 0
    failures: list[str] = field(default_factory=list)
    state_bytes: int = 0  # all agents' state/ at the end, less what init left
    rotated: int = 0  # rotated segments under the agents' state/ at the end
    gzip_ratio: float = 0.0  # the live event logs' size gzipped over plain: what rotation keeps

    @property
    def warm(self) -> list[Sample]:
        """The samples after every agent has finished a wake (all of them if none is)."""
        warm = [s for s in self.samples if s.wakes >= self.agents]
        return warm if len(warm) >= 4 else self.samples

    def quarter(self, which: str, attr: str) -> float:
        """The average of `attr` over the first or last quarter of the warm samples."""
        n = max(1, len(self.warm) // 4)
        part = self.warm[:n] if which == "first" else self.warm[-n:]
        return sum(getattr(s, attr) for s in part) / len(part)

    def at_wake(self, count: int) -> Sample | None:
        """The first sample taken once `count` wakes had finished."""
        return next((s for s in self.samples if s.wakes >= count), None)

    def peak(self, attr: str) -> float:
        return max(getattr(s, attr) for s in self.samples)

    def growth(self, attr: str) -> float:
        """Last quarter's average over the first's: 1.0 is flat."""
        return self.quarter("last", attr) / max(1e-9, self.quarter("first", attr))

    @property
    def rate(self) -> float:
        return self.wakes / self.seconds if self.seconds else 0.0

    @property
    def bytes_per_wake(self) -> float:
        return self.state_bytes / self.wakes if self.wakes else 0.0


def soak(
    tmp: Path,
    agents: int = AGENTS,
    seconds: float = SECONDS,
    sample_s: float = SAMPLE_S,
    runtime: str = "runc",
    state: dict | None = None,
    standin: bool = False,
    until_wakes: int | None = None,
    shape: str = "dry",
) -> Soak:
    """Serve `agents` for `seconds` (or until `until_wakes` wakes have finished);
    `state` is the agents' policy `state:` section, if not the default."""
    with contextlib.ExitStack() as stack:
        env = child_env(tmp)
        if shape == "one-call":
            api = stack.enter_context(fake_api(one_call_reply))
            env.update(WAKELOOP_DRY_RUN="false", ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY=KEY)
        return _soak(tmp, env, agents, seconds, sample_s, runtime, state, standin, until_wakes, shape)


def _soak(
    tmp: Path,
    env: dict[str, str],
    agents: int,
    seconds: float,
    sample_s: float,
    runtime: str,
    state: dict | None,
    standin: bool,
    until_wakes: int | None,
    shape: str,
) -> Soak:
    root = tmp / "agents"
    for i in range(agents):
        make_soak_agent(root / f"s{i:02d}", runtime, state, live=shape == "one-call", disk=not standin)
    before = state_bytes(root)
    result = Soak(agents, seconds)
    log = (tmp / "serve.log").open("w+")
    argv = (
        [sys.executable, "-m", "bench.soak", "--standin-child", str(root)]
        if standin
        else [sys.executable, "-m", "orchestrator", "serve", str(root), "--max-concurrent", str(MAX_CONCURRENT)]
    )
    child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    tail = WakeCount(tmp / "serve.log")
    try:
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds and child.poll() is None:
            time.sleep(min(sample_s, max(0.0, seconds - elapsed)))
            result.samples.append(sample(child.pid, time.monotonic() - started, tail))
            if until_wakes and result.samples[-1].wakes >= until_wakes:
                break
        if child.poll() is not None:
            raise SystemExit(f"soak: serve exited early ({child.returncode}): {(tmp / 'serve.log').read_text()[-800:]}")
        result.seconds = time.monotonic() - started
        child.send_signal(signal.SIGTERM)
        child.wait(STOP_GRACE_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        log.close()
    lines = (tmp / "serve.log").read_text(errors="replace").splitlines()
    result.wakes = sum(1 for line in lines if _is_wake_end(line))
    result.failures = [line[:300] for line in lines if _is_wake_end(line) and not _is_done(line)]
    result.state_bytes = state_bytes(root) - before
    result.rotated = sum(1 for _ in root.glob("*/state/events-*"))
    result.gzip_ratio = gzip_ratio(root)
    return result


def one_call_reply(rec):
    """The fake API's answer for a one-call wake: the bash call, then end_turn; no tokens billed."""
    from orchestrator.fakeapi import text, tool_use, turn, usage

    if step_of(rec.body) == 0:
        return turn(tool_use("bash", {"command": ONE_CALL}), usage=usage())
    return turn(text("Journaled; done."), usage=usage())


class WakeCount:
    """Finished wakes in serve's log, read as it grows (the log of 10,000 wakes is
    megabytes: reading it whole at every sample would cost the host more than serve)."""

    def __init__(self, log: Path):
        self.log, self.offset, self.count, self.partial = log, 0, 0, ""

    def __call__(self) -> int:
        with self.log.open(errors="replace") as f:
            f.seek(self.offset)
            chunk = f.read()
            self.offset = f.tell()
        lines = (self.partial + chunk).split("\n")
        self.partial = lines.pop()
        self.count += sum(1 for line in lines if _is_wake_end(line))
        return self.count


def gzip_ratio(root: Path) -> float:
    plain = [p.read_bytes() for p in root.glob("*/state/events.jsonl")]
    total = sum(len(b) for b in plain)
    return sum(len(gzip.compress(b)) for b in plain) / total if total else 0.0


def child_env(tmp: Path) -> dict[str, str]:
    """serve's environment: dry run, no key, the soak's own disks folder."""
    env = scrubbed_env({"WAKELOOP_DRY_RUN": "true", "WAKELOOP_DISKS": str(tmp / "disks"), "PYTHONUNBUFFERED": "1"})
    for name in (TRACE_ENV, PROBE_ENV, "MALLOC_ARENA_MAX"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def make_soak_agent(path: Path, runtime: str, state: dict | None = None, live: bool = False, disk: bool = True) -> None:
    from orchestrator.policy.agent import init_agent

    init_agent(path)
    config = path / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    sandbox = {"runtime": runtime} | ({} if disk else {"disk": "none"})
    policy = {"sandbox": sandbox} | ({"state": state} if state else {})
    data.update(schedule="1s", dry_run=not live, policy=policy)
    config.write_text(yaml.safe_dump(data))


def sample(pid: int, t: float, wakes: WakeCount) -> Sample:
    status = _proc_status(pid)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = 0
    return Sample(t, status.get("VmRSS", 0), fds, status.get("Threads", 0), wakes())


def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def _is_wake_end(line: str) -> bool:
    """serve's line for a finished wake (views.describe_receipt), or one that never started."""
    return "| receipt {" in line or ": wake not started:" in line or ": wake crashed after" in line


def _is_done(line: str) -> bool:
    return '"status":"done"' in line


def state_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.glob("*/state/**/*") if f.is_file())


def release_disks(tmp: Path) -> None:
    """Detach and delete every disk the soak made (its folder is the soak's own)."""
    from orchestrator.sandbox.containers.engine_client import connect
    from orchestrator.sandbox.disks import disk, disk_attach, disk_survey

    if not (tmp / "disks").is_dir():
        return
    saved = os.environ.get(disk.DISKS_ENV)
    os.environ[disk.DISKS_ENV] = str(tmp / "disks")  # disk.py reads its folder from here
    try:
        client = connect()
        for key in disk_survey.keys():
            disk_attach.release(client, key, delete=True, force=True)
    finally:
        if saved is None:
            os.environ.pop(disk.DISKS_ENV, None)
        else:
            os.environ[disk.DISKS_ENV] = saved


def table(s: Soak) -> str:
    rows = [("", "first quarter", "last quarter", "peak", "last/first")]
    for label, attr, scale in (("RSS (MB)", "rss_kb", 1 / 1024), ("open fds", "fds", 1), ("threads", "threads", 1)):
        rows.append(
            (
                label,
                f"{s.quarter('first', attr) * scale:.1f}",
                f"{s.quarter('last', attr) * scale:.1f}",
                f"{s.peak(attr) * scale:.1f}",
                f"{s.growth(attr):.2f}",
            )
        )
    width = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(width[i]) for i, cell in enumerate(r)).rstrip() for r in rows]
    lines += [
        f"soak: {s.agents} agents every 1s for {s.seconds:.0f}s, {len(s.samples)} samples "
        f"({len(s.warm)} after the warm-up)",
        f"wakes: {s.wakes} ({s.rate:.2f}/s)",
        f"state/ per wake: {s.bytes_per_wake:,.0f} bytes ({s.state_bytes:,} in all, "
        f"{s.rotated} rotated segments); the event log gzipped: {s.gzip_ratio:.3f} of it",
        f"failures: {len(s.failures)}",
    ]
    lines += [f"  {line}" for line in s.failures[:5]]
    return "\n".join(lines + milestones(s))


def milestones(s: Soak) -> list[str]:
    """RSS and descriptors at every MILESTONE-th wake, each against wake MILESTONE's, and the verdict."""
    base = s.at_wake(MILESTONE)
    if base is None:
        return []
    marks = [(n, m) for n in range(MILESTONE, s.wakes + 1, MILESTONE) if (m := s.at_wake(n))]
    rows = [
        "",
        "| wakes | sampled at | time | RSS MB | vs wake 1,000 | open fds | threads |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows += [
        f"| {n:,} | {m.wakes:,} | {m.t / 60:.1f} min | {m.rss_kb / 1024:.1f} | "
        f"{(m.rss_kb / base.rss_kb - 1) * 100:+.1f} % | {m.fds} | {m.threads} |"
        for n, m in marks
    ]
    after = [m for m in s.samples if m.wakes >= MILESTONE]
    worst = max(after, key=lambda m: abs(m.rss_kb / base.rss_kb - 1))
    change = worst.rss_kb / base.rss_kb - 1
    rows.append(
        f"after wake {MILESTONE:,}: RSS {min(m.rss_kb for m in after) / 1024:.1f}-"
        f"{max(m.rss_kb for m in after) / 1024:.1f} MB over {len(after)} samples; the farthest from "
        f"wake {MILESTONE:,}'s is {change * 100:+.1f} % (at wake {worst.wakes:,}): "
        + ("flat (within 5 %)" if abs(change) <= FLAT_WITHIN else "NOT within 5 %")
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=AGENTS)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--sample-s", type=float, default=SAMPLE_S)
    parser.add_argument("--runtime", default="runc")
    parser.add_argument(
        "--standin", action="store_true", help="the orchestrator alone: every call answered by a stand-in sandbox"
    )
    parser.add_argument("--until-wakes", type=int, default=None, help="stop once this many wakes finished")
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="with --standin: tracemalloc in serve, a snapshot every 500 wakes into this folder",
    )
    parser.add_argument("--trace-every", type=int, default=TRACE_EVERY, help="wakes between snapshots")
    parser.add_argument(
        "--trace-after",
        type=int,
        default=MILESTONE,
        help="--trace-diff compares the first snapshot at or after this wake with the last",
    )
    parser.add_argument(
        "--trace-diff",
        type=Path,
        default=None,
        help="print the sites that grew most between the snapshots in this folder, and exit",
    )
    parser.add_argument(
        "--probe",
        type=Path,
        default=None,
        help="with --standin: serve writes RSS, malloc's and the collector's figures to this file every 250 wakes",
    )
    parser.add_argument("--probe-every", type=int, default=PROBE_EVERY, help="wakes between probes")
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="dry",
        help="dry: the dry-run script (four calls); one-call: live on a fake API, one bash call",
    )
    args = parser.parse_args(argv)
    if args.trace_diff:
        print(trace_diff(args.trace_diff, after=args.trace_after))
        return 0
    if args.trace:
        os.environ[TRACE_ENV] = f"{args.trace.resolve()}:{args.trace_every}"  # child_env passes it on
    if args.probe:
        os.environ[PROBE_ENV] = f"{args.probe.resolve()}:{args.probe_every}"
    tmp = Path(tempfile.mkdtemp(prefix="wakeloop-soak-"))
    try:
        say(f"soak: {args.agents} agents every 1s for {args.seconds:g}s under serve ({args.shape})")
        result = soak(
            tmp,
            args.agents,
            args.seconds,
            args.sample_s,
            args.runtime,
            standin=args.standin,
            until_wakes=args.until_wakes,
            shape=args.shape,
        )
    finally:
        left = cleanup(tmp)
        release_disks(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(result))
    print(f"containers left behind (removed now): {left}")
    return 1 if result.failures else 0


def standin_child(root: str) -> int:
    """`wakeloop serve ROOT` (the CLI's own command, its scheduler, sender, console hooks and
    all), each wake's box the stand-in sandbox: nothing of serve's is left out but the engine."""
    from bench.wake_cost import StandInSandbox
    from orchestrator.cli import wakeloop
    from orchestrator.wake import loop

    loop.open_sandbox = lambda agent, **_: StandInSandbox(workspace=agent.workspace)
    if os.environ.get(TRACE_ENV):
        folder, _, every = os.environ[TRACE_ENV].rpartition(":")
        loop.wake = traced(loop.wake, Path(folder), int(every))
    if os.environ.get(PROBE_ENV):
        file, _, every = os.environ[PROBE_ENV].rpartition(":")
        loop.wake = probed(loop.wake, Path(file), int(every))
    return wakeloop.main(["serve", root, "--max-concurrent", str(MAX_CONCURRENT)])


def every_nth(wake, every: int, action):
    """`wake`, with action(n) after each `every`-th wake (n: the wakes so far, in every thread)."""
    import itertools
    import threading

    count, lock = itertools.count(1), threading.Lock()

    def run(*args, **kwargs):
        try:
            return wake(*args, **kwargs)
        finally:
            with lock:
                n = next(count)
                if n % every == 0:
                    action(n)

    return run


def traced(wake, folder: Path, every: int):
    """`wake`, with tracemalloc on and a snapshot written every `every` wakes
    (folder/snap-WAKES.pickle): what --trace-diff compares."""
    import tracemalloc

    tracemalloc.start(TRACE_FRAMES)
    folder.mkdir(parents=True, exist_ok=True)
    return every_nth(wake, every, lambda n: tracemalloc.take_snapshot().dump(str(folder / f"snap-{n:06d}.pickle")))


def probed(wake, file: Path, every: int):
    """`wake`, with a JSON line written to `file` every `every` wakes: RSS, what Python's
    allocator holds, what glibc's malloc holds (in use and free, in its heaps and mmaps), the
    collector's counts and the most numerous live types. Tells a leak (live objects grow) from
    fragmentation (RSS grows while what is in use does not)."""
    import json

    def line(n: int) -> None:
        with file.open("a") as out:
            out.write(json.dumps({"wakes": n} | memory_probe()) + "\n")

    return every_nth(wake, every, line)


def memory_probe() -> dict:
    import collections
    import ctypes
    import gc
    import threading

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks")
            + ("fordblks", "keepcost")
        ]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    objects = gc.get_objects()
    types = collections.Counter(type(o).__name__ for o in objects)
    del objects
    return {
        "rss_kb": _proc_status(os.getpid()).get("VmRSS", 0),
        "py_blocks": sys.getallocatedblocks(),
        "gc_objects": sum(types.values()),
        "gc_count": gc.get_count(),
        "gc_stats": [s["collections"] for s in gc.get_stats()],
        "malloc_heap_kb": info.arena // 1024,  # sbrk'd and arena heaps, all arenas
        "malloc_used_kb": info.uordblks // 1024,
        "malloc_free_kb": info.fordblks // 1024,
        "malloc_mmap_kb": info.hblkhd // 1024,
        "threads": threading.active_count(),
        "types": dict(types.most_common(PROBE_TYPES)),
    }


def trace_diff(folder: Path, top: int = 15, after: int = MILESTONE) -> str:
    """The allocation sites that grew most from the first snapshot at or after wake
    `after` to the last: where serve's memory goes as wakes go on."""
    import tracemalloc

    snaps = sorted(folder.glob("snap-*.pickle"))
    first = next((p for p in snaps if int(p.stem.split("-")[1]) >= after), None)
    if first is None or first == snaps[-1]:
        return f"trace: not enough snapshots in {folder} (one at or after wake {after:,}, and a later one)"
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    old = tracemalloc.Snapshot.load(str(first)).filter_traces(ignore)
    new = tracemalloc.Snapshot.load(str(snaps[-1])).filter_traces(ignore)
    total = sum(st.size for st in new.statistics("filename")) - sum(st.size for st in old.statistics("filename"))
    lines = [
        f"traced memory from {first.stem} to {snaps[-1].stem}: {total / 1024:+,.0f} KiB; "
        f"the {top} sites that grew most:"
    ]
    for stat in new.compare_to(old, "traceback")[:top]:
        frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in list(stat.traceback)[::-1][:4])
        lines.append(f"  {stat.size_diff / 1024:+8,.0f} KiB {stat.count_diff:+7,d} blocks  {frames}")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--standin-child"]:
        raise SystemExit(standin_child(sys.argv[2]))
    raise SystemExit(main())
