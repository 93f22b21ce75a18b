"""A soak: N dry-run agents waking every second under one `wakeloop serve` for a while.

    .venv/bin/python -m bench.soak [--agents 20] [--seconds 600] [--sample-s 5]
    .venv/bin/python -m bench.soak --standin --agents 50 --until-wakes 10000

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

from bench.common import cleanup, say
from tests.helpers import REPO, scrubbed_env

AGENTS = 20                 # agents under one serve, each due every second
SECONDS = 600               # how long serve runs: about ten minutes here, with the set-up
SAMPLE_S = 5.0              # how often the child's RSS, descriptors and threads are read
MAX_CONCURRENT = 4          # serve's default K
STOP_GRACE_S = 90           # after SIGTERM, how long serve gets to end its wakes cleanly


@dataclass(frozen=True)
class Sample:
    t: float                # seconds since serve started
    rss_kb: int
    fds: int
    threads: int
    wakes: int              # wakes finished so far, from serve's own lines


@dataclass
class Soak:
    agents: int
    seconds: float
    samples: list[Sample] = field(default_factory=list)
    wakes: int = 0
    failures: list[str] = field(default_factory=list)
    state_bytes: int = 0    # all agents' state/ at the end, less what init left
    rotated: int = 0        # rotated segments under the agents' state/ at the end
    gzip_ratio: float = 0.0     # the live event logs' size gzipped over plain: what rotation keeps

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


def soak(tmp: Path, agents: int = AGENTS, seconds: float = SECONDS, sample_s: float = SAMPLE_S,
         runtime: str = "runc", state: dict | None = None, standin: bool = False,
         until_wakes: int | None = None) -> Soak:
    """Serve `agents` for `seconds` (or until `until_wakes` wakes have finished);
    `state` is the agents' policy `state:` section, if not the default."""
    root = tmp / "agents"
    env = child_env(tmp)
    for i in range(agents):
        make_soak_agent(root / f"s{i:02d}", runtime, state)
    before = state_bytes(root)
    result = Soak(agents, seconds)
    log = (tmp / "serve.log").open("w+")
    argv = ([sys.executable, "-m", "bench.soak", "--standin-child", str(root)] if standin
            else [sys.executable, "-m", "orchestrator", "serve", str(root), "--max-concurrent", str(MAX_CONCURRENT)])
    child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    try:
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds and child.poll() is None:
            time.sleep(min(sample_s, max(0.0, seconds - elapsed)))
            result.samples.append(sample(child.pid, time.monotonic() - started, tmp / "serve.log"))
            if until_wakes and result.samples[-1].wakes >= until_wakes:
                break
        if child.poll() is not None:
            raise SystemExit(f"soak: serve exited early ({child.returncode}): "
                             f"{(tmp / 'serve.log').read_text()[-800:]}")
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


def gzip_ratio(root: Path) -> float:
    plain = [p.read_bytes() for p in root.glob("*/state/events.jsonl")]
    total = sum(len(b) for b in plain)
    return sum(len(gzip.compress(b)) for b in plain) / total if total else 0.0


def child_env(tmp: Path) -> dict[str, str]:
    """serve's environment: dry run, no key, the soak's own disks folder."""
    return scrubbed_env({"WAKELOOP_DRY_RUN": "true", "WAKELOOP_DISKS": str(tmp / "disks"), "PYTHONUNBUFFERED": "1"})


def make_soak_agent(path: Path, runtime: str, state: dict | None = None) -> None:
    from orchestrator.policy.agent import init_agent
    init_agent(path)
    config = path / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    policy = {"sandbox": {"runtime": runtime}} | ({"state": state} if state else {})
    data.update(schedule="1s", dry_run=True, policy=policy)
    config.write_text(yaml.safe_dump(data))


def sample(pid: int, t: float, log: Path) -> Sample:
    status = _proc_status(pid)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = 0
    wakes = sum(1 for line in log.read_text(errors="replace").splitlines() if _is_wake_end(line))
    return Sample(t, status.get("VmRSS", 0), fds, status.get("Threads", 0), wakes)


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
    from orchestrator.sandbox import disk
    from orchestrator.sandbox.engine import connect
    if not (tmp / "disks").is_dir():
        return
    saved = os.environ.get(disk.DISKS_ENV)
    os.environ[disk.DISKS_ENV] = str(tmp / "disks")   # disk.py reads its folder from here
    try:
        client = connect()
        for key in disk.keys():
            disk.release(client, key, delete=True, force=True)
    finally:
        if saved is None:
            os.environ.pop(disk.DISKS_ENV, None)
        else:
            os.environ[disk.DISKS_ENV] = saved


def table(s: Soak) -> str:
    rows = [("", "first quarter", "last quarter", "peak", "last/first")]
    for label, attr, scale in (("RSS (MB)", "rss_kb", 1 / 1024), ("open fds", "fds", 1),
                               ("threads", "threads", 1)):
        rows.append((label, f"{s.quarter('first', attr) * scale:.1f}", f"{s.quarter('last', attr) * scale:.1f}",
                     f"{s.peak(attr) * scale:.1f}", f"{s.growth(attr):.2f}"))
    width = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(width[i]) for i, cell in enumerate(r)).rstrip() for r in rows]
    lines += [f"soak: {s.agents} agents every 1s for {s.seconds:.0f}s, {len(s.samples)} samples "
              f"({len(s.warm)} after the warm-up)",
              f"wakes: {s.wakes} ({s.rate:.2f}/s)",
              f"state/ per wake: {s.bytes_per_wake:,.0f} bytes ({s.state_bytes:,} in all, "
              f"{s.rotated} rotated segments); the event log gzipped: {s.gzip_ratio:.3f} of it",
              f"failures: {len(s.failures)}"]
    marks = [(n, s.at_wake(n)) for n in (1_000, 10_000) if s.at_wake(n)]
    lines += [f"RSS at wake {n:,}: {m.rss_kb / 1024:.1f} MB (sample at {m.wakes:,})" for n, m in marks]
    lines += [f"  {line}" for line in s.failures[:5]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=AGENTS)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--sample-s", type=float, default=SAMPLE_S)
    parser.add_argument("--runtime", default="runc")
    parser.add_argument("--standin", action="store_true",
                        help="the orchestrator alone: every call answered by a stand-in sandbox")
    parser.add_argument("--until-wakes", type=int, default=None, help="stop once this many wakes finished")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="wakeloop-soak-"))
    try:
        say(f"soak: {args.agents} agents every 1s for {args.seconds:g}s under serve")
        result = soak(tmp, args.agents, args.seconds, args.sample_s, args.runtime,
                      standin=args.standin, until_wakes=args.until_wakes)
    finally:
        left = cleanup(tmp)
        release_disks(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(result))
    print(f"containers left behind (removed now): {left}")
    return 1 if result.failures else 0


def standin_child(root: str) -> int:
    """serve's Scheduler, each wake's calls answered by the stand-in sandbox; until SIGTERM."""
    import threading
    from orchestrator.fleet.scheduler import Scheduler
    from orchestrator.wake.loop import wake
    from bench.wake_cost import StandInSandbox
    scheduler = Scheduler(Path(root), MAX_CONCURRENT,
                          wake_fn=lambda agent, stop: wake(agent, stop=stop,
                                                           sandbox=StandInSandbox(workspace=agent.workspace)))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=scheduler.request_stop).start())
    return scheduler.run()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--standin-child"]:
        raise SystemExit(standin_child(sys.argv[2]))
    raise SystemExit(main())
