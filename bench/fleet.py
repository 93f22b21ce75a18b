"""A fleet due at once under `wakeloop serve`, in-process and via the broker: how cost grows with N.

    .venv/bin/python -m bench.fleet [--agents 10,50,100,200] [--modes inproc,broker]
                                    [--disk-rows inproc:50] [--code PATH --label before]
                                    [--max-concurrent K] [--pace 1.0] [--rate-calls 32]

Each row: N agents, all due at once (`every: 1h`, never woken), each wake
five model turns (the fake API answers after --pace, PACE_S) and four tool calls
(three bash, one write_file), then the harness's journal stub (a fifth call).
`serve` is the CLI, a child process, run as an operator would (its own
choice of K unless --max-concurrent); via the broker, a `wakeloop broker`
child holds the engine and serve talks to its socket. Workspaces are plain
folders (`sandbox.disk: none`) except in --disk-rows, where each agent gets
its loop-device disk, as by default.

Per row, all measured in this run:
- wall time: serve's first line (every agent due) to the last wake_finished;
- engine-bound time: calls served / the engine's own create-start-remove rate
  (sandbox/rate.py: cold calls of `true`, same image and flags, 2 per core
  at once), measured just before the row;
- model-bound time: turns x PACE_S for each of ceil(N / K) rounds of K wakes
  (and 5 s with no limit on K);
- containers created per call served (the engine's own event stream);
- scheduler lag, due to started (wake_started events), p50 and p99;
- peak RSS (VmHWM) of serve and of the broker; peak live sandbox containers;
- failures: any wake not `done`, and calls that timed out.

`--code PATH` runs serve and the broker from another checkout (the commit
before, for side-by-side figures); this process (the fake API, the rate, the
counting) always runs from this one.

Not here: one call's cost (per_call.py), the older 20-agent scale row (scale.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.common import KEY, Script, bench_agent, cleanup, fake_api, own_disks, say
from bench.scale import SCALE_TOOL_STEPS, scale_tools
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.sandbox import rate
from orchestrator.sandbox.engine import LABEL, connect
from tests.helpers import REPO, scrubbed_env

PACE_S = 1.0                # the fake model's answer time (issue 14)
TURNS = SCALE_TOOL_STEPS + 1
RATE_CALLS = 32             # cold calls measuring the engine's rate before each row (--rate-calls)
RATE_PARALLEL_PER_CORE = 2  # as serve's own measurement (fleet/capacity.py)
ROW_TIMEOUT_S = 1800        # a row gives up after this
POLL_S = 0.5                # how often the parent looks for finished wakes and RSS
START_S = 120               # serve's first line (it measures the engine first) / the broker's socket


@dataclass
class Row:
    label: str
    mode: str
    agents: int
    disk: bool
    k: int
    wall_s: float
    engine_rate: float
    calls: int
    created: int
    peak_live: int
    lag_p50: float
    lag_p99: float
    serve_mb: float
    broker_mb: float
    failures: int
    load: str

    @property
    def engine_s(self) -> float:
        return self.calls / self.engine_rate

    pace_s: float = PACE_S

    @property
    def model_s(self) -> float:
        return math.ceil(self.agents / self.k) * TURNS * self.pace_s

    def cells(self) -> list[str]:
        bound = max(self.engine_s, self.model_s)
        return [self.label, self.mode + (" (disks)" if self.disk else ""), str(self.agents), str(self.k),
                f"{self.wall_s:.1f} s ({self.wall_s / bound:.2f}x)",
                f"{self.engine_s:.1f} s ({self.engine_rate:.2f}/s)", f"{self.model_s:.0f} s",
                f"{self.created / self.calls:.3f} ({self.created}/{self.calls})",
                f"{self.lag_p50:.1f} / {self.lag_p99:.1f} s",
                f"{self.serve_mb:.0f}" + (f" / {self.broker_mb:.0f}" if self.mode == "broker" else ""),
                str(self.peak_live), str(self.failures), self.load]


HEADER = ["code", "mode", "agents", "K", "wall (x bound)", "engine-bound (rate)", "model-bound",
          "containers / call", "lag p50 / p99", "peak RSS MB serve / broker", "peak live", "failures",
          "load 1-min"]


class Engine:
    """The engine's own account of our containers, from its live event stream: creates
    under ROOT, and the most alive at once. The stream is in order, so a marker
    container seen means every earlier event was."""

    def __init__(self, root: Path):
        self.client, self.root = connect(), str(root) + "/"
        self.marker = str(root) + "/.marker"
        self.created = self.live = self.peak = 0
        self.done = threading.Event()
        self._stream = self.client.events(decode=True, filters={
            "type": "container", "event": ["create", "destroy"], "label": f"{LABEL}=1"})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for event in self._stream:
            where = event["Actor"]["Attributes"].get("wakeloop.workspace", "")
            if where == self.marker:
                self.done.set()
                return
            if where.startswith(self.root):
                step = 1 if event["Action"] == "create" else -1
                self.created += step > 0
                self.live += step
                self.peak = max(self.peak, self.live)

    def close(self) -> None:
        image = self.client.images.list()[0].id
        cid = self.client.api.create_container(image, labels={LABEL: "1", "wakeloop.workspace": self.marker})["Id"]
        self.client.api.remove_container(cid, force=True)
        if not self.done.wait(60):
            say("fleet: the engine's event for the marker never came; counts may be short")
        self._stream.close()


def hwm_mb(pid: int) -> float:
    """A process's peak RSS (VmHWM), in MB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def child_env(code: Path, extra: dict) -> dict:
    """No key or broker of the machine's; the bench's disks (common.own_disks); `code`'s orchestrator."""
    return scrubbed_env({"PYTHONPATH": str(code), **extra})


