"""An agent on disk as a test or a bench measurement needs it (make_agent), and one of its
wakes run live through the real SDK against the fake Messages API (live_wake).

The folder is made by `wakeloop init` (init_agent) beside ROOT and moved in
whole, so a serve already scanning ROOT never sees it half-made; then only
the agent.yaml keys asked for change.

Not here: a policy written into an agent that exists (support.set_policy),
the fake API itself (orchestrator/testing/fakeapi.py; conftest's fake_api starts it).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.testing.fakeapi import FAKE_KEY
from orchestrator.wake.loop import Receipt, wake
from orchestrator.wake.model import LiveModel


def make_agent(
    root: Path,
    folder: str,
    /,
    *,
    schedule: str | None = None,
    policy: dict | None = None,
    notify: list | None = None,
    mandate: str | None = None,
    live: bool | None = None,
    **keys,
) -> Path:
    """ROOT/FOLDER, a new agent folder; returns its path. Left as `init` wrote it unless given:
    schedule: `every:` (an interval, `30s`, or a cron line) in place of `schedule:`;
    policy: the inline policy; notify: the agent's own entries ([] writes an empty list);
    mandate: mandate.md's text; live: the opposite of dry_run;
    keys: any other agent.yaml key, as given (name, model, pause_after_failures, ...)."""
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root.parent)) / folder
    init_agent(staging)
    config = staging / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    if schedule is not None:
        data.pop("schedule", None)
        data["every"] = schedule
    changes = {"policy": policy, "notify": notify, "dry_run": None if live is None else not live}
    data.update({key: value for key, value in changes.items() if value is not None}, **keys)
    config.write_text(yaml.safe_dump(data))
    if mandate is not None:
        (staging / "mandate.md").write_text(mandate)
    agent_dir = staging.rename(root / folder)
    staging.parent.rmdir()
    return agent_dir.resolve()  # as init_agent returns it


def live_wake(agent_dir: Path, stream: bool = True, **kwargs) -> Receipt:
    """One wake of the agent, live with the fake key: the fake API must be running (conftest's
    fake_api sets ANTHROPIC_BASE_URL). kwargs go to wake() (stop=...)."""
    agent = load_agent(agent_dir)
    model = LiveModel(agent.model, FAKE_KEY, stream=stream, effort=agent.effort, thinking=agent.thinking)
    return wake(agent, live=True, model=model, **kwargs)
