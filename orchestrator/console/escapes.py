"""The Escapes page's button: `wakeloop escapes` run again in the background, its progress kept.

The suite is the CLI's own command run as a child process (`python -m
orchestrator escapes --json ...`), so the console shows exactly the report a
person gets at a terminal; the command keeps its report (records/escape_reports.py)
and the page reads it from there. One run at a time; its stderr progress
lines ("[ 3/103] HELD probe ...") are kept, the last LINES_KEPT of them.

Under compose the orchestrator has no Docker engine: the run then fails at
once and the page says why (run `wakeloop escapes` in the broker's container).

Not here: the probes and the report (escapes/), where reports are kept
(records/escape_reports.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from orchestrator.assets import SHIPPED_POLICIES, shipped_policy

LINES_KEPT = 400
RUNTIMES = ("runc", "runsc")
_PROGRESS = re.compile(r"^\[\s*(\d+)/(\d+)\]")


@dataclass
class Run:
    runtime: str
    policy: str
    started: float = field(default_factory=time.time)
    done: int = 0
    total: int = 0
    exit_code: int | None = None
    lines: deque = field(default_factory=lambda: deque(maxlen=LINES_KEPT))

    @property
    def running(self) -> bool:
        return self.exit_code is None

    @property
    def outcome(self) -> str:
        return {None: "running", 0: "every probe held", 1: "something did not hold"}.get(
            self.exit_code, f"failed to run (exit {self.exit_code})"
        )


class Runner:
    def __init__(self, extra_args: tuple[str, ...] = ()):
        self.extra_args = extra_args  # tests: `--probe NAME` keeps a run short
        self.last: Run | None = None
        self._lock = threading.Lock()

    def start(self, runtime: str, policy: str) -> str | None:
        """Start a run; None, or the one line that says why not."""
        if runtime not in RUNTIMES or policy not in SHIPPED_POLICIES:
            return f"choose a runtime of {', '.join(RUNTIMES)} and a policy of {', '.join(SHIPPED_POLICIES)}"
        with self._lock:
            if self.last and self.last.running:
                return "the escape suite is already running"
            run = self.last = Run(runtime, policy)
        argv = [
            sys.executable,
            "-m",
            "orchestrator",
            "escapes",
            "--json",
            "--runtime",
            runtime,
            "--policy",
            str(shipped_policy(policy)),
            *self.extra_args,
        ]
        threading.Thread(target=self._follow, args=(run, argv), name="wakeloop-escapes", daemon=True).start()
        return None

    @staticmethod
    def _follow(run: Run, argv: list[str]) -> None:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )
        except OSError as exc:
            run.lines.append(f"could not start: {exc}")
            run.exit_code = 127
            return
        assert proc.stderr is not None  # stderr=PIPE
        for line in proc.stderr:
            line = line.rstrip("\n")
            run.lines.append(line)
            m = _PROGRESS.match(line)
            if m:
                run.done, run.total = int(m.group(1)), int(m.group(2))
        run.exit_code = proc.wait()
