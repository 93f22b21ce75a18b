"""Tasks: a human's queue of work for one agent, in state/tasks.json (seed 001).

A task moves todo -> claimed -> done | failed. Each live wake claims one: a
task a previous wake claimed and never closed first (it carries on), else the
oldest todo. The wake names it in its first user message; the agent closes it
with the host-side `complete_task` tool. The file lives in state/, which no
sandbox mounts, so the agent can change a task only through that tool.
A dry run names the same task in its first message (`next_task`) and leaves
it as it found it: a scripted model does no task's work. A person may cancel
an open task (`cancelled`, kept in the list with their note) or remove any
task from the list (`wakeloop task cancel|rm`).

Every change is a read-modify-write under an flock, written atomically (temp
file, fsync, rename), so `task add` from a shell never races a wake's claim
and a kill -9 leaves the old file or the new one.

Not here: the registry that offers complete_task (tools.py) or when a wake claims (loop.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.safeio.atomic import locked
from orchestrator.safeio.folder import RECORD_CAP, state_folder
from orchestrator.safeio.jsontext import loads

TASKS_FILE = "tasks.json"
TASKS_LOCK = "tasks.lock"
MAX_TITLE_CHARS = 2000  # a task is a line of intent, not a document
MAX_NOTE_CHARS = 2000  # what the agent may say when closing one
STATUSES = ("todo", "claimed", "done", "failed", "cancelled")
OPEN = ("todo", "claimed")


class TaskError(ConfigError):
    """A bad task request: one line for the human or the model."""


@dataclass(frozen=True)
class Task:
    id: str  # t1, t2, ...: short enough for a person to type
    title: str
    status: str = "todo"
    created: str = ""
    claimed_by: str = ""  # run id of the wake that claimed it
    claimed_at: str = ""
    finished_at: str = ""
    note: str = ""  # the agent's closing words

    def describe(self) -> str:
        return f"{self.id} [{self.status}] {self.title}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def load_tasks(state_dir: Path) -> list[Task]:
    """Every task, oldest first; a missing file is no tasks, a broken one says so."""
    return _read(state_dir)[0]


def _read(state_dir: Path) -> tuple[list[Task], int]:
    """The tasks, and the highest task number ever given (`last`: a removed task's id is not
    given again, so an event naming it names one task)."""
    path = Path(state_dir) / TASKS_FILE
    try:
        raw = loads(state_folder(state_dir).read_text(TASKS_FILE, RECORD_CAP))
    except FileNotFoundError:
        return [], 0
    except (OSError, ValueError) as exc:
        raise TaskError(f"{path}: unreadable ({exc}); fix or remove it") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("tasks"), list):
        raise TaskError(f'{path}: expected {{"tasks": [...]}}; fix or remove it')
    known = set(Task.__dataclass_fields__)
    tasks = []
    for item in raw["tasks"]:
        if isinstance(item, dict) and item.get("status") in STATUSES and item.get("id"):
            tasks.append(Task(**{k: str(v) for k, v in item.items() if k in known}))
    last = raw.get("last")
    return tasks, last if isinstance(last, int) and not isinstance(last, bool) and 0 < last < 2**31 else 0


def _number(task: Task) -> int:
    return int(task.id[1:]) if task.id[1:].isdigit() and len(task.id) < 12 else 0


def _save(state_dir: Path, tasks: list[Task], last: int) -> None:
    last = max(last, *(_number(t) for t in tasks), 0)
    state_folder(state_dir).write_atomic(
        TASKS_FILE, json.dumps({"version": 1, "last": last, "tasks": [asdict(t) for t in tasks]}, indent=2) + "\n"
    )


def add_task(state_dir: Path, title: str) -> Task:
    """`wakeloop task add`: queue a task at the end."""
    title = " ".join(title.split())
    if not title:
        raise TaskError("the task title is empty; say what the agent should do")
    if len(title) > MAX_TITLE_CHARS:
        raise TaskError(
            f"the task title is {len(title):,} characters; keep it under {MAX_TITLE_CHARS:,} "
            "and put details in mandate.md or a message (`wakeloop send`)"
        )
    with locked(state_dir, TASKS_LOCK):
        tasks, last = _read(state_dir)
        number = 1 + max(last, *(_number(t) for t in tasks), 0)
        task = Task(id=f"t{number}", title=title, created=_now())
        _save(state_dir, tasks + [task], last)
    return task


def open_tasks(state_dir: Path) -> list[Task]:
    return [t for t in load_tasks(state_dir) if t.status in OPEN]


def _pick(tasks: list[Task]) -> Task | None:
    """The task a wake takes: one left claimed by an earlier wake (only one wake runs at a
    time, so it was abandoned), else the oldest todo."""
    return next((t for t in tasks if t.status == "claimed"), None) or next(
        (t for t in tasks if t.status == "todo"), None
    )


def next_task(state_dir: Path) -> Task | None:
    """The task the next wake names, left as it is (a dry run's, `wakeloop context`'s)."""
    return _pick(load_tasks(state_dir))


def claim_next(state_dir: Path, run_id: str) -> Task | None:
    """Claim the task this wake works on (_pick's)."""
    with locked(state_dir, TASKS_LOCK):
        tasks, last = _read(state_dir)
        pick = _pick(tasks)
        if pick is None:
            return None
        claimed = replace(pick, status="claimed", claimed_by=run_id, claimed_at=_now())
        _save(state_dir, [claimed if t.id == pick.id else t for t in tasks], last)
    return claimed


def finish(state_dir: Path, task_id: str, status: str, note: str = "", run_id: str = "") -> Task:
    """Close a claimed task as done or failed (the complete_task tool).
    Raises TaskError with a sentence the model can act on."""
    if status not in ("done", "failed"):
        raise TaskError(f"status must be 'done' or 'failed', not {status!r}")
    with locked(state_dir, TASKS_LOCK):
        tasks, last = _read(state_dir)
        task = next((t for t in tasks if t.id == task_id), None)
        if task is None:
            raise TaskError(f"there is no task {task_id!r}")
        if task.status != "claimed" or (run_id and task.claimed_by != run_id):
            raise TaskError(
                f"task {task_id} is {task.status}, not claimed by this wake; "
                "only the task named at the start of this wake can be completed"
            )
        closed = replace(task, status=status, finished_at=_now(), note=note.strip()[:MAX_NOTE_CHARS])
        _save(state_dir, [closed if t.id == task_id else t for t in tasks], last)
    return closed


def cancel(state_dir: Path, task_id: str, note: str = "") -> Task:
    """`wakeloop task cancel`: an open task no wake should take; kept in the list, with the note.
    A wake working on it meanwhile cannot complete it (finish refuses it)."""
    with locked(state_dir, TASKS_LOCK):
        tasks, last = _read(state_dir)
        task = _find(state_dir, tasks, task_id)
        if task.status not in OPEN:
            raise TaskError(f"task {task_id} is {task.status} already; `wakeloop task rm` removes it from the list")
        closed = replace(task, status="cancelled", finished_at=_now(), note=" ".join(note.split())[:MAX_NOTE_CHARS])
        _save(state_dir, [closed if t.id == task_id else t for t in tasks], last)
    return closed


def remove(state_dir: Path, task_id: str) -> Task:
    """`wakeloop task rm`: the task gone from the list, whatever its status (its id is not reused
    while a later task stands)."""
    with locked(state_dir, TASKS_LOCK):
        tasks, last = _read(state_dir)
        task = _find(state_dir, tasks, task_id)
        _save(state_dir, [t for t in tasks if t.id != task_id], last)
    return task


def _find(state_dir: Path, tasks: list[Task], task_id: str) -> Task:
    task = next((t for t in tasks if t.id == task_id), None)
    if task is None:
        known = ", ".join(t.id for t in tasks[-10:]) or "none"
        raise TaskError(f"there is no task {task_id!r} (tasks: {known}; `wakeloop task list` shows them)")
    return task


def claim_for_wake(state_dir: Path, run_id: str, live: bool = True) -> tuple[Task | None, str | None]:
    """claim_next for the loop (a dry run: next_task, nothing claimed); a broken tasks.json is a
    warning line, never a failed wake."""
    try:
        return (claim_next(state_dir, run_id) if live else next_task(state_dir)), None
    except TaskError as exc:
        return None, f"warning: no task {'claimed' if live else 'named'}: {exc}"


def first_message_line(task: Task, can_complete: bool = True) -> str:
    """What the first user message says about this wake's task."""
    line = f"Your task for this wake is {task.id}: {task.title}"
    if not can_complete:
        return line + "\nWork on it; your human will close it (complete_task is not available)."
    return (
        line + f"\nWhen it is finished (or cannot be finished), call complete_task with task_id "
        f'"{task.id}", status "done" or "failed", and a one-line note.'
    )
