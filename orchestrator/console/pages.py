"""What each page shows, as plain data, from the same readers as the CLI.

Fleet: views.fleet_status (the rows of `status ROOT`). Agent: views.agent_status
(`status AGENT`), the wake history (fleet/wake_history.py), the ledger's cost per
day, the mandate and the policy as loaded, tasks, the outbox. A wake: its
transcript (records/transcript.py), grouped into turns, and its egress
decisions (records/egress.py).

Agents are found by listing ROOT (schedule.agent_dirs) and named by their
folder: a name from a URL is used only when it is a plain folder name (no
slash, no leading dot) that holds agent.yaml and is not a link (a link's
folder is neither shown nor acted on).

Loading an agent (agent.yaml and its policy) takes a millisecond or two, so
a page of 100 agents keeps them in AgentCache, reloaded when agent.yaml
changes or after RELOAD_S (a policy file edited in place). A fleet row
(views.fleet_row: 3-4 ms with a cron line, a year of ledger and a disk to
measure) is kept in RowCache while none of the files it is read from has
changed (a stat each), until the agent's next wake is due, and at most
ROW_TTL_S (what no file says: the disk's use, the day); an agent whose wake
runs is read afresh on every view.

The rows are kept on disk too (ROWS_FILE in ROOT, the operator's folder,
written whole; read capped, through no link), so that the first view after
serve restarts costs a stat per file instead of loading every agent (the
first view of 100 agents is otherwise ~0.5 s of CPU). A kept row is used
only for the folder it is kept under (whatever it says), while every file
it was read from stands, on the UTC day it was read and before the wake it
announced, and for as long after the restart as a row read then would be;
anything wrong with the file and it is ignored (the rows are read again),
and a row the page cannot show is forgotten (console/app.py _fleet_html).

Not here: the rows' and the status's contents (views/fleet_table.py, agent_status.py), the wake
history (fleet/wake_history.py), HTML (templates/).
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import yaml

from orchestrator.broker.client import read_wake_diff
from orchestrator.errors import ConfigError, WakeloopError
from orchestrator.fleet.control import scheduler_note
from orchestrator.fleet.schedule import agent_dirs, next_wake, stamp, utcnow
from orchestrator.fleet.wake_history import WakeIndex
from orchestrator.policy.agent import Agent, load_agent
from orchestrator.records import egress, stopswitch
from orchestrator.records.ledger import LedgerError, read_book
from orchestrator.records.receipt import Usage
from orchestrator.records.run_ids import RunIdError, resolve
from orchestrator.records.state import read_outbox, split_messages
from orchestrator.records.tasks import TaskError, load_tasks
from orchestrator.records.transcript import prompt_text, read_lines, transcript_path
from orchestrator.safeio.folder import Folder
from orchestrator.views import diffview
from orchestrator.views.agent_status import agent_status
from orchestrator.views.budgetview import COST_DAYS, budget_line, fleet_budget, usd_by_day
from orchestrator.views.egressview import size
from orchestrator.views.fleet_table import current_wake, fleet_row
from orchestrator.wake.editor_tool import call_diff

RELOAD_S = 5.0  # a cached agent is loaded again at least this often
ROW_TTL_S = 120.0  # a cached fleet row is read again at least this often (plus jitter)
ROWS_FILE = ".console-rows.json"  # in ROOT: the fleet rows as the console last saw them
ROWS_VERSION = 1  # bumped whenever a row's shape changes
ROWS_CAP = 32 * 2**20  # bytes of ROWS_FILE read (100 agents' rows are ~0.3 MB)
ROWS_SAVE_S = 10.0  # the rows are written at most this often
LOCK = "state/wake.lock"  # there while a wake runs
ROW_SOURCES = (
    "agent.yaml",
    "state/state.json",
    "state/ledger.json",
    "state/health.json",
    "state/tasks.json",
    "state/outbox.txt",
    "state/outbox.read",
    "state/schedule.json",
    "state/notify/queue",
    "state/notify/done.jsonl",
    LOCK,
)
WAKES_SHOWN = 100  # rows of wake history on an agent's page
AGENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")  # a folder name: no path, never . or ..
MANDATE_CAP = 64 * 1024  # chars of mandate.md shown
EGRESS_SHOWN = 500  # egress decisions listed on a wake's page; the rest are counted (`log --egress` has them)


class NotFound(LookupError):
    pass


class AgentCache:
    def __init__(self):
        self._agents: dict[Path, tuple[tuple, float, Agent]] = {}
        self._lock = threading.Lock()

    def load(self, path: Path) -> Agent:
        st = (path / "agent.yaml").stat()
        key = (st.st_mtime_ns, st.st_size)
        with self._lock:
            hit = self._agents.get(path)
        if hit and hit[0] == key and time.monotonic() - hit[1] < RELOAD_S:
            return hit[2]
        agent = load_agent(path)  # an error is raised, never cached
        with self._lock:
            self._agents[path] = (key, time.monotonic(), agent)
        return agent


class RowCache:
    """Fleet rows kept between views while what they are read from stands (see the docstring)."""

    def __init__(self, root: Path | None = None):
        self._rows: dict[Path, tuple[tuple, float, dict]] = {}
        self._jitter = random.Random()
        self._root = root
        self._dirty, self._saved = False, 0.0
        self._kept: set[Path] = set()  # rows taken from ROWS_FILE and not read afresh since
        self._lock = threading.Lock()

    def row(self, path: Path, scheduler_up: bool, compute) -> dict:
        key = (scheduler_up, *_fingerprint(path))
        hit = self._rows.get(path)
        now = time.time()
        if hit and hit[0] == key and now < hit[1]:
            return hit[2]
        row = compute()
        self._kept.discard(path)
        if row.get("state") != "running" and key[-1] is None:  # no wake.lock: nothing moves by itself
            until = now + ROW_TTL_S * (1 + self._jitter.random())  # spread: not every row at once
            if row.get("next_wake_at"):
                until = min(until, row["next_wake_at"])
            self._rows[path] = (key, until, row)
            self._dirty = True
        return row

    # -- on disk ---------------------------------------------------------------------------

    def load(self, paths: list[Path]) -> int:
        """The rows ROWS_FILE keeps for these agent folders, as if read now; how many."""
        if self._root is None:
            return 0
        try:
            data = json.loads(Folder(self._root).read_bytes(ROWS_FILE, ROWS_CAP))
            if data["version"] != ROWS_VERSION or data["day"] != utcnow().strftime("%Y-%m-%d"):
                return 0
            kept = {name: entry for name, entry in data["rows"].items() if isinstance(name, str)}
            now, found = time.time(), {}
            for path in paths:
                entry = kept.get(path.name)
                if not isinstance(entry, dict) or not isinstance(entry["row"], dict):
                    continue
                row = entry["row"] | {"dir_name": path.name}  # its own folder's row, whatever it says
                due = row.get("next_wake_at")
                if row.get("state") == "running" or (
                    due is not None and not (isinstance(due, (int, float)) and due > now)
                ):
                    continue
                until = now + ROW_TTL_S * (1 + self._jitter.random())  # as a row read now would be
                found[path] = (_tuple(entry["key"]), min(until, due) if due else until, row)
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
            return 0
        self._rows.update(found)
        self._kept.update(found)
        return len(found)

    def forget_kept(self) -> None:
        """Drop every row still as ROWS_FILE had it (the page could not show one)."""
        kept, self._kept = self._kept, set()
        for path in kept:
            self._rows.pop(path, None)

    def save(self) -> None:
        """ROWS_FILE written whole, at most every ROWS_SAVE_S and only when a row changed."""
        now = time.time()
        if self._root is None or not self._dirty or now - self._saved < ROWS_SAVE_S:
            return
        with self._lock:
            self._dirty, self._saved = False, now
            rows = {p.name: {"key": key, "row": row} for p, (key, _, row) in list(self._rows.items())}
            try:
                text = json.dumps(
                    {"version": ROWS_VERSION, "day": utcnow().strftime("%Y-%m-%d"), "rows": rows},
                    separators=(",", ":"),
                    default=str,
                )
                Folder(self._root).write_atomic(ROWS_FILE, text)
            except (OSError, ValueError, TypeError):
                pass  # not kept: the next start reads the rows again


def _tuple(value):
    """A key read back from JSON: lists are tuples again, so it compares equal to a fresh one."""
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


def _fingerprint(path: Path) -> tuple:
    out: list[tuple[int, int, int] | None] = []
    folder = os.fspath(path)
    for rel in ROW_SOURCES:
        try:  # os.path, not pathlib: a fleet view makes 11 of these per agent
            st = os.stat(os.path.join(folder, rel), follow_symlinks=False)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


class Pages:
    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.agents = AgentCache()
        self.rows = RowCache(self.root)
        self._fleet_lock = threading.Lock()
        self._rows_loaded = False
        self._policies: dict[int, tuple[Agent, str]] = {}  # id(agent) -> its policy as YAML (15 ms to dump)
        self.wakes = WakeIndex()

    def agent_dir(self, name: str) -> Path:
        """ROOT/NAME when NAME is a plain folder name holding agent.yaml (agent_dirs' rule), and a
        folder of ROOT's own, not a link to one elsewhere (whose state/ an action would write)."""
        path = self.root / name
        if not AGENT_NAME.fullmatch(name) or path.is_symlink() or not (path / "agent.yaml").is_file():
            raise NotFound(f"no agent named {name!r} under {self.root}")
        return path

    def fleet(self) -> dict:
        with self._fleet_lock:  # one pass at a time: a view during the warm-up waits for its rows
            now, note = utcnow(), scheduler_note(self.root)
            paths = [path for path in agent_dirs(self.root) if not path.is_symlink()]
            if not self._rows_loaded:
                self._rows_loaded = True
                self.rows.load(paths)
            rows = [
                self.rows.row(
                    path, note is None, lambda path=path: fleet_row(path, now, note is not None, self.agents.load)
                )
                for path in paths
            ]
        self.rows.save()
        halted, budget = stopswitch.read(self.root), fleet_budget(self.root)
        return {
            "rows": rows,
            "note": note,
            "root": str(self.root),
            "stopped": halted.describe() if halted else None,
            "budget": budget,
            "budget_line": budget_line(budget),
            "failing": sum(1 for r in rows if r.get("state") in ("failing", "config error")),
            "running": sum(1 for r in rows if r.get("state") == "running"),
        }

    def agent(self, name: str) -> dict:
        path = self.agent_dir(name)
        try:
            agent = self.agents.load(path)
        except (ConfigError, ValueError) as exc:
            return {"name": name, "error": str(exc)}
        sd = agent.state_dir
        now = utcnow()
        status = agent_status(agent)
        nxt = next_wake(path, agent.schedule, now, agent.timezone)
        total, wakes = self.wakes.recent(sd, WAKES_SHOWN)
        try:
            days = usd_by_day(read_book(sd), now, COST_DAYS)
        except LedgerError:
            days = []
        try:
            tasks = [asdict(t) for t in load_tasks(sd)]
            tasks_error = None
        except TaskError as exc:
            tasks, tasks_error = [], str(exc)
        return {
            "name": name,
            "agent": status,
            "next_wake": stamp(nxt) if nxt else None,
            "running": current_wake(sd),
            "wakes": list(reversed(wakes)),
            "wakes_total": total,
            "usd_by_day": days,
            "mandate": _mandate(agent),
            "policy": self._policy(agent),
            "tasks": tasks,
            "tasks_error": tasks_error,
            "outbox": list(reversed(split_messages(read_outbox(sd)))),
        }

    def _policy(self, agent: Agent) -> str:
        hit = self._policies.get(id(agent))
        if hit is None or hit[0] is not agent:
            if len(self._policies) > 4 * len(agent_dirs(self.root)) + 16:
                self._policies.clear()
            hit = self._policies[id(agent)] = (agent, _policy_yaml(agent))
        return hit[1]

    def wake(self, name: str, run_id: str) -> dict:
        path = self.agent_dir(name)
        sd = path / "state"
        run_id = _whole_run_id(sd, run_id, name)
        lines = list(read_lines(transcript_path(sd, run_id)))
        if not lines:
            raise NotFound(f"no transcript of run {run_id} for {name} (pruned, or never written)")
        running = current_wake(sd)
        system = next((line for line in lines if line["type"] == "system"), None)
        return {
            "name": name,
            "run_id": run_id,
            "turns": turns(lines),
            "head": lines[0] if lines[0]["type"] == "wake" else {},
            "end": lines[-1] if lines[-1]["type"] == "end" else None,
            "live": bool(running and running.get("run_id") == run_id),
            "system": prompt_text(sd, str(system.get("hash"))) if system else None,
            **_egress(sd, run_id, lines[0].get("t") if lines[0]["type"] == "wake" else None),
        }

    def wake_diff(self, name: str, run_id: str) -> dict:
        """What wake `run_id` changed in the workspace (sandbox/wakes/wake_diff.py), as diff lines; read on
        the agent's disk (the broker's, under compose), or the one line why not."""
        path = self.agent_dir(name)
        run_id = _whole_run_id(path / "state", run_id, name)
        try:
            diff = read_wake_diff(load_agent(path), run_id)
        except WakeloopError as exc:
            return {"name": name, "run_id": run_id, "lines": [], "error": str(exc)}
        return {"name": name, "run_id": run_id, "lines": diffview.render(diff), "error": None}


def _egress(sd: Path, run_id: str, started: object) -> dict:
    """The run's egress decisions (records/egress.py), the first EGRESS_SHOWN as rows, and all of
    them summed; only the segments rotated after the run `started` (its transcript's first
    line) are read. Host, path and rule came from the box: the template escapes them like any text."""
    rows: list[dict] = []

    def row(line: egress.Decision) -> egress.Decision:
        if len(rows) < EGRESS_SHOWN:
            rows.append({**asdict(line), "up": size(line.bytes_up), "down": size(line.bytes_down)})
        return line

    total = egress.total(map(row, egress.of_run(sd, run_id, started=_utc(started))))
    return {"egress": rows, "egress_total": total, "egress_more": total.decisions - len(rows)}


def _utc(stamp: object) -> datetime | None:
    """An ISO-8601 UTC stamp as written by records (…Z), or None for anything else."""
    try:
        when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.astimezone(UTC) if when.tzinfo is not None else None


def turns(lines: list[dict]) -> list[dict]:
    """Transcript lines grouped by step: what the harness sent, what the model said, what ran."""
    out: list[dict] = []
    results: dict[str, dict] = {}
    call: dict | None
    for line in lines:
        if line["type"] not in ("user", "assistant", "tool_result", "truncated"):
            continue
        if not out or ("step" in line and line.get("step") != out[-1]["step"]):
            out.append({"step": line.get("step"), "user": [], "text": [], "calls": [], "notes": []})
        turn = out[-1]
        if line["type"] == "user":
            turn["user"].append(str(line.get("text", "")))
        elif line["type"] == "assistant":
            turn.update(
                stop_reason=line.get("stop_reason"),
                tokens=Usage.from_json(line.get("usage")).tokens,
                usd_so_far=line.get("usd_so_far"),
                t=line.get("t"),
            )
            for block in line.get("content") or []:
                if block.get("type") == "text":
                    turn["text"].append(str(block.get("text", "")))
                elif block.get("type") == "thinking" and block.get("thinking"):  # 5.x: words between tool calls
                    turn["text"].append(f"(thinking) {block.get('thinking')}")
                elif block.get("type") == "tool_use":
                    call = {
                        "id": block.get("id"),
                        "name": block.get("name"),
                        "input": call_diff(str(block.get("name")), block.get("input"))  # an edit: a small diff
                        or json.dumps(block.get("input"), ensure_ascii=False, indent=1)[:8000],
                        "result": None,
                    }
                    results[str(block.get("id"))] = call
                    turn["calls"].append(call)
        elif line["type"] == "tool_result":
            call = results.get(str(line.get("id")))
            if call is None:
                call = {"id": line.get("id"), "name": line.get("tool"), "input": "", "result": None}
                turn["calls"].append(call)
            call["result"] = line
        else:
            turn["notes"].append(
                f"the transcript reached max_wake_bytes ({line.get('max_wake_bytes', 0):,}): "
                "the rest is counted, not kept"
            )
    return out


def _mandate(agent: Agent) -> str:
    try:  # safeio/folder.py: no link followed, never a FIFO or device (a request would hang)
        return Folder(agent.dir).head("mandate.md", MANDATE_CAP)[:MANDATE_CAP].decode("utf-8", "replace")
    except OSError as exc:
        return f"(mandate.md unreadable: {exc.strerror})"


def _policy_yaml(agent: Agent) -> str:
    """The policy as loaded (defaults filled in), as YAML."""
    plain = json.loads(json.dumps(asdict(agent.policy), default=str))
    return yaml.safe_dump(plain, sort_keys=False, default_flow_style=False)


def _whole_run_id(state_dir: Path, given: str, name: str) -> str:
    """A wake page's run id: whole, or a unique prefix of one (records/run_ids.py), else NotFound."""
    try:
        return resolve(state_dir, given, name)
    except RunIdError as exc:
        raise NotFound(str(exc)) from None
