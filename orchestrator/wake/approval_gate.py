"""The wake's side of approvals: a matching call waits for a person; at the next wake, the outcome.

`Gate.ask` stands in the registry (tools.py) before a call's handler: a call
that matches the policy's `approve:` rules is filed (records/approvals.py),
queued as an `approval` notification, and answered with WAITING text; the
model goes on with other work and nothing hangs. A call the policy would
refuse anyway (a disabled tool, write_file's deny globs) is refused as
before, never asked about.

`Gate.asked_hosts` comes after a bash call that ran and reached a host outside
allow_hosts that a network_host rule covers (the proxy refused it as "ask"): the
call is filed with those hosts, and its result says it waits.

`Gate.outcomes`, at the start of the next wake, takes every decided approval:
an approved call runs exactly as asked, through the same registry (with its
hosts allowed for it alone, if it asked for hosts), under the policy as it
stands now (so a tool since disabled, a path since denied or a host no rule
asks about any more is void, and says so), and is not asked about again;
denied, expired and void ones are told with their reason. Each is an event and a transcript line;
context.py words them for the first user message.

Not here: the files and their states (records/approvals.py), links
(records/approval_links.py), the notification (notify/outcomes.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.policy.schema import Policy
from orchestrator.records import approvals
from orchestrator.records import event_types as ev
from orchestrator.records import transcript as tr
from orchestrator.records.events import EventLog
from orchestrator.wake.tool_result import ToolResult, error
from orchestrator.wake.tools import Registry

WAITING = (
    "WAITING for a person: this {tool} call matches this agent's approval rule ({rule}) and was "
    "NOT run. Approval id {id}. Go on with other work meanwhile; do not retry this call or try "
    "another way round it. A person approves or denies it out of band; you will learn the outcome "
    "at a later wake (an approved call then runs at the start of that wake and you get its "
    "result). Unanswered by {expires}, it counts as denied."
)
ALREADY = " (You asked for this same call earlier; it is still waiting under the same id.)"
HOSTS_WAITING = (
    "WAITING for a person: this command ran, and its requests to {hosts} were refused: not in "
    "sandbox.allow_hosts, and this agent's approval rule (network_host) asks a person about them. "
    "Approval id {id}. Go on with other work meanwhile; do not retry this or try another way round "
    "it. If a person approves, this same command runs again at the start of a later wake with "
    "those hosts allowed for it alone, and you get its result. Unanswered by {expires}, it counts "
    "as denied. What the command printed this time follows."
)


@dataclass(frozen=True)
class Outcome:
    approval: approvals.Approval  # as reported (status ran | denied | expired | void)
    result: str = ""  # what the approved call returned, as the model would have read it


class Gate:
    """One wake's approvals. `notify(approval)` queues the person's notification (loop.py's _notify)."""

    def __init__(
        self,
        policy: Policy,
        state_dir: Path,
        run_id: str,
        notify: Callable[[approvals.Approval], None],
        events: EventLog,
        transcript: tr.Transcript,
        halted: Callable[[], bool] = lambda: False,
        no_room: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.policy, self.state_dir, self.run_id = policy, state_dir, run_id
        self.notify, self.events, self.transcript = notify, events, transcript
        self.halted, self.no_room = halted, no_room  # the fleet's switch; the disk guard's refusal

    def ask(self, tool: str, args: dict[str, Any], words: str) -> ToolResult | None:
        """WAITING (or a refusal) for a call that must wait; None for a call that runs now."""
        rule = self.policy.approve.asks(tool, args)
        if rule is None:
            return None
        if tool == "write_file" and self.policy.tools.write_file.refusal(
            str(args.get("path", "")), len(str(args.get("content", "")).encode("utf-8"))
        ):
            return None  # the handler refuses it: nothing to ask a person about
        try:
            asked = approvals.ask(self.state_dir, tool, args, rule, words, self.run_id, self.policy.approve.expires)
        except OSError as exc:
            return error(
                f"{tool}: this call needs a person's approval, and the harness could not file it "
                f"({exc}); it was not run"
            )
        if asked.approval is None:
            return ToolResult(
                text=f"REFUSED: this call needs a person's approval and {asked.refusal}; it was not run",
                is_error=True,
                denied=asked.refusal,
            )
        a = asked.approval
        if asked.new:
            self.notify(a)
        text = WAITING.format(tool=tool, rule=rule, id=a.id, expires=a.expires) + ("" if asked.new else ALREADY)
        return ToolResult(text=text, detail={"approval": a.id, "waiting": True})

    def asked_hosts(self, tool: str, args: dict[str, Any], words: str, result: ToolResult) -> ToolResult:
        """A bash call that ran and reached hosts the proxy asked about: filed for a person, and its
        result led by HOSTS_WAITING (after the status line, where the command's output cannot be)."""
        hosts = tuple(result.detail["asked_hosts"])
        rule = f"network_host: {', '.join(hosts)}"
        try:
            asked = approvals.ask(
                self.state_dir, tool, args, rule, words, self.run_id, self.policy.approve.expires, hosts=hosts
            )
        except OSError as exc:
            note = f"[the hosts {', '.join(hosts)} need a person's approval, and the harness could not file it: {exc}]"
            return replace(result, text=_lead(result.text, note))
        if asked.approval is None:
            return replace(result, text=_lead(result.text, f"[hosts {', '.join(hosts)}: {asked.refusal}]"))
        a = asked.approval
        if asked.new:
            self.notify(a)
        note = HOSTS_WAITING.format(hosts=", ".join(hosts), id=a.id, expires=a.expires) + ("" if asked.new else ALREADY)
        return replace(
            result, text=_lead(result.text, note), detail=result.detail | {"approval": a.id, "waiting": True}
        )

    def outcomes(self, registry: Registry) -> list[Outcome]:
        """Every decided approval, handled and reported once (see the module docstring)."""
        offered = frozenset(registry.names())
        done = []
        for a in approvals.take(self.state_dir, self.run_id, offered):
            result = ""
            if a.status == "started":
                ran = self._run(a, registry)
                if ran is None:  # not run this wake: approved again, told when it runs
                    continue
                a, result = ran
            else:
                a = approvals.finish(self.state_dir, a, self.run_id)
            self.transcript.add(
                "approval",
                id=a.id,
                tool=a.tool,
                input=a.input,
                status=a.status,
                decided_by=a.decided_by,
                decided_at=a.decided_at,
                reason=a.reason or None,
                result=result or a.result or None,
            )
            self.events.write(ev.ApprovalReported(id=a.id, tool=a.tool, status=a.status))
            done.append(Outcome(a, result or a.result))
        return done

    def _run(self, a: approvals.Approval, registry: Registry) -> tuple[approvals.Approval, str] | None:
        """The approved call run, or None when it could not start this wake (the fleet is stopped,
        or the disks' filesystem had no room): it is approved again, for a later wake."""
        if self.halted():
            approvals.unstart(self.state_dir, a, self.run_id, "the fleet is stopped")
            return None
        self.events.write(ev.ToolCall(step=0, id=a.id, tool=a.tool, approval=a.id))
        result = registry.call(a.tool, a.input, gate=False, hosts=a.hosts)
        self.events.write(
            ev.tool_result(
                step=0,
                id=a.id,
                tool=a.tool,
                is_error=result.is_error,
                result_chars=len(result.text),
                approval=a.id,
                detail=result.detail,
            )
        )
        if result.detail.get("no_room"):
            self.no_room(str(result.detail["no_room"]))
            approvals.unstart(self.state_dir, a, self.run_id, "the disks' filesystem had no room")
            return None
        if result.is_error and self.halted():  # refused because the fleet stopped meanwhile
            approvals.unstart(self.state_dir, a, self.run_id, "the fleet is stopped")
            return None
        if result.denied:  # the policy as it stands now refuses it: void, and said why
            a = replace(a, status="void", reason=f"the policy as it stands now refuses it: {result.denied}")
            self.events.write(ev.ApprovalVoid(id=a.id, tool=a.tool, reason=a.reason))
            return approvals.finish(self.state_dir, a, self.run_id), ""
        return approvals.finish(self.state_dir, a, self.run_id, result.text, ran=True), result.text


def _lead(text: str, note: str) -> str:
    """`note` just after a tool result's status line (sandbox/box.py's for_model): first, where
    the command's own output cannot put a forged one."""
    status, _, rest = text.partition("\n")
    return f"{status}\n{note}\n{rest}"
