"""What a person reads about agents: status, the fleet table, the event log.

The one place records are rendered. Each view is two steps: a function that
gathers plain data (a dict, what `--json` prints and a console would show)
and one that renders it as text. Records (records/) hold data and never
format it; no other module builds a status line.

Not here: reading the files themselves (records/), scheduling (scheduler.py).
"""

from __future__ import annotations

import json
import os
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.fleet.control import scheduler_note
from orchestrator.notify import queue
from orchestrator.fleet.schedule import agent_dirs, next_wake, stamp, utcnow
from orchestrator.policy.agent import Agent, load_agent
from orchestrator.records.events import Event
from orchestrator.records.receipt import Receipt
from orchestrator.records import health, placement, retention, stopswitch
from orchestrator.records.ledger import FLEET_BOOKS, LedgerError, read_book
from orchestrator.policy.fleetbudget import load_fleet_budget
from orchestrator.records.state import count_messages, load_state, lock_holder, peek_inbox, read_outbox, unread_outbox
from orchestrator.records.models import lifecycle_warning
from orchestrator.records.tasks import TaskError, open_tasks
from orchestrator.records.transcript import find_run, read_lines
from orchestrator.sandbox.disks import disk_index, disk_survey
from orchestrator.sandbox.containers.output import clean
from orchestrator.views.egressview import summary as egress_summary

LOG_VALUE_CAP = 160  # chars of one field on a readable log line
COST_DAYS = 30  # the fleet's cost chart: this many UTC days up to today
CELL_CHARS = 60  # a table cell is cut to this, at a word boundary; --json has it whole


# -- one agent ------------------------------------------------------------------------------


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


def _health_line(h: dict) -> str:
    if h["paused"]:
        return f"PAUSED: {h['paused_reason']}"
    if h["failures"]:
        return f"failing since {h['failing_since']} ({h['failures']} in a row): {h['last_reason']}"
    return "ok"


