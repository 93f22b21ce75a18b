"""A fleet due at once under `wakeloop serve`, in-process and via the broker: is it at its bound?

    .venv/bin/python -m bench.fleet [--agents 10,50,100,200] [--modes inprocess,broker]
                                    [--folders] [--code PATH --label before]
                                    [--max-concurrent K] [--pace 1.0] [--rate-calls 32]

Each row: N agents, all due at once (`every: 1h`, never woken), each wake
five model turns (the fake API answers after --pace, PACE_S) and four tool calls
(three bash, one write_file), then the harness's journal stub (a fifth call).
Every agent has the default policy (`policy: {}`), so each gets its own thin
disk (disk.py), made and attached at its first wake as an operator's first
`serve` would. `serve` is the CLI, a child process, run as an operator would
(its own choice of K unless --max-concurrent); via the broker (`broker`), a
`wakeloop broker` child on a unix socket holds the engine and the disks, and
serve talks to its socket. --folders gives the agents `sandbox.disk: none`
instead (plain folders, the older rows).

Per row, all measured in this run:
- wall time: serve's first line (every agent due) to the last wake_finished;
- engine-bound time: calls served / the engine's own create-start-remove rate
  (sandbox/rate.py: cold calls of `true`, same image and flags), measured just
  after the row with K calls in flight, K being serve's own for the row;
- with --bucket CAPACITY,PER_S, the fake API enforces a requests limit (a token bucket: 429 with
  retry-after-ms past it) and the time that limit allows the row's requests is a third bound;
- model-bound time: the model's time per wake, as the fake API held each
  request (five turns of --pace), for each of ceil(N / K) rounds of K wakes:
  with K at once, no schedule of N equal wakes ends sooner;
- wall / the larger bound, and the verdict against MAX_X_BOUND (issue 26: 1.2x);
- containers created per call served (the engine's own event stream; issue 26: 1.00);
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

import yaml

from bench.common import KEY, Script, cleanup, fake_api, own_disks, say
from bench.scale import SCALE_TOOL_STEPS, scale_tools
from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.sandbox import rate
from orchestrator.sandbox.containers.engine_client import connect
from orchestrator.sandbox.engine import LABEL
from tests.helpers import REPO, scrubbed_env

PACE_S = 1.0  # the fake model's answer time (issue 14)
TURNS = SCALE_TOOL_STEPS + 1
RATE_CALLS = 32  # cold calls measuring the engine's rate before each row (--rate-calls)
MAX_X_BOUND = 1.2  # issue 26: wall at most this many times the larger bound
MODES = {"inproc": "inproc", "inprocess": "inproc", "broker": "broker"}
ROW_TIMEOUT_S = 1800  # a row gives up after this
POLL_S = 1.0  # how often the parent looks for finished wakes and RSS (the wall is
# taken from the events' own timestamps, not from this)
START_S = 120  # serve's first line (it measures the engine first) / the broker's socket


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
    model_per_wake_s: float = TURNS * PACE_S  # the fake API's hold, summed over a wake's turns
    limit_s: float = 0.0  # --bucket: the time the fake's requests limit allows the row's requests
    refused: int = 0  # --bucket: requests the fake answered 429

    @property
    def engine_s(self) -> float:
        return self.calls / self.engine_rate

    @property
    def model_s(self) -> float:
        return math.ceil(self.agents / self.k) * self.model_per_wake_s

    @property
    def x_bound(self) -> float:
        return self.wall_s / max(self.engine_s, self.model_s, self.limit_s)

    @property
    def verdict(self) -> str:
        ok = self.x_bound <= MAX_X_BOUND and round(self.created / self.calls, 2) <= 1.0 and not self.failures
        return "ok" if ok else "MISS"

    def cells(self) -> list[str]:
        return [
            self.label,
            self.mode + ("" if self.disk else " (folders)"),
            str(self.agents),
            str(self.k),
            f"{self.wall_s:.1f} s",
            f"{self.engine_s:.1f} s ({self.engine_rate:.2f}/s)",
            f"{self.model_s:.1f} s"
            + (f"; API limit {self.limit_s:.1f} s, {self.refused} 429s" if self.limit_s else ""),
            f"{self.x_bound:.2f}x",
            f"{self.created / self.calls:.2f} ({self.created}/{self.calls})",
            f"{self.lag_p50:.1f} / {self.lag_p99:.1f} s",
            f"{self.serve_mb:.0f}" + (f" / {self.broker_mb:.0f}" if self.mode == "broker" else ""),
            str(self.peak_live),
            str(self.failures),
            self.load,
            self.verdict,
        ]


HEADER = [
    "code",
    "mode",
    "agents",
    "K",
    "wall",
    "engine bound (rate at K)",
    "model bound (--bucket: and the API's limit)",
    "wall / bound",
    "containers / call",
    "lag p50 / p99",
    "peak RSS MB serve / broker",
    "peak live",
    "failures",
    "load 1-min",
    f"<= {MAX_X_BOUND}x",
]


class Engine:
    """The engine's own account of our containers, from its live event stream: creates
    under ROOT, and the most alive at once. The stream is in order, so a marker
    container seen means every earlier event was."""

    def __init__(self, root: Path):
        self.client, self.root = connect(), str(root) + "/"
        self.marker = str(root) + "/.marker"
        self.created = self.live = self.peak = 0
        self.done = threading.Event()
        self._stream = self.client.events(
            decode=True, filters={"type": "container", "event": ["create", "destroy"], "label": f"{LABEL}=1"}
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for event in self._stream:
            where = event["Actor"]["Attributes"].get("wakeloop.workspace", "")
            if where == self.marker:
                self.done.set()
                return
            if where.startswith(self.root) and not where.startswith(self.root + ".wakeloop-rate-"):
                # (the broker's rate measurement, under ROOT since it runs in a container: no agent's call)
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


CHILDREN: list[subprocess.Popen] = []  # serve and the broker of the row running: ended on any exit


def spawn(argv: list[str], **kw) -> subprocess.Popen:
    proc = subprocess.Popen(argv, **kw)
    CHILDREN.append(proc)
    return proc


def end_children() -> None:
    """SIGTERM each child still running (serve first: it ends its wakes, then the broker
    lets go of the disks), then SIGKILL what has not exited in time."""
    for proc in reversed(CHILDREN):  # serve was started after the broker
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    CHILDREN.clear()


def start_broker(code: Path, root: Path, sock: Path) -> subprocess.Popen:
    proc = spawn(
        [sys.executable, "-m", "orchestrator", "broker", str(root), "--socket", str(sock)],
        cwd=code,
        env=child_env(code, {}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + START_S
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"bench: the broker did not start (exit {proc.poll()})")
        time.sleep(0.1)
    return proc


def drain(stream, logs: Path | None, name: str) -> None:
    """Read serve's output as it comes (never block serve), into logs/serve-NAME.log if asked."""
    if logs is None:
        stream.read()
        return
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / f"serve-{name}.log").open("w") as out:
        for line in stream:
            out.write(f"{time.time():.3f} {line}")


