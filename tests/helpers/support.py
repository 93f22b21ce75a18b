"""Helpers every test module shares: the checkout (REPO), the CLI as a user
runs it, a policy written into agent.yaml, waiting for a condition the code
promises, and a weakened control's escape.

Not here: agents made on disk (agents.py), holding a process at a known
point (sync.py), the receivers of notifications (receivers.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]  # the checkout: tests/helpers/ is two below it
CLI_TIMEOUT_S = 120  # one CLI run: a wake of a few sandbox calls on a loaded engine
POLL_S = 0.1  # how often wait_for looks again


def scrubbed_env(extra: dict | None = None) -> dict:
    """This process's environment without the API's or wakeloop's own variables,
    so no test inherits a key, a base URL or a broker from the machine."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WAKELOOP_")) or k == "WAKELOOP_DISKS"
    }  # the session's (conftest)
    env.update(extra or {})
    return env


def run_cli(*args: str, env: dict | None = None, timeout: float = CLI_TIMEOUT_S, **kwargs):
    """`wakeloop ARGS` in a subprocess, from the checkout, with a scrubbed environment."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=scrubbed_env(env),
        cwd=REPO,
        **kwargs,
    )


def cli_here(*args: str) -> int:
    """`wakeloop ARGS` in this process: the same main() as the command line, without a Python
    start (and with this process's hooks: /metrics installed here sees a wake's events)."""
    from orchestrator.cli.wakeloop import main

    return main(list(args))


def set_policy(agent_dir: Path, policy: dict, **extra) -> None:
    """Replace agent.yaml's policy (an inline mapping) and any other keys given."""
    config = agent_dir / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    data["policy"] = policy
    data.update(extra)
    config.write_text(yaml.safe_dump(data))


def wait_for(condition, what: str, timeout_s: float):
    """Poll `condition` until it returns something true; that value, or fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g}s waiting for {what}"
        time.sleep(POLL_S)
    return value


def today() -> str:
    """Today's date in UTC as the journal's file names and the ledger's days have it."""
    return datetime.now(UTC).strftime("%Y-%m-%d")


def must_escape(lab, probe) -> str:
    """A weakened control's check: the probe (or the probe of that name) reports ESCAPED against the
    weakened wakeloop, whose observation is returned for the test's own asserts."""
    from orchestrator.escapes import ALL_PROBES, ESCAPED
    from orchestrator.escapes.lab import run_probe

    if isinstance(probe, str):
        [probe] = [p for p in ALL_PROBES if p.name == probe]
    outcome = run_probe(lab, probe)
    assert outcome.verdict == ESCAPED, f"{outcome.verdict}: {outcome.observed}"
    return outcome.observed
