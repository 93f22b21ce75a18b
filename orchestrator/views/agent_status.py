"""`wakeloop status AGENT_DIR`: one agent's status, as data (what `--json` prints) and as text.

Each view is two steps: a function that gathers plain data (a dict, what
`--json` prints and the console shows) and one that renders it as text.
Records (records/) hold data and never format it; no other module builds an
agent's status line.

Not here: the disk's use and its line (diskview.py), the fleet's table
(fleet_table.py), what the fleet spent (budgetview.py), reading the files
themselves (records/).
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.notify import queue
from orchestrator.policy.agent import Agent
from orchestrator.records import health, retention, stopswitch
from orchestrator.records.ledger import LedgerError, read_book
from orchestrator.records.models import lifecycle_warning
from orchestrator.records.receipt import Receipt
from orchestrator.records.state import count_messages, load_state, lock_holder, peek_inbox, read_outbox
from orchestrator.records.tasks import TaskError, open_tasks
from orchestrator.sandbox.containers.output import clean
from orchestrator.views.diskview import disk_line, disk_status, mib
from orchestrator.views.egressview import summary as egress_summary


def agent_status(agent: Agent) -> dict:
    """`wakeloop status AGENT_DIR` as data. Changes nothing."""
    sd = Path(agent.state_dir)
    state, warning = load_state(sd)
    holder = lock_holder(sd)
    data = {
        "name": agent.name,
        "dir": str(agent.dir),
        "model": agent.model,
        "model_warning": lifecycle_warning(agent.model),  # legacy, or retiring within 60 days
        "dry_run": agent.dry_run,
        "schedule": agent.schedule,
        "wakes": state.wake,
        "tokens_lifetime": state.tokens_lifetime,
        "last_receipt": state.last_receipt.to_dict() if state.last_receipt else None,
        "lock": holder.describe() if holder else None,
        "inbox_waiting": count_messages(peek_inbox(sd)),
        "outbox_messages": count_messages(read_outbox(sd)),
        "warning": warning,
    }
    try:
        book = read_book(sd)
        budget = agent.policy.budget
        data["usd"] = {
            "today": book.day().usd,
            "tokens_today": book.day().tokens,
            "month": book.month(),
            "max_usd_per_day": budget.max_usd_per_day or None,
            "max_usd_per_month": budget.max_usd_per_month or None,
            "lifetime": book.lifetime.usd,
            "unpriced_calls_today": book.day().unpriced,
            "unpriced_calls_lifetime": book.lifetime.unpriced,
        }
    except LedgerError as exc:
        data["usd"] = {"error": str(exc)}
    try:
        data["open_tasks"] = len(open_tasks(sd))
    except TaskError as exc:
        data["open_tasks"] = {"error": str(exc)}
    data["disk"] = disk_status(agent)
    halted = stopswitch.read(agent.dir.parent)
    data["fleet_stopped"] = halted.describe() if halted else None
    data["health"], data["notify"] = health_status(sd)
    rules = agent.policy.state
    data["state"] = {
        "bytes": retention.usage(sd),
        "rotate_bytes": rules.rotate_size,
        "rotate_days": rules.rotate_days,
        "keep_days": rules.keep_days,
        "keep_bytes": rules.keep_size,
    }
    return data


def health_status(sd: Path) -> tuple[dict, dict]:
    """Failures, pause, and the notification queue: waiting, given up (notify/)."""
    h = health.load(sd)
    finished = queue.done(sd)
    waiting = queue.pending(sd)
    return (
        {
            "failures": h.failures,
            "failing_since": h.failing_since or None,
            "last_reason": h.last_reason,
            "paused": h.paused,
            "paused_reason": h.paused_reason,
        },
        {
            "waiting": len(waiting),
            "retrying": [f"{i.label}: {i.last_error}" for i in waiting if i.attempts],
            "sent": sum(1 for d in finished if d.get("outcome") == "sent"),
            "gave_up": [
                f"{d.get('label')}: {d.get('event')} {d.get('id')}: {d.get('detail')}"
                for d in finished
                if d.get("outcome") == "gave_up"
            ],
        },
    )


def health_line(h: dict) -> str:
    if h["paused"]:
        return f"PAUSED: {h['paused_reason']}"
    if h["failures"]:
        return f"failing since {h['failing_since']} ({h['failures']} in a row): {h['last_reason']}"
    return "ok"


def _render_state(d: dict) -> str:
    return (
        f"{mib(d['bytes'])} on the host (the log rotates past {mib(d['rotate_bytes'])} or "
        f"{d['rotate_days']:g} day(s); rotated files kept {d['keep_days']:g} days, "
        f"at most {mib(d['keep_bytes'])})"
    )


def _usd(usd: float, unpriced: int) -> str:
    """A cost with calls of unknown price in it is unknown, never shown as $0."""
    if not unpriced:
        return f"${usd:.4f}"
    return f"unknown ({unpriced} call(s) at no known price, plus ${usd:.4f})"


def render_agent_status(d: dict) -> str:
    mode = "dry run" if d["dry_run"] else "live"
    lines = [f"STOPPED: {d['fleet_stopped']}"] if d.get("fleet_stopped") else []
    lines += [
        f"{d['name']} ({d['dir']})",
        f"  model        {d['model']} ({mode}), schedule {d['schedule']}",
        *([f"    warning    {d['model_warning']}"] if d.get("model_warning") else []),
        f"  wakes        {d['wakes']}",
        f"  tokens       {d['tokens_lifetime']:,} lifetime",
    ]
    r = Receipt.from_json(d["last_receipt"])
    if r:
        lines.append(
            f"  last wake    #{r.wake} {r.status}: {r.reason} "
            f"({r.steps} steps, {r.tokens:,} tokens, "
            f"{r.usage.cache_read_tokens:,} cache reads, {r.tool_calls} tool calls, "
            f"{r.duration_ms / 1000:.1f}s) at {r.started_at}"
        )
        if r.egress.decisions:  # `wakeloop log AGENT --egress --run last` lists them
            lines.append(f"  egress       {egress_summary(r.egress)}")
        lines.append(f"  receipt      {json.dumps(d['last_receipt'], ensure_ascii=False)}")
    else:
        lines.append("  last wake    (none yet)")
    usd = d["usd"]
    if "error" in usd:
        lines.append(f"  usd          {usd['error']}")
    else:
        cap = lambda c: f" of ${c:,.2f}" if c else ""
        lines.append(
            f"  usd          {_usd(usd['today'], usd['unpriced_calls_today'])} today"
            f"{cap(usd['max_usd_per_day'])} ({usd['tokens_today']:,} tokens), "
            f"${usd['month']:.4f} this month{cap(usd['max_usd_per_month'])}, "
            f"{_usd(usd['lifetime'], usd['unpriced_calls_lifetime'])} lifetime"
        )
    tasks = d["open_tasks"]
    lines.append(
        f"  tasks        {tasks['error']}"
        if isinstance(tasks, dict)
        else f"  tasks        {tasks} open (`wakeloop task list {d['dir']}`)"
    )
    lines.append(f"  disk         {disk_line(d['disk'])}")
    if r and r.no_room:  # the disk guard (sandbox/disks/disk.py) did not start a call of the last wake
        lines.append(f"    no room    a call of the last wake did not start: {r.no_room}")
    lines.append(f"  state/       {_render_state(d['state'])}")
    lines.append(f"  lock         {'held by ' + d['lock'] if d['lock'] else 'free'}")
    lines.append(f"  inbox        {d['inbox_waiting']} message(s) waiting")
    lines.append(f"  outbox       {d['outbox_messages']} message(s) from the agent")
    lines.append(
        f"  health       {health_line(d['health'])}"
        + (f" (`wakeloop resume {d['dir']}`)" if d["health"]["paused"] else "")
    )
    n = d["notify"]
    lines.append(f"  notify       {n['sent']} sent, {n['waiting']} waiting, {len(n['gave_up'])} given up")
    lines += [f"    retrying   {line}" for line in n["retrying"][:3]]
    lines += [f"    gave up    {clean(line)}" for line in n["gave_up"][-3:]]
    if d["warning"]:
        lines.append(f"  {d['warning']}")
    return "\n".join(lines)