class Finished:
    """How many agents have finished their wake, from the tail of each one's event log:
    this process shares two cores with serve, so it never parses 200 whole logs a poll."""

    TAIL = 4096  # bytes: wake_finished is among the last few events a wake writes

    def __init__(self, agents: list[Path]):
        self.waiting, self.done = list(agents), 0

    def __call__(self) -> int:
        still = []
        for a in self.waiting:
            try:
                with (a / "state" / EVENTS_FILE).open("rb") as f:
                    f.seek(max(0, f.seek(0, os.SEEK_END) - self.TAIL))
                    ended = b'"type":"wake_finished"' in f.read().replace(b" ", b"")
            except FileNotFoundError:
                ended = False
            if not ended:
                still.append(a)
        self.done += len(self.waiting) - len(still)
        self.waiting = still
        return self.done


@dataclass(frozen=True)
class Plan:
    code: Path
    label: str
    k: int | None
    pace_s: float
    rate_calls: int
    logs: Path | None = None
    bucket: tuple[int, float] | None = None  # --bucket CAPACITY,PER_S: the fake API's requests limit


def fleet_agent(path: Path, disk: bool) -> Path:
    """An agent as `wakeloop init` makes it, live, due hourly: the default policy (its own
    thin disk of the default size) unless `disk` is off (a plain folder)."""
    init_agent(path)
    config = path / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    data.update(schedule="1h", dry_run=False, policy={} if disk else {"sandbox": {"disk": "none"}})
    config.write_text(yaml.safe_dump(data))
    return path