def start_broker(code: Path, root: Path, sock: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "broker", str(root), "--socket", str(sock)],
                            cwd=code, env=child_env(code, {}), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_S
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"bench: the broker did not start (exit {proc.poll()})")
        time.sleep(0.1)
    return proc


def finished(agents: list[Path]) -> int:
    return sum(1 for a in agents if any(e.type == "wake_finished"
                                        for e in read_events(a / "state" / EVENTS_FILE)))


@dataclass(frozen=True)
class Plan:
    code: Path
    label: str
    k: int | None
    pace_s: float
    rate_calls: int


def run_row(tmp: Path, plan: Plan, mode: str, n: int, disk: bool) -> Row:
    code, label, k = plan.code, plan.label, plan.k
    root = tmp / f"{label}-{mode}-{n}" / "agents"
    policy = {"sandbox": {} if disk else {"disk": "none"}}
    agents = [bench_agent(root / f"a{i:03d}", policy, schedule="1h").dir for i in range(n)]
    client = connect()
    say(f"fleet {label} {mode} {n}: the engine's rate ({plan.rate_calls} cold calls)")
    measured = rate.measure(client, bench_agent(root.parent / "rate", policy).policy.sandbox,
                            plan.rate_calls, RATE_PARALLEL_PER_CORE * (os.cpu_count() or 1))
    shutil.rmtree(root.parent / "rate")
    load0 = os.getloadavg()[0]
    engine, broker, sock = Engine(root), None, None
    extra = {}
    if mode == "broker":
        sock = Path(tempfile.mkdtemp(prefix="wlf-")) / "broker.sock"
        broker = start_broker(code, root, sock)
        extra["WAKELOOP_BROKER"] = str(sock)
    api = fake_api(Script(scale_tools, SCALE_TOOL_STEPS, plan.pace_s))
    with api:
        extra.update(ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY=KEY)
        serve = subprocess.Popen([sys.executable, "-m", "orchestrator", "serve", str(root),
                                  *(["--max-concurrent", str(k)] if k else [])],
                                 cwd=code, env=child_env(code, extra), stdout=subprocess.PIPE, text=True)
        first = serve.stdout.readline()
        due = time.time()
        say(f"fleet {label} {mode} {n}: {first.strip()[:300]}")
        threading.Thread(target=serve.stdout.read, daemon=True).start()   # drain: never block serve
        serve_mb = broker_mb = 0.0
        deadline = time.monotonic() + ROW_TIMEOUT_S
        peaks = lambda: (max(serve_mb, hwm_mb(serve.pid)), max(broker_mb, hwm_mb(broker.pid) if broker else 0))
        while finished(agents) < n and time.monotonic() < deadline and serve.poll() is None:
            serve_mb, broker_mb = peaks()
            time.sleep(POLL_S)
        serve_mb, broker_mb = peaks()
        serve.send_signal(signal.SIGTERM)
        serve.wait(120)
    if broker:
        broker.send_signal(signal.SIGTERM)
        broker.wait(120)
        shutil.rmtree(sock.parent, ignore_errors=True)
    engine.close()
    row = summarize(label, mode, n, disk, agents, due, first, k, measured.per_s, engine,
                    serve_mb, broker_mb, f"{load0:.1f} -> {os.getloadavg()[0]:.1f}")
    row.pace_s = plan.pace_s
    return row


