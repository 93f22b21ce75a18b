"""What the console, the metrics and the traces cost, and how fast the console's pages are.

    .venv/bin/python -m bench.console [--agents 100] [--wakes 1000] [--steps 60] [--views 40] [--rounds 3]
                                      [--restarts 5] [--only steps|pages]

1. Per step of a wake, each on and off (wall time, and CPU time of every
   thread of the process, which the machine's load does not inflate):
   wake_cost.orchestrator_overhead (a
   live wake against a fake API answering at once, tools answered by the
   stand-in sandbox, so what is measured is the harness's own work), in a
   fresh process per setting (metrics and a tracer provider cannot be
   turned off again in a process): off; metrics on; the console serving,
   with a person watching the running wake (its page fetched every
   LIVE_REFRESH_S, as the framed page does); traces on, exported over
   OTLP/HTTP to a local sink.
2. Page times on a root of N agents with W finished wakes each: event logs
   (a gzipped rotated segment and a live file), transcripts, ledgers with
   40 days, tasks and outboxes, all copied from one real dry-run wake (the
   stand-in sandbox again). Each page is fetched over HTTP from the console
   in this process, as a browser would: the fleet page the moment the
   console starts (its caches cold), then, once its background reading of
   every row and history is done, the fleet page, an agent's page and a
   wake's transcript. Then serve's restart: a fresh process starts a console
   on the same root and fetches the fleet page at once, `--restarts` times
   each way, interleaved: with the fleet rows and wake indexes the first
   console left on disk (console/pages.py ROWS_FILE, fleet/wake_history.py
   INDEX_FILE), and without (they are neither read nor written: as before
   they existed); and how long its background reading then takes.

Prints one table. Needs no Docker engine.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.common import say
from bench.wake_cost import StandInSandbox, orchestrator_overhead
from tests.helpers import REPO
from tests.helpers.receivers import Collector

BENCH_TOKEN = "bench-token-0123456789"  # the console token of the bench's own consoles
SETTINGS = ("off", "metrics", "console", "traces")
PAGE_BUDGET_MS = 300.0


# -- 1. per step, each on and off ------------------------------------------------------------


def one_setting(setting: str, steps: int) -> dict:
    """In this (child) process: turn `setting` on, run the overhead wake, return its numbers."""
    from orchestrator import metrics, tracing

    stop = lambda: None
    tmp = Path(tempfile.mkdtemp(prefix="wakeloop-bench-observe-"))
    try:
        if setting == "metrics":
            metrics.install()
        elif setting == "traces":
            sink = Collector()  # takes every export, keeps nothing
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.url
            assert tracing.setup(), "tracing did not start: is the otel extra installed?"
            stop = sink.close
        elif setting == "console":
            stop = _watched_console(tmp)
        orchestrator_overhead(tmp / "warm-up", 3)  # imports and first-use setup: not a step's cost
        cpu = time.process_time()
        overhead = orchestrator_overhead(tmp / "agent-root", steps)
        if setting == "traces":
            tracing.flush()  # the export's CPU is the wake's cost too
        cpu_ms = (time.process_time() - cpu) * 1000 / steps  # every thread: the exporter's, the console's
        return {"per_step": overhead.per_step.median, "p90": overhead.per_step.p90, "cpu": cpu_ms}
    finally:
        stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _watched_console(tmp: Path):
    """The console on this process, and a person watching whatever wake runs under tmp."""
    from orchestrator.console.app import LIVE_REFRESH_S, Console, start
    from orchestrator.console.auth import Access

    console = Console(tmp, Access(BENCH_TOKEN, loopback=True))
    listening = start(console, "127.0.0.1", 0)
    console.warmed.wait(timeout=60)
    done = threading.Event()

    def watch():  # the agent (tmp/agent-root) appears once the wake is under way
        while not done.wait(LIVE_REFRESH_S):
            for path in tmp.glob("*/state/transcripts/*.jsonl"):
                _get(f"{listening.url}agents/{path.parents[2].name}/wakes/{path.stem}")
            _get(listening.url)

    threading.Thread(target=watch, daemon=True).start()
    return lambda: (done.set(), listening.stop())


def per_step(steps: int, rounds: int) -> dict[str, dict]:
    """Each setting `rounds` times, the settings interleaved (a shared machine's load drifts);
    the median of each round's median, and of its p90."""
    runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for r in range(rounds):
        for setting in SETTINGS:
            say(f"per step: {setting}, round {r + 1} of {rounds}")
            child = subprocess.run(
                [sys.executable, "-m", "bench.console", "--one", setting, "--steps", str(steps)],
                capture_output=True,
                text=True,
                timeout=600,
                cwd=REPO,
            )
            if child.returncode != 0:
                raise SystemExit(f"the {setting} run failed:\n{child.stderr[-2000:]}")
            runs[setting].append(json.loads(child.stdout.strip().splitlines()[-1]))
    return {s: {k: statistics.median(r[k] for r in got) for k in ("per_step", "p90", "cpu")} for s, got in runs.items()}


# -- 2. a big root ---------------------------------------------------------------------------


def template_wake(tmp: Path):
    """One real dry-run wake (scripted model, stand-in sandbox): its events and transcript."""
    from bench.common import bench_agent
    from orchestrator.wake.loop import wake

    agent = bench_agent(tmp / "template", {})
    receipt = wake(agent, live=False, sandbox=StandInSandbox(output="hello from the box\n", workspace=agent.workspace))
    sd = agent.state_dir
    events = [
        line for line in (sd / "events.jsonl").read_text().splitlines() if json.loads(line)["run_id"] == receipt.run_id
    ]
    transcript = (sd / "transcripts" / f"{receipt.run_id}.jsonl").read_text()
    return receipt, events, transcript, sd / "transcripts" / "prompts"


def build_root(root: Path, agents: int, wakes: int) -> None:
    from orchestrator.policy.agent import init_agent

    receipt, events, transcript, prompts = template_wake(root.parent)
    day0 = receipt.started_at[:10]
    now = datetime.now(UTC)
    rnd = random.Random(7)
    for a in range(agents):
        path = root / f"agent-{a:03d}"
        init_agent(path)
        sd = path / "state"
        (sd / "transcripts").mkdir(parents=True, exist_ok=True)
        shutil.copytree(prompts, sd / "transcripts" / "prompts", dirs_exist_ok=True)
        lines = []
        for w in range(wakes):
            run = f"{a:04x}{w:08x}"
            day = (now - timedelta(days=(wakes - w) * 40 // wakes)).strftime("%Y-%m-%d")
            text = "\n".join(events).replace(receipt.run_id, run).replace(day0, day)
            lines.append(text.replace(f'"wake": {receipt.wake}', f'"wake": {w + 1}'))
            # a copy each: a transcript with another name (a hard link) is refused (safeio/folder.py)
            (sd / "transcripts" / f"{run}.jsonl").write_text(transcript.replace(receipt.run_id, run))
        cut = len(lines) * 6 // 10  # the older 60% rotated and gzipped, as retention leaves them
        stamp = now.strftime("%Y%m%dT%H%M%S000000Z")
        with gzip.open(sd / f"events-{stamp}.jsonl.gz", "wt") as f:
            f.write("\n".join(lines[:cut]) + "\n")
        (sd / "events.jsonl").write_text("\n".join(lines[cut:]) + "\n")
        last = json.loads(receipt.to_json()) | {"wake": wakes}
        (sd / "state.json").write_text(json.dumps({"wake": wakes, "tokens_lifetime": 0, "last_receipt": last}))
        days = {
            (now - timedelta(days=d)).strftime("%Y-%m-%d"): {
                "usd": round(rnd.random(), 4),
                "tokens": 1000,
                "calls": 10,
                "unpriced": 0,
            }
            for d in range(40)
        }
        (sd / "ledger.json").write_text(json.dumps({"version": 1, "days": days, "lifetime": {"usd": 20.0}}))
        (sd / "outbox.txt").write_text(
            "".join(f"--- 2026-11-{d:02d} wake {d}\n  a note from the agent\n" for d in range(1, 20))
        )


def page_times(
    tmp: Path, agents: int, wakes: int, views: int, restarts: int
) -> tuple[dict[str, tuple[list, list]], dict[str, list[float]]]:
    from orchestrator.console.app import Console, start
    from orchestrator.console.auth import Access

    root = tmp / "root"
    say(f"building a root of {agents} agents x {wakes} wakes")
    started = time.monotonic()
    build_root(root, agents, wakes)
    say(f"built in {time.monotonic() - started:.0f}s; timing pages")
    console = Console(root, Access(BENCH_TOKEN, loopback=True))
    started = time.perf_counter()
    listening = start(console, "127.0.0.1", 0)
    url = listening.url
    rnd = random.Random(11)
    names = sorted(p.name for p in root.iterdir())
    out: dict[str, list[float]] = {
        "fleet, the first view at start": [],
        "fleet": [],
        "agent": [],
        "wake transcript": [],
    }
    cpu: dict[str, list[float]] = {k: [] for k in out}
    try:
        out["fleet, the first view at start"].append(_get(url, cpu["fleet, the first view at start"]))
        console.warmed.wait(timeout=600)
        warm_s = time.perf_counter() - started
        for _ in range(views):
            out["fleet"].append(_get(url, cpu["fleet"]))
            name = rnd.choice(names)
            out["agent"].append(_get(f"{url}agents/{name}", cpu["agent"]))
            run = f"{int(name[-3:]):04x}{rnd.randrange(wakes):08x}"
            out["wake transcript"].append(_get(f"{url}agents/{name}/wakes/{run}", cpu["wake transcript"]))
    finally:
        listening.stop()
    warm = {"at the first start": [warm_s]}
    for r in range(restarts):
        for kept, name in (
            (False, "after a restart, nothing kept (as before)"),
            (True, "after a restart, rows and indexes kept on disk"),
        ):
            say(f"restart {r + 1} of {restarts}: {name}")
            child = subprocess.run(
                [sys.executable, "-m", "bench.console", "--restart", str(root), "--kept", str(int(kept))],
                capture_output=True,
                text=True,
                timeout=900,
                cwd=REPO,
            )
            if child.returncode != 0:
                raise SystemExit(f"the restart failed:\n{child.stderr[-2000:]}")
            got = json.loads(child.stdout.strip().splitlines()[-1])
            out.setdefault(f"fleet, the first view {name}", []).append(got["ms"])
            cpu.setdefault(f"fleet, the first view {name}", []).append(got["cpu_ms"])
            warm.setdefault(name, []).append(got["warm_s"])
    return {k: (v, cpu[k]) for k, v in out.items()}, warm


def one_restart(root: Path, kept: bool) -> dict:
    """In this (child) process: a console started on a root another console has warmed, its
    first fleet view timed. Without `kept` the rows and indexes on disk are neither read nor
    written (the console as it was before it kept them)."""
    from orchestrator.console import pages
    from orchestrator.console.app import Console, start
    from orchestrator.console.auth import Access
    from orchestrator.fleet import wake_history

    if not kept:
        pages.RowCache.load = lambda self, paths: 0
        pages.RowCache.save = lambda self: None
        wake_history.load_index = lambda state_dir, paths: {}
        wake_history.save_index = lambda state_dir, text: None
    console = Console(root, Access(BENCH_TOKEN, loopback=True))
    started = time.perf_counter()
    listening = start(console, "127.0.0.1", 0)
    try:
        cpu: list[float] = []
        ms = _get(listening.url, cpu)
        console.warmed.wait(timeout=600)
        return {"ms": ms, "cpu_ms": cpu[0], "warm_s": time.perf_counter() - started}
    finally:
        listening.stop()


def _get(url: str, cpu: list[float] | None = None) -> float:
    """Wall ms of one page; its CPU ms (this process: the server's thread and the client) go to `cpu`.
    On a shared machine the wall time is the load's as much as ours; the CPU time is ours."""
    started, cpu_started = time.perf_counter(), time.process_time()
    # With the token: reading needs it, on loopback too (without it, urllib would time the login page).
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {BENCH_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        r.read()
        assert r.status == 200 and r.url == url, f"{url}: {r.status} at {r.url}"
    if cpu is not None:
        cpu.append((time.process_time() - cpu_started) * 1000)
    return (time.perf_counter() - started) * 1000


def p50_p95(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), statistics.quantiles(samples, n=20)[-1]


def table(steps: dict, pages: dict, warm: dict, agents: int, wakes: int) -> str:
    rows = []
    if steps:
        rows.append(("per step of a wake (wall median / p90)", "", "CPU per step, all threads"))
    base = steps.get("off")
    for setting in SETTINGS if steps else ():
        s = steps[setting]
        extra = f"{s['cpu']:.2f} ms" + (
            ""
            if setting == "off"
            else f" ({s['cpu'] - base['cpu']:+.2f} ms; wall {s['per_step'] - base['per_step']:+.2f} ms)"
        )
        rows.append((f"  {setting}", f"{s['per_step']:.2f} / {s['p90']:.2f} ms", extra))
    if pages:
        rows.append(
            (
                f"page time, {agents} agents x {wakes:,} wakes (p50 / p95)",
                "",
                f"CPU p50; wall p95 against {PAGE_BUDGET_MS:.0f} ms",
            )
        )
    for name, (samples, cpu) in pages.items():
        p50, p95 = p50_p95(samples) if len(samples) > 1 else (samples[0], samples[0])
        rows.append(
            (
                f"  {name}",
                f"{p50:.1f} / {p95:.1f} ms",
                f"{statistics.median(cpu):.1f} ms CPU; {'ok' if p95 < PAGE_BUDGET_MS else 'OVER'}",
            )
        )
    if pages:
        rows.append(("every fleet row and history read, in the background (median)", "", ""))
    for name, seconds in warm.items():
        rows.append((f"  {name}", f"{statistics.median(seconds):.1f} s after start", ""))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b:<20} {c}".rstrip() for a, b, c in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--wakes", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=60, help="model steps in each per-step wake")
    parser.add_argument("--views", type=int, default=40, help="fetches of each page")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each per-step setting")
    parser.add_argument("--only", choices=("steps", "pages"), help="one of the two measurements")
    parser.add_argument("--restarts", type=int, default=5, help="restarts timed each way")
    parser.add_argument("--one", choices=SETTINGS, help=argparse.SUPPRESS)  # the child of per_step
    parser.add_argument("--restart", type=Path, help=argparse.SUPPRESS)  # the child of page_times
    parser.add_argument("--kept", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.restart:
        print(json.dumps(one_restart(args.restart, bool(args.kept))))
        return 0
    if args.one:
        print(json.dumps(one_setting(args.one, args.steps)))
        return 0
    steps = per_step(args.steps, args.rounds) if args.only != "pages" else {}
    pages, warm = {}, {}
    if args.only != "steps":
        tmp = Path(tempfile.mkdtemp(prefix="wakeloop-bench-console-"))
        try:
            pages, warm = page_times(tmp, args.agents, args.wakes, args.views, args.restarts)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(table(steps, pages, warm, args.agents, args.wakes))
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores when done)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