def run_row(tmp: Path, plan: Plan, mode: str, n: int, disk: bool) -> Row:
    code, label, k = plan.code, plan.label, plan.k
    root = tmp / f"{label}-{mode}-{n}" / "agents"
    agents = [fleet_agent(root / f"a{i:03d}", disk) for i in range(n)]
    load0 = os.getloadavg()[0]
    engine, broker, sock = Engine(root), None, None
    extra = {}
    if mode == "broker":
        sock = Path(tempfile.mkdtemp(prefix="wlf-")) / "broker.sock"
        broker = start_broker(code, root, sock)
        extra["WAKELOOP_BROKER"] = str(sock)
    script = Script(scale_tools, SCALE_TOOL_STEPS, plan.pace_s)
    from orchestrator.testing.fakeapi import Bucket

    bucket = Bucket(*plan.bucket) if plan.bucket else None
    api = fake_api(script, bucket=bucket)
    with api:
        extra.update(ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY=KEY)
        serve = spawn(
            [sys.executable, "-m", "orchestrator", "serve", str(root), *(["--max-concurrent", str(k)] if k else [])],
            cwd=code,
            env=child_env(code, extra),
            stdout=subprocess.PIPE,
            text=True,
        )
        first = serve.stdout.readline()
        due = time.time()
        say(f"fleet {label} {mode} {n}: {first.strip()[:300]}")
        threading.Thread(target=drain, args=(serve.stdout, plan.logs, f"{label}-{mode}-{n}"), daemon=True).start()
        serve_mb = broker_mb = 0.0
        deadline = time.monotonic() + ROW_TIMEOUT_S
        peaks = lambda: (max(serve_mb, hwm_mb(serve.pid)), max(broker_mb, hwm_mb(broker.pid) if broker else 0))
        finished = Finished(agents)
        while finished() < n and time.monotonic() < deadline and serve.poll() is None:
            serve_mb, broker_mb = peaks()
            time.sleep(POLL_S)
        serve_mb, broker_mb = peaks()
        load1 = os.getloadavg()[0]
        end_children()  # serve, then the broker
    if sock:
        shutil.rmtree(sock.parent, ignore_errors=True)
    engine.close()
    k = k or chosen_k(first)
    calls = max(plan.rate_calls, 3 * k)
    say(f"fleet {label} {mode} {n}: the engine's rate ({calls} cold calls, {k} at once: serve's K)")
    scratch = fleet_agent(root.parent / "rate", disk)
    measured = rate.measure(connect(), load_agent(scratch).policy.sandbox, calls, k)
    shutil.rmtree(scratch)
    row = summarize(
        label, mode, n, disk, agents, due, k, measured.per_s, engine, serve_mb, broker_mb, f"{load0:.1f} -> {load1:.1f}"
    )
    row.model_per_wake_s = sum(script.held) / n
    if bucket is not None:  # R model requests: the first `capacity` at once, the rest at its refill rate
        requests = n * TURNS
        row.limit_s, row.refused = max(0.0, (requests - bucket.capacity) / bucket.per_s), bucket.refused
        allows = f"the API's limit allows {requests} requests in {row.limit_s:.1f} s"
        say(f"fleet {label} {mode} {n}: {allows}; 429s: {bucket.refused}")
    say(f"fleet {label} {mode} {n}: a wake's time, medians: {phases(agents, due)}")
    return row


