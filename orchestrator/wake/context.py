"""What the model sees at the start of a wake: the system prompt and the first user message.

The agent's whole worldview each wake is: mandate + operating rules + core
memory + the last few journal files (system prompt), then wake number, UTC
time, the human's queued messages (a live wake's only: a dry run leaves them
for the first live one), the last wake's refused changes and the task it has
(first user message). `next_wake` assembles exactly that for `wakeloop
context`, with the same functions the wake calls, and changes nothing.

The system prompt is a stable prefix for prompt caching: no timestamps, no
wake counter, nothing that changes from step to step, so the tools and the
system prompt are byte-identical for every request of a wake (and between
wakes until memory changes). The one cache breakpoint on the system block
covers tools + system; model.py adds a moving breakpoint on the last message
so step N reads steps 1..N-1 from the cache too.

Workspace files are read through workspace_reads.py only (untrusted: no symlink
followed, capped, never a hang). mandate.md is the human's, but under a
shared ROOT not only the operator writes an agent folder: it is read through
safeio/folder.py (no link followed, never a FIFO or device, capped).

Approvals decided since the last wake (approval_gate.py) are told after the
first message: who approved, when and what the call returned, or why it was
denied, expired or void. So are the changes the last wake made that the
policy refused at its end (state/workspace_refused.json, which the loop
writes; sandbox/wakes/wake_layer.py), each with its rule, so the model stops trying.

Not here: draining the inbox (state.py) or calling the model (model.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.policy.agent import Agent
from orchestrator.records import approvals, tasks
from orchestrator.records import state as st
from orchestrator.records.event_types import WorkspaceChanges, parse_record
from orchestrator.safeio.folder import Folder
from orchestrator.sandbox import box
from orchestrator.sandbox.containers.output import clean
from orchestrator.sandbox.disks import workspace_reads
from orchestrator.wake.model import CACHE, Block

if TYPE_CHECKING:
    from orchestrator.wake.approval_gate import Outcome

JOURNAL_TAIL = 3  # journal files in the context, newest last
MANDATE_CAP = 64 * 1024  # bytes; a trusted file, still not unbounded
INBOX_CAP = 64 * 1024  # bytes of queued messages shown
APPROVAL_RESULT_CAP = 4000  # chars of an approved call's result told (the transcript has it whole)
REFUSED_FILE = "workspace_refused.json"  # in state/: the last wake's refused changes (loop.py writes it)
REFUSED_CAP = 256 * 1024  # bytes of it read; the record itself is capped in count (wake_layer.py)

NO_MANDATE = "No mandate.md found. Ask your human (send_message) what your goal is."
EMPTY_CORE = "(core memory is empty: this may be your first wake)"


@dataclass(frozen=True)
class Context:
    system: str  # stable: the cache prefix
    first_user: str  # changes every wake: after the prefix

    @property
    def system_hash(self) -> str:
        return hashlib.sha256(self.system.encode()).hexdigest()[:16]

    def system_blocks(self) -> list[Block]:
        return [{"type": "text", "text": self.system, "cache_control": dict(CACHE)}]

    def render(self) -> str:
        """For `wakeloop context`: what the next wake sends, for a person."""
        return (
            f"===== system prompt ({len(self.system):,} chars, sha256 {self.system_hash}) =====\n"
            f"{self.system}\n\n===== first user message =====\n{self.first_user}\n"
        )


@dataclass(frozen=True)
class NextWake:
    """`wakeloop context`: what the next wake sends, and what it leaves out."""

    live: bool
    wake: int
    model: str
    context: Context
    task: tasks.Task | None
    waiting: int  # a dry run: the human's messages it leaves for the first live wake
    approvals: int  # a live wake: decided approvals it handles first, told after this message

    def render(self) -> str:
        mode = "live" if self.live else "dry run (scripted model, no API call)"
        lines = [f"===== the next wake: #{self.wake}, {mode}, model {self.model} ====="]
        if self.waiting:
            lines.append(f"({self.waiting} message(s) from your human wait for the first live wake: not sent)")
        if self.approvals:
            lines.append(
                f"({self.approvals} decided approval(s): the wake runs the approved calls first and "
                "adds what became of each at the end of the first user message)"
            )
        return "\n".join(lines) + "\n" + self.context.render()

    def to_json(self, agent: str) -> dict[str, Any]:
        return {
            "agent": agent,
            "wake": self.wake,
            "live": self.live,
            "model": self.model,
            "task": self.task.id if self.task else "",
            "messages_waiting": self.waiting,
            "approvals_to_tell": self.approvals,
            "system": self.context.system,
            "first_user": self.context.first_user,
        }


def journal_day(now: datetime) -> str:
    return now.strftime("%Y-%m-%d")


def build_context(
    agent: Agent,
    *,
    wake: int,
    now: datetime,
    inbox: str,
    files: box.Files | None = None,
    task: tasks.Task | None = None,
) -> Context:
    """The context of wake number `wake`: `inbox` as the wake drained it ("" in a dry run),
    `task` as it took it (claimed, or named by a dry run)."""
    first_user = first_message(wake, now, inbox)
    refused = refused_section(agent.state_dir)
    if refused:
        first_user += f"\n\n{refused}"
    if task is not None:  # after the cached prefix, with the rest of what changes every wake
        can_complete = agent.policy.tools.complete_task.enabled
        first_user += "\n\n" + tasks.first_message_line(task, can_complete=can_complete)
    return Context(system=system_prompt(agent, files), first_user=first_user)


def next_wake(agent: Agent, *, live: bool, wake: int, now: datetime, files: box.Files | None = None) -> NextWake:
    """What wake number `wake` would send if it began at `now`, read without changing anything:
    the inbox peeked (a live wake's), the task it would take named, not claimed. A broken
    tasks.json is no task, as the wake takes it (tasks.claim_for_wake)."""
    sd = agent.state_dir
    queued = st.peek_inbox(sd)
    try:
        task = tasks.next_task(sd)
    except tasks.TaskError:
        task = None
    try:  # as the wake reads them (approval_gate.py); one it cannot read is told nothing
        told = [a for a in approvals.load_all(sd) if not a.reported and a.status in (*approvals.DECIDED, "started")]
    except (OSError, ValueError, TypeError):
        told = []
    return NextWake(
        live=live,
        wake=wake,
        model=agent.model,
        context=build_context(agent, wake=wake, now=now, inbox=queued if live else "", files=files, task=task),
        task=task,
        waiting=0 if live else st.count_messages(queued),
        approvals=len(told) if live else 0,
    )


def refused_section(state_dir: Path) -> str:
    """The changes the last wake made that the policy refused at its end, each with its rule; ""
    when there were none (or the file is not one the loop wrote)."""
    try:
        data = json.loads(Folder(state_dir).head(REFUSED_FILE, REFUSED_CAP)[: REFUSED_CAP + 1])
    except (OSError, ValueError):
        return ""
    record = parse_record(WorkspaceChanges.TYPE, data) if isinstance(data, dict) else None
    if not isinstance(record, WorkspaceChanges) or not record.refused:
        return ""
    lines = [
        "Changes your last wake made that were NOT kept: the policy refused them when that wake "
        "ended, and the workspace has these paths as they were before it:"
    ]
    for path, rule, kind in zip(record.refused, record.rules, record.refused_kinds, strict=False):
        lines.append(f"- {clean(kind)} {clean(path)[:300]}: refused by {clean(rule)[:200]}")
    if record.more:
        lines.append(f"- ... and {record.more} more change(s) not listed")
    lines.append(
        "Every change is checked when a wake ends, whichever tool made it: do not try these again "
        "another way. If one must change, ask your human (send_message)."
    )
    return "\n".join(lines)


def system_prompt(agent: Agent, files: box.Files | None = None) -> str:
    """`files`: where the workspace is read (the broker's, under compose); default this host's folder."""
    files = files or workspace_reads.HostFiles(agent.workspace)
    core = files.read_text_or_none(workspace_reads.CORE_MEMORY)
    journal = "\n\n".join(
        f"--- {name} ---\n{files.read_text(f'{workspace_reads.JOURNAL_DIR}/{name}')}"
        for name in files.journal_names()[-JOURNAL_TAIL:]
    )
    return f"""You are {agent.name}, an autonomous agent. Nobody watches this session live.
You wake on a schedule, work, and stop; your continuity exists only in your files.

# Mandate (set by your human)
{_mandate(agent)}

# Operating rules
{_rules(agent)}

# Core memory (memory/core.md)
{core if core is not None and core.strip() else EMPTY_CORE}

# Recent journal
{journal or "(no journal entries yet)"}"""


def _rules(agent: Agent) -> str:
    tools, budget = agent.policy.tools, agent.policy.budget
    rules = [
        "- Your workspace is /workspace. Every bash command and every write_file runs in a "
        "fresh, disposable container that sees only that directory; nothing outside it "
        "survives from one call to the next.",
        "- Your memory lives in memory/. Before you stop you MUST append an entry to today's "
        "journal, memory/journal/YYYY-MM-DD.md (the first message names the file): what you "
        "did, what you learned, what comes next. Update memory/core.md when something durable "
        "changed; overwrite stale state, don't let it grow without bound.",
        "- You cannot spend money without explicit approval from your human.",
        f"- A wake may use at most {budget.max_steps} model turns and {budget.max_tokens_per_wake:,} "
        "tokens. If the token budget runs out you get one last turn without tools: reply with "
        "your journal entry and the harness appends it to today's journal for you.",
        "- When you are finished, stop calling tools and reply with a short closing note.",
    ]
    if tools.memory.enabled:
        rules.insert(
            2,
            "- The memory tool's /memories is this same memory/ folder: /memories/core.md is "
            "memory/core.md, read into this prompt at every wake.",
        )
    if tools.send_message.enabled:
        rules.insert(
            2,
            f"- Use send_message for anything your human must see (at most "
            f"{tools.send_message.max_per_wake} per wake). One good message beats five fragments.",
        )
    if agent.policy.approve.rules:
        held = "; ".join(
            f"network host {r.network_host}" if r.network_host else f"{r.tool} {', '.join(r.match or r.paths)}"
            for r in agent.policy.approve.rules
        )
        rules.append(
            f"- Some calls wait for a person's approval ({held[:500]}): such a call is not run "
            "then; you get an approval id, go on with other work, and hear the outcome at a later "
            "wake (an approved call runs at its start). Do not try another way round it."
        )
    if agent.policy.workspace.protect:
        rules.append(
            f"- Protected paths ({', '.join(agent.policy.workspace.protect)[:500]}): a change to them, by "
            "any tool, is not kept; what a wake changes lands when it ends, checked against this."
        )
    if not tools.bash.enabled:
        rules.append("- The bash tool is disabled by your policy.")
    if not tools.write_file.enabled:
        rules.append("- The write_file tool is disabled by your policy.")
    return "\n".join(rules)


def _mandate(agent: Agent) -> str:
    try:
        data = Folder(agent.dir).head("mandate.md", MANDATE_CAP)
    except OSError:  # absent, or a link, FIFO or device planted in its place: never followed or opened
        return NO_MANDATE
    text = data[:MANDATE_CAP].decode("utf-8", "replace").strip()
    if len(data) > MANDATE_CAP:
        text += f"\n[... mandate.md cut by the harness at {MANDATE_CAP:,} bytes ...]"
    return text or NO_MANDATE


def first_message(wake: int, now: datetime, inbox: str) -> str:
    inbox = clean(inbox.strip())
    if len(inbox) > INBOX_CAP:
        inbox = inbox[:INBOX_CAP] + f"\n[... cut by the harness at {INBOX_CAP:,} characters ...]"
    stamp = now.isoformat(timespec="seconds").replace("+00:00", "Z")
    return (
        f"Wake #{wake}. UTC time: {stamp}. "
        f"Today's journal: memory/journal/{journal_day(now)}.md\n"
        f"New messages from your human since the last wake:\n{inbox or '(none)'}\n\n"
        "Proceed with your work."
    )


def approvals_section(outcomes: Sequence[Outcome]) -> str:
    """What became of the calls that waited for a person (approval_gate.py's Outcomes), for the
    first user message; "" when there is nothing to tell."""
    if not outcomes:
        return ""
    lines = ["Approvals decided since your last wake (calls that waited for a person):"]
    for o in outcomes:
        a = o.approval
        call = clean(a.summary())[:300]
        if a.status == "ran":
            result = clean(o.result)
            if len(result) > APPROVAL_RESULT_CAP:
                result = (
                    result[:APPROVAL_RESULT_CAP]
                    + f"\n[... cut by the harness at {APPROVAL_RESULT_CAP:,} characters ...]"
                )
            lines.append(
                f"- {a.id} ({call}): APPROVED by {clean(a.decided_by)} at {a.decided_at}. The harness "
                f"ran it at the start of this wake, exactly as you asked; it returned:\n{result}"
            )
        elif a.status == "denied":
            lines.append(
                f"- {a.id} ({call}): DENIED by {clean(a.decided_by)} at {a.decided_at}; it was not run. "
                f"Reason: {clean(a.reason) or '(none given)'}"
            )
        elif a.status == "expired":
            lines.append(f"- {a.id} ({call}): EXPIRED unanswered at {a.expires}; it counts as denied and was not run.")
        else:
            lines.append(f"- {a.id} ({call}): VOID, not run: {clean(a.reason)}")
    return "\n".join(lines)