def summarize(label, mode, n, disk, agents, due, first, k, engine_rate, engine, serve_mb, broker_mb,
              load) -> Row:
    lags, ends, calls, failures = [], [], 0, 0
    for a in agents:
        events = list(read_events(a / "state" / EVENTS_FILE))
        for e in events:
            t = datetime.fromisoformat(e.timestamp.replace("Z", "+00:00")).timestamp()
            if e.type == "wake_started":
                lags.append(t - due)
            elif e.type == "wake_finished":
                ends.append(t)
                failures += e.data.get("status") != "done"
            elif e.type == "tool_result" and e.data.get("container_id"):
                calls += 1
                failures += bool(e.data.get("timed_out"))
            elif e.type == "journal_stub" and e.data.get("written"):
                calls += 1
        failures += not any(e.type == "wake_finished" for e in events)
    lags.sort()
    return Row(label, mode, n, disk, k or chosen_k(first), (max(ends) - due) if ends else float("nan"),
               engine_rate, max(calls, 1), engine.created, engine.peak,
               statistics.median(lags) if lags else float("nan"),
               lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else float("nan"),
               serve_mb, broker_mb, failures, load)


def chosen_k(first_line: str) -> int:
    """K from serve's first line: 'at most K wake(s) at once'."""
    words = first_line.split("at most ", 1)[1].split()
    return int(words[0])


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", default="10,50,100,200")
    ap.add_argument("--modes", default="inproc,broker")
    ap.add_argument("--disk-rows", default="", help="mode:N rows with each agent's disk on, e.g. inproc:50")
    ap.add_argument("--code", type=Path, default=REPO, help="the checkout serve and the broker run from")
    ap.add_argument("--label", default="after")
    ap.add_argument("--max-concurrent", type=int, default=None, help="passed to serve (default: its own choice)")
    ap.add_argument("--pace", type=float, default=PACE_S, help="the fake model's answer time, seconds")
    ap.add_argument("--rate-calls", type=int, default=RATE_CALLS, help="cold calls measuring the engine's rate")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    disk_rows = {tuple(r.split(":")) for r in args.disk_rows.split(",") if r}
    plan = [(m, int(n), False) for m in args.modes.split(",") for n in args.agents.split(",") if n]
    plan += [(m, int(n), True) for m, n in sorted(disk_rows)]
    run = Plan(args.code.resolve(), args.label, args.max_concurrent, args.pace, args.rate_calls)
    tmp = Path(tempfile.mkdtemp(prefix="wakeloop-fleet-"))
    own_disks(tmp)
    rows = []
    try:
        for mode, n, disk in plan:
            rows.append(run_row(tmp, run, mode, n, disk))
            say("fleet: " + " | ".join(rows[-1].cells()))
            cleanup(tmp)
    finally:
        gone = cleanup(tmp)
        if gone:
            say(f"fleet: removed {gone} container(s) left behind")
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return 1 if any(r.failures for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