def summarize(label, mode, n, disk, agents, due, k, engine_rate, engine, serve_mb, broker_mb, load) -> Row:
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
    return Row(
        label,
        mode,
        n,
        disk,
        k,
        (max(ends) - due) if ends else float("nan"),
        engine_rate,
        max(calls, 1),
        engine.created,
        engine.peak,
        statistics.median(lags) if lags else float("nan"),
        lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else float("nan"),
        serve_mb,
        broker_mb,
        failures,
        load,
    )


def phases(agents: list[Path], due: float) -> str:
    """Where a wake's time went, medians over the row's wakes: due to wake_started (the
    queue, then opening the sandbox: the disk's making and attaching, the pool's first
    container), the model's turns, the calls, and the end (last answer to wake_finished: the journal
    stub, the close)."""
    parts: dict[str, list[float]] = {"due->started": [], "model": [], "calls": [], "end": []}
    for a in agents:
        events = list(read_events(a / "state" / EVENTS_FILE))
        at = [(e.type, datetime.fromisoformat(e.timestamp.replace("Z", "+00:00")).timestamp()) for e in events]
        times = {"model": 0.0, "calls": 0.0}
        opened: dict[str, float] = {}
        for kind, t in at:
            if kind == "wake_started":
                parts["due->started"].append(t - due)
            elif kind in ("model_request", "tool_call"):
                opened[kind] = t
            elif kind == "model_response" and "model_request" in opened:
                times["model"] += t - opened.pop("model_request")
            elif kind == "tool_result" and "tool_call" in opened:
                times["calls"] += t - opened.pop("tool_call")
        answers = [t for kind, t in at if kind == "model_response"]
        if at and at[-1][0] == "wake_finished" and answers:
            parts["end"].append(at[-1][1] - answers[-1])
        parts["model"].append(times["model"])
        parts["calls"].append(times["calls"])
    return ", ".join(f"{name} {statistics.median(v):.1f} s" for name, v in parts.items() if v)


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
    ap.add_argument("--modes", default="inprocess,broker", help="inprocess (or inproc) and/or broker")
    ap.add_argument("--folders", action="store_true", help="plain folders (sandbox.disk: none), not thin disks")
    ap.add_argument("--code", type=Path, default=REPO, help="the checkout serve and the broker run from")
    ap.add_argument("--label", default="after")
    ap.add_argument("--max-concurrent", type=int, default=None, help="passed to serve (default: its own choice)")
    ap.add_argument("--pace", type=float, default=PACE_S, help="the fake model's answer time, seconds")
    ap.add_argument("--rate-calls", type=int, default=RATE_CALLS, help="cold calls measuring the engine's rate")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--logs", type=Path, help="keep serve's output of each row in this folder")
    ap.add_argument("--bucket", metavar="CAPACITY,PER_S", help="the fake API enforces a requests limit (429 past it)")
    args = ap.parse_args()
    modes = [MODES.get(m) for m in args.modes.split(",")]
    if None in modes:
        ap.error(f"--modes: one of {', '.join(MODES)}")
    # the small rows first: a big one that overloads the host then costs only itself
    plan = [(m, int(n), not args.folders) for n in args.agents.split(",") if n for m in modes]
    bucket = (int(args.bucket.split(",")[0]), float(args.bucket.split(",")[1])) if args.bucket else None
    run = Plan(args.code.resolve(), args.label, args.max_concurrent, args.pace, args.rate_calls, args.logs, bucket)
    tmp = Path(tempfile.mkdtemp(prefix="wakeloop-fleet-"))
    own_disks(tmp)
    rows, interrupted = [], False
    try:
        for mode, n, disk in plan:
            rows.append(run_row(tmp, run, mode, n, disk))
            say("fleet: " + " | ".join(rows[-1].cells()))
            cleanup(tmp)
    except KeyboardInterrupt:
        say("fleet: interrupted; removing what the bench made (serve, the broker, containers, disks)")
        interrupted = True
    finally:
        end_children()  # Ctrl-C mid-row: serve and the broker end (and let go of the disks) first
        gone = cleanup(tmp)
        if gone:
            say(f"fleet: removed {gone} container(s) left behind")
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    # A MISS is a measurement, in the table; a failed wake or an interruption is the bench's own failure.
    return 130 if interrupted else 1 if any(r.failures for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
