"""What goes into the queue, and when: a wake's end, a send_message, an approval asked, a wake
that could not start, a call the disk guard did not start, a node lost, a new day.

Every function here only *queues* (queue.enqueue: a file written
atomically) and returns at once: delivery is the sender's, later, so a
receiver that hangs never slows or breaks a wake.

A notification is one JSON object, the same on every channel:

    {"id": "demo/3f2a9c1b07de/dead_letter", "agent": "demo", "event": "dead_letter",
     "title": "demo: dead letter", "text": "...", "run_id": "3f2a9c1b07de",
     "time": "2026-12-01T03:00:00.000Z", "data": {...}}

`id` is stable (agent, run, event, and the message's number or the day),
so a receiver that sees it twice (at least once) can drop the second.

Not here: sending (sender.py), the failure rules (records/health.py).
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from orchestrator.notify import queue
from orchestrator.notify.config import Channel
from orchestrator.records import approval_links, health
from orchestrator.records import event_types as ev
from orchestrator.records.approvals import Approval
from orchestrator.records.events import EVENTS_FILE, EventLog, now_iso, read_history
from orchestrator.records.models import lifecycle_warning, model_info
from orchestrator.records.receipt import FAILED, Receipt
from orchestrator.safeio.folder import state_folder
from orchestrator.safeio.shown import shown

WAKE_EVENTS = ("dead_letter", "blocked", "budget_stop", "not_committed")  # receipt statuses that are news by themselves
MARKER_CAP = 64  # bytes of a day marker read (a date)
DAILY_FILE = "daily.json"  # under state/notify/: the last UTC day a digest was queued for
TEXT_CAP = 8000  # chars of the agent's own text in one notification
CALL_CAP = 3000  # chars of an approval's call in its text (data.input has it whole)


class Agent(Protocol):
    """What the notes read of an agent (policy/agent.py's Agent: policy/ stands on this leaf)."""

    @property
    def name(self) -> str: ...
    @property
    def dir(self) -> Path: ...
    @property
    def state_dir(self) -> Path: ...
    @property
    def model(self) -> str: ...
    @property
    def notify(self) -> tuple[Channel, ...]: ...
    @property
    def pause_after_failures(self) -> int: ...


def payload(
    agent: str, event: str, id_tail: str, title: str, text: str, run_id: str = "", data: dict[str, Any] | None = None
) -> queue.Payload:
    return {
        "id": f"{agent}/{id_tail}",
        "agent": agent,
        "event": event,
        "title": title,
        "text": text[:TEXT_CAP],
        "run_id": run_id,
        "time": now_iso(),
        "data": data or {},
    }


def who(name: str, agent_dir: Path | str) -> str:
    """The agent as a title names it: its name, and its folder when the name differs. agent.yaml's
    author picks the name, the operator the folder: no agent can pass for another in a heading."""
    folder = Path(agent_dir).name
    return name if name == folder else f"{name} [{folder}]"


def emit(state_dir: Path, channels: Iterable[Channel], note: queue.Payload) -> int:
    """Queue `note` for every channel that asked for its event; how many were queued."""
    n = 0
    for channel in channels:
        if note["event"] in channel.on:
            queue.enqueue(
                state_dir,
                queue.Item(
                    id=note["id"],
                    channel=channel.key,
                    label=channel.label,
                    event=note["event"],
                    payload=note,
                    queued_at=time.time(),
                ),
            )
            n += 1
    if n:
        EventLog(Path(state_dir) / EVENTS_FILE, note["run_id"] or "notify").write(
            ev.NotifyQueued(id=note["id"], event=note["event"], channels=n)
        )
    return n


def on_message(agent: Agent, run_id: str, wake: int, number: int, text: str) -> None:
    """The agent's send_message, queued as sent (the outbox in state/ keeps it too)."""
    emit(
        agent.state_dir,
        agent.notify,
        payload(
            agent.name,
            "message",
            f"{run_id}/message/{number}",
            f"{who(agent.name, agent.dir)} (wake #{wake}) says",
            text,
            run_id,
            {"wake": wake},
        ),
    )


def on_approval(agent: Agent, approval: Approval) -> None:
    """A call that waits for a person: the agent, the exact call, the model's words, and links to
    approve or deny on the console (records/approval_links.py) when WAKELOOP_CONSOLE_URL says where
    it is; the CLI's commands always. Every channel escapes all of it as the agent's text (channels.py)."""
    base = approval_links.console_url()
    links = approval_links.links_for(agent.dir.parent, agent.dir.name, approval, base) if base else {}
    bash = approval.tool == "bash"
    call = shown(
        str(approval.input.get("command", "")) if bash else json.dumps(approval.input, ensure_ascii=False), "\n\t"
    )
    lines = [f"{who(agent.name, agent.dir)} asks to run {approval.tool} (rule {approval.rule}).", ""]
    if links:  # first: the text is cut at TEXT_CAP, and the call may be long
        lines += [f"Approve: {links['approve']}", f"Deny: {links['deny']}"]
    lines += [
        f"Or: `wakeloop approve {agent.dir} {approval.id}` / `wakeloop deny {agent.dir} {approval.id} --reason TEXT`",
        f"Unanswered by {approval.expires}, it is denied.",
        "",
        "The call:",
        call[:CALL_CAP] + (f" [... {len(call) - CALL_CAP:,} more characters]" if len(call) > CALL_CAP else ""),
    ]
    if approval.words:
        lines += ["", "Its words just before:", shown(approval.words, keep="\n\t")]
    emit(
        agent.state_dir,
        agent.notify,
        payload(
            agent.name,
            "approval",
            f"approval/{approval.id}",
            f"{who(agent.name, agent.dir)}: approval {approval.id} asked",
            "\n".join(lines),
            approval.run_id,
            {
                "approval": approval.id,
                "tool": approval.tool,
                "input": approval.input,
                "words": approval.words,
                "rule": approval.rule,
                "expires": approval.expires,
                "agent_dir": str(agent.dir),
                "approve_url": links.get("approve", ""),
                "deny_url": links.get("deny", ""),
            },
        ),
    )


def after_wake(agent: Agent, receipt: Receipt) -> None:
    """A finished wake: its own news, the health rules, and a digest if a day has turned."""
    r = receipt
    see = f"`wakeloop log {agent.dir} --run {r.run_id}` shows the whole wake."
    if r.status in WAKE_EVENTS and (r.status != "blocked" or _first_today(agent.state_dir, "blocked")):
        emit(
            agent.state_dir,
            agent.notify,
            payload(
                agent.name,
                r.status,
                f"{r.run_id}/{r.status}",
                f"{who(agent.name, agent.dir)}: {r.status.replace('_', ' ')}",
                f"Wake #{r.wake} ended {r.status}: {r.reason}\n{see}",
                r.run_id,
                r.to_dict(),
            ),
        )
    # Waiting for money, or for a node, is not failing; nor is a wake its node's loss cut (node_lost).
    if r.status not in ("blocked", "skipped_node") and not r.node_lost:
        _health(
            agent.state_dir,
            agent.name,
            str(agent.dir),
            agent.notify,
            agent.pause_after_failures,
            ok=r.status not in FAILED,  # blocked is not here: see above
            reason=r.reason,
            run_id=r.run_id,
            wake=r.wake,
        )
    model_warning(agent, r.run_id)
    daily(agent.state_dir, agent.name, agent.notify)


LEGACY_EVERY_DAYS = 7  # a legacy model is said once a week; one that retires soon, once a day


def model_warning(agent: Agent, run_id: str = "") -> None:
    """The agent's model is legacy, or retires within 60 days (records/models.py): said at a wake's
    end, once a UTC day when it retires soon, once a week when it is only legacy."""
    said = lifecycle_warning(agent.model)
    info = model_info(agent.model)
    if not said or info is None:
        return
    every = 1 if info.retires_at or info.lifecycle == "retired" else LEGACY_EVERY_DAYS
    if not _first_in(agent.state_dir, "model_warning", every):
        return
    emit(
        agent.state_dir,
        agent.notify,
        payload(
            agent.name,
            "model_warning",
            f"model/{agent.model}/{datetime.now(UTC):%Y-%m-%d}",
            f"{who(agent.name, agent.dir)}: model {info.lifecycle}",
            f"{said}. Change `model:` in {agent.dir}/agent.yaml; thinking blocks are bound to a model, "
            "so the switch is yours to make.",
            run_id,
            {"model": agent.model, "lifecycle": info.lifecycle, "retires_at": info.retires_at},
        ),
    )


def no_room(agent: Agent, run_id: str, wake: int, reason: str) -> None:
    """A call the disk guard did not start (sandbox/disks/disk.py): the disks' filesystem lacked room
    for the worst case of the calls in flight. Once a UTC day per agent, as `blocked`."""
    if _first_today(agent.state_dir, "no_room"):
        emit(
            agent.state_dir,
            agent.notify,
            payload(
                agent.name,
                "no_room",
                f"{run_id}/no_room",
                f"{who(agent.name, agent.dir)}: no room on the disks",
                f"Wake #{wake}: a call did not start: {reason}\n`wakeloop disk list` shows what the disks "
                f"promise, hold and have free.",
                run_id,
                {"wake": wake, "reason": reason},
            ),
        )


def unavailable(agent: Agent, receipt: Receipt) -> None:
    """Past one host, the agent's node does not answer (broker/nodes.py): its wakes are skipped,
    not failed, until it does. Queued at the first skipped wake of a series, not at each."""
    emit(
        agent.state_dir,
        agent.notify,
        payload(
            agent.name,
            "unavailable",
            f"{receipt.run_id}/unavailable",
            f"{who(agent.name, agent.dir)}: unavailable",
            f"Wake #{receipt.wake} was skipped: {receipt.reason}\nIts wakes are skipped, not failed, until "
            "its node answers again; it is not moved (`wakeloop status` shows its node).",
            receipt.run_id,
            receipt.to_dict(),
        ),
    )


def not_started(agent_dir: Path, name: str, channels: tuple[Channel, ...], pause_after: int, reason: str) -> None:
    """A wake that could not start (bad config, no engine, no broker): in its events, its health, and out."""
    state_dir = Path(agent_dir) / "state"
    state_dir.mkdir(mode=0o700, exist_ok=True)
    EventLog(state_dir / EVENTS_FILE, "not-started").write(ev.WakeNotStarted(reason=reason))
    _health(state_dir, name, str(agent_dir), channels, pause_after, ok=False, reason=reason, run_id="", wake=None)


def _health(
    state_dir: Path,
    name: str,
    where: str,
    channels: tuple[Channel, ...],
    pause_after: int,
    *,
    ok: bool,
    reason: str,
    run_id: str,
    wake: int | None,
) -> None:
    shown = who(name, where)
    h, said = health.record(
        state_dir,
        ok,
        reason,
        at=time.time(),
        at_iso=now_iso(),
        pause_after=pause_after,
        fatal=not ok and "HTTP 401" in reason,
    )
    if said:
        EventLog(Path(state_dir) / EVENTS_FILE, run_id or "health").write(
            ev.Health(said=tuple(said), failures=h.failures, paused=h.paused, reason=reason)
        )
    series = h.failing_since or now_iso()  # one series of failures: its notes share ids
    texts = {
        "failing": (
            f"{shown} is failing",
            f"{h.failures} failed wake(s) in a row since {h.failing_since}; last: "
            f"{reason}\nBacking off between wakes; paused after {pause_after}.",
        ),
        "paused": (
            f"{shown} is paused",
            f"{h.paused_reason}\nNo wake runs until you fix it and resume: `wakeloop resume {where}`.",
        ),
        "recovered": (f"{shown} recovered", f"Wake #{wake} finished normally; the failures are over."),
    }
    for event in said:
        title, text = texts[event]
        emit(
            state_dir,
            channels,
            payload(
                name,
                event,
                f"{event}/{series if event != 'recovered' else run_id}",
                title,
                text,
                run_id,
                {"failures": h.failures, "reason": reason},
            ),
        )


def _first_today(state_dir: Path, what: str) -> bool:
    """True once per UTC day for `what`: a wake blocked by the USD cap is blocked every tick until
    midnight, and one notification says so."""
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    marker = f"{queue.NOTIFY_DIR}/{what}.day"
    try:  # safeio/folder.py: no link followed, capped
        if state_folder(state_dir).read_text(marker, MARKER_CAP).strip() == today:
            return False
    except OSError:
        pass
    state_folder(state_dir).write_atomic(marker, today, create_dirs=True)
    return True


def _first_in(state_dir: Path, what: str, days: int) -> bool:
    """True when `what` was last said `days` or more UTC days ago (or never); marks today."""
    today = datetime.now(UTC).date()
    marker = f"{queue.NOTIFY_DIR}/{what}.day"
    try:  # safeio/folder.py: no link followed, capped
        last = datetime.strptime(state_folder(state_dir).read_text(marker, MARKER_CAP).strip(), "%Y-%m-%d").date()
        if (today - last).days < days:
            return False
    except (OSError, ValueError):
        pass
    state_folder(state_dir).write_atomic(marker, today.isoformat(), create_dirs=True)
    return True


def daily(state_dir: Path, name: str, channels: tuple[Channel, ...], today: str | None = None) -> None:
    """At the first wake of a UTC day, a digest of the last day digested (only if a channel asked)."""
    if not any("daily" in c.on for c in channels):
        return
    today = today or datetime.now(UTC).strftime("%Y-%m-%d")
    marker = f"{queue.NOTIFY_DIR}/{DAILY_FILE}"
    try:  # safeio/folder.py: no link followed, capped
        last = state_folder(state_dir).read_text(marker, MARKER_CAP).strip()
    except OSError:
        last = ""
    if last == today:
        return
    if last:
        emit(state_dir, channels, digest(state_dir, name, last))
    state_folder(state_dir).write_atomic(marker, today, create_dirs=True)


def digest(state_dir: Path, name: str, day: str) -> queue.Payload:
    """One day's wakes, statuses, cost per model and messages, from the event log."""
    records = [e.record for e in read_history(Path(state_dir)) if e.timestamp.startswith(day)]  # rotated too
    receipts = [r.receipt for r in records if isinstance(r, ev.WakeFinished) and r.receipt]
    statuses = Counter(r.status for r in receipts)
    cost: defaultdict[str, float] = defaultdict(float)
    unknown = {r.model or "?" for r in receipts if r.live and r.usd is None}
    for r in receipts:
        cost[r.model or "?"] += r.usd or 0.0
    messages = sum(1 for r in records if isinstance(r, ev.ToolCall) and r.tool == "send_message")
    lines = [
        f"{len(receipts)} wake(s): " + (", ".join(f"{n} {s}" for s, n in statuses.most_common()) or "none"),
        "cost: "
        + (
            ", ".join(
                f"{'unknown (no price)' if model in unknown else f'${usd:.4f}'} {model}" for model, usd in cost.items()
            )
            or "$0"
        ),
        f"messages from the agent: {messages}",
    ]
    return payload(
        name,
        "daily",
        f"daily/{day}",
        f"{who(name, Path(state_dir).parent)}: {day}",
        "\n".join(lines),
        "",
        {
            "day": day,
            "wakes": len(receipts),
            "statuses": dict(statuses),
            "usd_by_model": {m: None if m in unknown else usd for m, usd in cost.items()},
            "messages": messages,
        },
    )
