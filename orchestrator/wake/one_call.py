"""A call outside any wake (`wakeloop sandbox exec`): run as the bash tool runs it, in a wake of its own.

Between two wakes the workspace is what the last one committed. But a wake that was killed
(kill -9, the OOM killer, a reboot) may leave its overlay mounted where boxes look, and a
container of its still running: a call run straight there would read the dead wake's files
and write into a layer that the next wake discards, so what it wrote would be lost. So a call
that can take the agent's wake lock (no wake runs) is a wake of its own, as a call through
the broker already is: the dead wake's containers are removed and what it left is settled
(discarded and recorded, as a wake's start does), the call runs on the workspace as
committed, and its changes are checked against `workspace.protect` and committed at its end,
with a `workspace_changes` line in events.jsonl. While a wake runs (a live holder of the
lock), the call runs in that wake's overlay and lands with its commit.

Not here: a wake (loop.py), the transaction (sandbox/wakes/wake_layer.py), the broker's own wake for
a call from a client that never begins one (broker/server.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from orchestrator.broker.client import open_sandbox
from orchestrator.policy.agent import Agent
from orchestrator.records import state as st
from orchestrator.records.events import EVENTS_FILE, EventLog
from orchestrator.sandbox.box import SandboxResult
from orchestrator.wake.loop import report_settled


def run_outside_a_wake(agent: Agent, command: str, say: Callable[[str], None]) -> SandboxResult:
    """Run `command` as the bash tool would; progress and what did not land go to `say`."""
    lock = st.WakeLock(agent.state_dir)
    try:
        holder = lock.acquire()
    except OSError:  # state/ missing or its lock a link: no wake can be ruled out, so none is begun
        holder = st.LockHolder(0, "")
    own = holder is None
    try:
        box = open_sandbox(agent, warm=0, fresh=own, say=say)  # one call: no pool
        bash = agent.policy.tools.bash
        try:
            if not own:
                return box.run(command, timeout_s=bash.timeout_s, max_output_chars=bash.max_output_chars)
            events = EventLog(agent.state_dir / EVENTS_FILE, uuid.uuid4().hex[:12])
            report_settled(box.begin(events.run_id), events, say)
            try:
                result = box.run(command, timeout_s=bash.timeout_s, max_output_chars=bash.max_output_chars)
            finally:
                policy = agent.policy
                changes = box.finish(policy.workspace.protect, policy.tools.write_file.protect_git)
                try:
                    if not changes.empty:
                        events.write(changes.record())
                except (OSError, ValueError) as exc:  # a planted events.jsonl: the call's answer still comes
                    say(f"workspace: this call's change set was not recorded: {exc}")
            if changes.error:
                say(f"workspace: this call's changes did not land: {changes.error}")
            for refused in changes.refused:
                say(f"workspace: refused {refused.change.path} ({refused.rule}): dropped")
            return result
        finally:
            box.close()
    finally:
        lock.release()
