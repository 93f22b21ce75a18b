"""The wake as a transaction on the workspace (sandbox/wakes/wake_layer.py), as the wake sees it.

`begin`, before anything runs: what earlier wakes left is settled (a cut commit finished, a
wake that died before its commit discarded and recorded), then this wake's overlay is mounted.
`finish`, once, whatever ended the wake: its changes checked against the policy, what passes
committed, the rest dropped; the proxy's decisions kept for the receipt; the change set
recorded (event, transcript) and its refusals kept for the next wake's context
(state/workspace_refused.json). `honest`: a wake whose changes did not land ends
`not_committed`, a failure, whatever its conversation ended with.

Not here: the overlay and the commit (sandbox/wakes/wake_layer.py, sandbox/wakes/transaction.py), the
next wake's words about the refusals (context.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from orchestrator.policy.agent import Agent
from orchestrator.records import egress
from orchestrator.records import event_types as ev
from orchestrator.records import transcript as tr
from orchestrator.records.events import EventLog
from orchestrator.records.receipt import Status
from orchestrator.safeio.folder import state_folder
from orchestrator.sandbox.box import Sandbox, SandboxError
from orchestrator.sandbox.change_set import Settled, WakeChanges
from orchestrator.wake.context import REFUSED_FILE


def report_settled(settled: Settled, events: EventLog, say: Callable[[str], None]) -> None:
    """What a begin found earlier wakes left (a wake's, or a call outside any wake's: one_call.py):
    said, and each wake that died before its commit recorded as discarded."""
    for line in settled.lines:
        say(f"workspace: {line}")
    for dead in settled.discarded:
        say(f"workspace: discarded wake {dead.run_id}, which died before its end: {dead.count} change(s) dropped")
        try:
            events.write(dead.record())
        except (OSError, ValueError) as exc:  # a planted events.jsonl: the wake goes on, and says so
            say(f"workspace: the discarded wake was not recorded: {exc}")


class Transaction:
    """One wake's changes to the workspace: begun once, finished once."""

    def __init__(
        self,
        agent: Agent,
        run_id: str,
        box: Sandbox,
        events: EventLog,
        transcript: tr.Transcript,
        say: Callable[[str], None],
        node_down: Callable[[], str | None] | None = None,
    ):
        self.agent, self.run_id, self.box = agent, run_id, box
        self.events, self.transcript, self.say = events, transcript, say
        self.node_down = node_down  # why its node does not answer, asked when the commit fails (its own box)
        self.begun = False
        self.node_lost = ""  # past one host: its node stopped answering before the commit

    def begin(self) -> None:
        settled = self.box.begin(self.run_id)
        self.begun = True
        report_settled(settled, self.events, self.say)

    def finish(self) -> str:
        """Once; never raises. Returns why the changes were not committed (nothing of them
        landed), or "" when they were."""
        if not self.begun:
            return ""
        self.begun = False
        policy = self.agent.policy
        try:
            changes = self.box.finish(policy.workspace.protect, policy.tools.write_file.protect_git)
        except SandboxError as exc:  # its broker did not answer: past one host, its node may be gone
            changes = WakeChanges(self.run_id, error=f"the wake's changes were not committed: {exc}")
            if self.node_down is not None and (down := self.node_down()):
                self.node_lost = down
        try:  # the proxy's decisions, before the receipt sums them (records/egress.py)
            egress.append(self.agent.state_dir, self.box.egress_decisions())
        except (OSError, SandboxError) as exc:
            self.say(f"egress: the proxy's decisions were not recorded: {exc}")
        record = changes.record()  # paths as text (wake_layer._text)
        try:
            self.events.write(record)
            self.transcript.add(record.TYPE, **record.to_data())
        except (OSError, ValueError) as exc:  # the wake still ends with its receipt
            self.say(f"workspace: the change set was not recorded: {exc}")
        self._tell_next_wake(record)
        landed = "dropped" if record.outcome == "error" else f"{changes.count} committed"
        self.say(
            f"workspace: {landed}, {changes.refused_count} refused"
            + "".join(f"; {path}: {rule}" for path, rule in list(zip(record.refused, record.rules, strict=False))[:3])
            + (f" ({changes.error})" if changes.error else "")
        )
        return changes.error

    def honest(self, status: Status, reason: str, not_committed: str) -> tuple[Status, str]:
        """A wake whose changes did not land does not end as a success (done, budget_stop,
        stopped): it ends `not_committed`, a failure (exit 1, news, a failing streak; past one
        host, when its node went mid-wake, no streak: notify/outcomes.py). A dead letter is a
        failure already: its reason says so too."""
        if not not_committed:
            return status, reason
        if self.node_lost:  # its node went mid-wake: said, but the agent did not fail (receipt.node_lost)
            not_committed = f"{not_committed} ({self.node_lost})"
        if status == "dead_letter":
            return status, f"{reason}; {not_committed}"
        self.events.write(ev.NotCommitted(reason=not_committed, ended=status, node_lost=self.node_lost))
        self.say(f"not committed: {not_committed}")
        return "not_committed", f"{not_committed} (the wake itself ended {status}: {reason})"

    def _tell_next_wake(self, record: ev.WorkspaceChanges) -> None:
        """state/workspace_refused.json: the refusals the next wake's context names (context.py)."""
        folder = state_folder(self.agent.state_dir)  # no link followed: state/ is the folder owner's
        try:
            if record.refused:
                folder.write_atomic(REFUSED_FILE, json.dumps(record.to_data()))
            else:
                folder.unlink(REFUSED_FILE)
        except OSError as exc:
            self.say(f"workspace: could not keep the refusals for the next wake: {exc}")