def disk_status(agent: Agent) -> dict:
    """The workspace's disk use against sandbox.disk and sandbox.files: read from its
    mount over workspace/ while a command has it attached, else from its image's blocks
    on this host (the folder's disk, by its identity: disk_index.lookup); under compose only
    the broker has either."""
    box = agent.policy.sandbox
    data = {"limit_bytes": box.disk or None, "limit_files": box.files if box.disk else None}
    if not box.disk:
        return data
    ws = Path(agent.workspace)
    try:
        mounted = ws.stat().st_dev != ws.parent.stat().st_dev
        vfs = os.statvfs(ws) if mounted else None
    except OSError:
        vfs = None
    if vfs:
        return data | {
            "used_bytes": (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize,
            "size_bytes": vfs.f_blocks * vfs.f_frsize,
            "used_files": vfs.f_files - vfs.f_ffree,
        }
    key = disk_index.lookup(agent.dir.resolve())
    held = disk_survey.usage(key) if key else None
    return data | ({"host_bytes": held[0], "size_bytes": held[1]} if held else {"attached": False})


def disk_record(r: disk_survey.DiskRecord) -> dict:
    """One disk of `wakeloop disk list`, as data (--json)."""
    return {
        "folder": r.folder,
        "folder_found": r.folder_found,
        "image": str(r.image),
        "key": r.key,
        "size_bytes": r.size,
        "host_bytes": r.host_bytes,
        "attached": bool(r.devices),
        "devices": list(r.devices),
        "mounted_at": list(r.mounts),
        "held": r.held,
        "adopted": r.adopted,
        "in_flight": r.in_flight,
    }


def render_disks(records: list, where: Path, fs: disk_survey.Filesystem | None = None) -> str:
    """`wakeloop disk list`: one block per disk, for a person; then what they promise
    together, what they hold, and what their filesystem `fs` has free."""
    if not records:
        return f"no disks in {where}\n"
    lines = []
    for r in records:
        if r.folder_found:
            folder = str(r.folder)
        elif r.folder:
            folder = f"{r.folder} (last seen there; not found under ROOT)"
        else:
            folder = "no folder known (named the old way and not adopted yet, or its folder is gone)"
        if not r.devices:
            attached = "not attached"
        else:
            mounted = f"mounted at {', '.join(r.mounts)}" if r.mounts else "not mounted here"
            attached = (
                f"attached as {', '.join(r.devices)}, {mounted}{', in use' if r.held else ''}"
                f"{', a call running' if r.in_flight else ''}"
            )
        lines += [
            folder,
            f"  image {r.image}",
            f"  {_mib(r.size)} promised, {_mib(r.host_bytes)} held on the host; {attached}",
        ]
    if fs:
        promised, used = sum(r.size for r in records), sum(r.host_bytes for r in records)
        lines.append(
            f"{len(records)} disk(s) in {where}: {_gib(promised)} promised ({promised / fs.size:.1f}x "
            f"the filesystem), {_gib(used)} used; the filesystem has {_gib(fs.free)} free of "
            f"{_gib(fs.size)} ({_gib(fs.reserve)} of it a reserve no call may take)"
        )
    return "\n".join(lines) + "\n"


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def _render_state(d: dict) -> str:
    return (
        f"{_mib(d['bytes'])} on the host (the log rotates past {_mib(d['rotate_bytes'])} or "
        f"{d['rotate_days']:g} day(s); rotated files kept {d['keep_days']:g} days, "
        f"at most {_mib(d['keep_bytes'])})"
    )


def _render_disk(d: dict) -> str:
    if not d["limit_bytes"]:
        return "none (sandbox.disk: none): a plain folder, no limit"
    limit = f"{_mib(d['limit_bytes'])} and {d['limit_files']:,} files"
    if "used_bytes" in d:
        return f"{_mib(d['used_bytes'])} of {_mib(d['size_bytes'])} used, {d['used_files']:,} files (limit {limit})"
    if "host_bytes" in d:
        return f"{_mib(d['host_bytes'])} held on the host of {_mib(d['size_bytes'])} (limit {limit}; not mounted here)"
    return f"limit {limit}; no disk on this host yet (made at the first wake; under compose the broker has it)"


def _usd(usd: float, unpriced: int) -> str:
    """A cost with calls of unknown price in it is unknown, never shown as $0."""
    if not unpriced:
        return f"${usd:.4f}"
    return f"unknown ({unpriced} call(s) at no known price, plus ${usd:.4f})"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


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
    lines.append(f"  disk         {_render_disk(d['disk'])}")
    if r and r.no_room:  # the disk guard (sandbox/disks/disk.py) did not start a call of the last wake
        lines.append(f"    no room    a call of the last wake did not start: {r.no_room}")
    lines.append(f"  state/       {_render_state(d['state'])}")
    lines.append(f"  lock         {'held by ' + d['lock'] if d['lock'] else 'free'}")
    lines.append(f"  inbox        {d['inbox_waiting']} message(s) waiting")
    lines.append(f"  outbox       {d['outbox_messages']} message(s) from the agent")
    lines.append(
        f"  health       {_health_line(d['health'])}"
        + (f" (`wakeloop resume {d['dir']}`)" if d["health"]["paused"] else "")
    )
    n = d["notify"]
    lines.append(f"  notify       {n['sent']} sent, {n['waiting']} waiting, {len(n['gave_up'])} given up")
    lines += [f"    retrying   {line}" for line in n["retrying"][:3]]
    lines += [f"    gave up    {clean(line)}" for line in n["gave_up"][-3:]]
    if d["warning"]:
        lines.append(f"  {d['warning']}")
    return "\n".join(lines)


# -- every agent under ROOT -----------------------------------------------------------------

STATUS_HEADER = [
    "AGENT",
    "MODE",
    "LAST WAKE",
    "RESULT",
    "NEXT WAKE",
    "HEALTH",
    "TOKENS TODAY",
    "TOKENS TOTAL",
    "USD TODAY",
    "USD TOTAL",
    "OPEN TASKS",
    "UNREAD OUTBOX",
]
_ROW_KEYS = [
    "agent",
    "mode",
    "last_wake",
    "result",
    "next_wake",
    "health",
    "tokens_today",
    "tokens_total",
    "usd_today",
    "usd_total",
    "open_tasks",
    "unread_outbox",
]


def fleet_status(root: Path, now: datetime | None = None, load=load_agent) -> list[dict]:
    """One dict per agent under ROOT (a config error is a row that says so).
    `load`: how an agent is loaded (the console passes a cached load_agent)."""
    now = now or utcnow()
    no_scheduler = scheduler_note(root) is not None
    return [fleet_row(path, now, no_scheduler, load) for path in agent_dirs(root)]


def fleet_row(path: Path, now: datetime, no_scheduler: bool, load=load_agent) -> dict:
    """One agent's row of the fleet table."""
    sd = path / "state"
    try:
        agent = load(path)
    except (ConfigError, ValueError) as exc:
        return {
            "agent": path.name,
            "dir_name": path.name,
            "mode": "-",
            "last_wake": "config error",
            "result": str(exc),
            "error": str(exc),
            "state": "config error",
        }
    state, _ = load_state(sd)
    r = state.last_receipt
    nxt = next_wake(path, agent.schedule, now, agent.timezone)
    h = health_status(sd)[0]
    row = {
        "agent": agent.name,
        "mode": "dry" if agent.dry_run else "live",
        "last_wake": _short_time(r.started_at, now) if r else "never",
        "result": f"#{r.wake} {r.status}" if r else "-",
        "next_wake": (
            "fleet stopped"
            if stopswitch.is_stopped(path.parent)
            else "paused"
            if h["paused"]
            else "no scheduler"
            if no_scheduler
            else stamp(nxt)
            if nxt
            else "bad schedule"
        ),
        "next_wake_at": nxt.timestamp() if nxt else None,
        "health": _health_line(h),
        "tokens_total": f"{state.tokens_lifetime:,}",
        "unread_outbox": str(unread_outbox(sd)),
        "dir_name": path.name,
        "receipt": r.to_dict() if r else None,
        "health_detail": h,
        "running": current_wake(sd),
        "disk": disk_status(agent),
        "model": agent.model,
        "model_warning": lifecycle_warning(agent.model),
    }
    row["state"] = "running" if row["running"] else "paused" if h["paused"] else "failing" if h["failures"] else "ok"
    row["node"] = placement.read_node(sd) or "-"  # past one host: the node it is placed on
    if not h["paused"] and r and r.status == "skipped_node":
        row["state"] = "unavailable"  # its node's broker does not answer: not failing, waiting
        row["health"] = f"unavailable (node {row['node']} does not answer)"
    try:
        book = read_book(sd)
        day = book.day(now.strftime("%Y-%m-%d"))
        row.update(
            usd_today="unknown" if day.unpriced else f"${day.usd:.4f}",
            usd_total="unknown" if book.lifetime.unpriced else f"${book.lifetime.usd:.4f}",
            tokens_today=f"{day.tokens:,}",
            usd_by_day=usd_by_day(book, now, COST_DAYS),
        )
        row["usd_30d"] = round(sum(usd for _, usd in row["usd_by_day"]), 6)
    except LedgerError:
        row.update(
            usd_today="? (ledger unreadable)", usd_total="? (ledger unreadable)", tokens_today="? (ledger unreadable)"
        )
    try:
        row["open_tasks"] = str(len(open_tasks(sd)))
    except TaskError:
        row["open_tasks"] = "?"
    return row


def usd_by_day(book, now: datetime, days: int) -> list[tuple[str, float]]:
    """The ledger's USD per UTC day for the `days` days up to `now`, oldest first (0 for none)."""
    dates = [(now - timedelta(days=n)).strftime("%Y-%m-%d") for n in range(days - 1, -1, -1)]
    return [(d, round(book.days[d].usd, 6) if d in book.days else 0.0) for d in dates]


def current_wake(sd: Path) -> dict | None:
    """The wake running now (its lock is held by a live process): its run and its step so far,
    from its transcript, the newest. None when no wake runs."""
    holder = lock_holder(sd)
    if holder is None:
        return None
    newest = find_run(sd, None)
    lines = list(read_lines(newest)) if newest else []
    if newest is None or not lines or lines[-1]["type"] == "end" or lines[0]["type"] != "wake":
        return {"run_id": None, "step": 0, "started_at": holder.started, "pid": holder.pid}
    steps = [line["step"] for line in lines if isinstance(line.get("step"), int)]
    return {"run_id": newest.stem, "step": max(steps, default=0), "started_at": lines[0].get("t"), "pid": holder.pid}


def render_fleet(rows: list[dict], root: Path) -> str:
    if not rows:
        return f"no agents under {root}: create one with `wakeloop init {root}/NAME`"
    spread = any(r.get("node", "-") != "-" for r in rows)  # a swarm's agents: one more column, NODE
    keys, header = (_ROW_KEYS + ["node"], STATUS_HEADER + ["NODE"]) if spread else (_ROW_KEYS, STATUS_HEADER)
    cells = [[_cut(str(r.get(k, "-")), CELL_CHARS) for k in keys] for r in rows]
    table = [header, *cells]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    notes = [n for n in (*fleet_notes(root), scheduler_note(root)) if n]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    warned = [clean(f"{r['agent']}: {r['model_warning']}") for r in rows if r.get("model_warning")]  # below the table
    return "\n".join(notes + lines + warned)


def fleet_notes(root: Path) -> list[str]:
    """Lines about the whole fleet, above its table: the switch (ROOT/STOP), and the
    fleet's spending where a budget caps it (ROOT/budget.yaml, or the ceiling)."""
    halted = stopswitch.read(root)
    budget = fleet_budget(root)
    return ([f"STOPPED: {halted.describe()}"] if halted else []) + (
        [budget_line(budget)] if "error" in budget or budget["capped"] else []
    )


def fleet_budget(root: Path) -> dict:
    """What all agents under ROOT spent today and this month (UTC), against the fleet's caps."""
    try:
        caps = load_fleet_budget(root)
        spent = FLEET_BOOKS.spent(root)
    except ConfigError as exc:  # a bad budget.yaml or ceiling, an unreadable ledger: said, not raised
        return {"error": str(exc)}
    return {
        "usd_today": round(spent.today, 6),
        "usd_month": round(spent.month, 6),
        "unreadable": spent.unreadable,
        "max_usd_per_day": caps.max_usd_per_day or None,
        "max_usd_per_month": caps.max_usd_per_month or None,
        "capped": bool(caps),
        "source": caps.source,
    }


def budget_line(b: dict) -> str:
    if "error" in b:
        return f"fleet budget: {b['error']}"
    of = lambda cap: f" of ${cap:,.2f}" if cap else " (no cap)"
    return (
        f"fleet spend: ${b['usd_today']:.4f} today{of(b['max_usd_per_day'])}, "
        f"${b['usd_month']:.4f} this month{of(b['max_usd_per_month'])}"
        + (f" ({b['source']})" if b["source"] else "; ROOT/budget.yaml would cap all agents together")
        + (f"; {b['unreadable']} agent ledger(s) unreadable, left out of the sum" if b.get("unreadable") else "")
    )


def status_table(root: Path) -> str:
    return render_fleet(fleet_status(Path(root)), root)


def _short_time(iso: str | None, now: datetime) -> str:
    try:
        t = datetime.fromisoformat(str(iso).replace("Z", "+00:00"))
    except ValueError:
        return str(iso or "-")
    return stamp(t)


def _cut(text: str, width: int) -> str:
    """At most `width` characters, cut at a word boundary (--json keeps the whole text)."""
    return text if len(text) <= width else textwrap.shorten(text, width, placeholder="...")


def format_event(event: Event) -> str:
    """One readable line for `wakeloop log`; untrusted text is cleaned and cut."""
    fields = []
    for key, value in event.data.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        text = clean(" ".join(text.split()))
        fields.append(f"{key}={text[:LOG_VALUE_CAP]}{'...' if len(text) > LOG_VALUE_CAP else ''}")
    return f"{event.timestamp}  {event.run_id[:8]}  {event.type:<15} {' '.join(fields)}"
