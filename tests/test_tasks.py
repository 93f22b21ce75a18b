"""Tasks (seed 001): todo -> claimed -> done | failed, in state/tasks.json.

Unit tests pin the queue; the wake tests run the real loop with the real SDK
against orchestrator/testing/fakeapi.py: the task is claimed, named in the first user message,
and closed by the agent's complete_task call.
"""

from __future__ import annotations

import json
import threading

import pytest

from orchestrator.testing.fakeapi import FAKE_KEY, text, tool_use, turn
from tests.helpers import run_cli, set_policy
from tests.helpers.recorded import first_user_text
from orchestrator.policy.agent import load_agent
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.tasks import TASKS_FILE, TaskError, add_task, claim_next, finish, load_tasks, open_tasks

KEY = FAKE_KEY


# -- the queue ---------------------------------------------------------------------------


def test_tasks_move_todo_claimed_done_in_order(tmp_path):
    t1, t2 = add_task(tmp_path, "write the README"), add_task(tmp_path, "  fix   the  tests ")
    assert (t1.id, t2.id, t2.title) == ("t1", "t2", "fix the tests")
    claimed = claim_next(tmp_path, "run-a")
    assert (claimed.id, claimed.status, claimed.claimed_by) == ("t1", "claimed", "run-a")
    done = finish(tmp_path, "t1", "done", "README written", run_id="run-a")
    assert (done.status, done.note) == ("done", "README written") and done.finished_at
    assert claim_next(tmp_path, "run-b").id == "t2"
    finish(tmp_path, "t2", "failed", "tests need a database", run_id="run-b")
    assert claim_next(tmp_path, "run-c") is None
    assert [t.status for t in load_tasks(tmp_path)] == ["done", "failed"]
    assert json.loads((tmp_path / TASKS_FILE).read_text())["tasks"][1]["note"] == "tests need a database"


def test_a_task_left_claimed_by_an_ended_wake_is_carried_on_first(tmp_path):
    add_task(tmp_path, "a")
    add_task(tmp_path, "b")
    claim_next(tmp_path, "run-killed")  # that wake never closed it
    again = claim_next(tmp_path, "run-next")
    assert (again.id, again.claimed_by) == ("t1", "run-next")


def test_only_the_claiming_wake_may_close_a_task_and_only_as_done_or_failed(tmp_path):
    add_task(tmp_path, "a")
    add_task(tmp_path, "b")
    claim_next(tmp_path, "run-a")
    with pytest.raises(TaskError, match="t2 is todo"):
        finish(tmp_path, "t2", "done", run_id="run-a")
    with pytest.raises(TaskError, match="not claimed by this wake"):
        finish(tmp_path, "t1", "done", run_id="run-other")
    with pytest.raises(TaskError, match="'done' or 'failed'"):
        finish(tmp_path, "t1", "todo", run_id="run-a")
    with pytest.raises(TaskError, match="no task 't9'"):
        finish(tmp_path, "t9", "done", run_id="run-a")
    assert [t.status for t in open_tasks(tmp_path)] == ["claimed", "todo"]


def test_adds_from_many_processes_at_once_lose_nothing(tmp_path):
    threads = [threading.Thread(target=add_task, args=(tmp_path, f"task {i}")) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tasks = load_tasks(tmp_path)
    assert len(tasks) == 20 and len({t.id for t in tasks}) == 20


def test_an_empty_or_huge_title_is_refused(tmp_path):
    with pytest.raises(TaskError, match="empty"):
        add_task(tmp_path, "   ")
    with pytest.raises(TaskError, match="characters"):
        add_task(tmp_path, "x" * 5000)


def test_task_add_and_list_on_the_command_line(agent_dir):
    added = run_cli("task", "add", str(agent_dir), "summarise the logs")
    assert added.returncode == 0 and "queued t1" in added.stdout
    listed = run_cli("task", "list", str(agent_dir))
    assert listed.returncode == 0 and "t1" in listed.stdout and "todo" in listed.stdout
    bad = run_cli("task", "add", str(agent_dir), " ")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "empty" in bad.stderr


# -- whole wakes -----------------------------------------------------------------------------


@pytest.mark.docker
def test_a_wake_claims_the_task_names_it_and_the_tool_completes_it(agent_dir, fake_api):
    from orchestrator.wake.loop import wake

    add_task(agent_dir / "state", "count the files in the workspace")
    add_task(agent_dir / "state", "the next one, for a later wake")
    api = fake_api(
        [
            turn(tool_use("bash", {"command": "find . -type f | wc -l"})),
            turn(tool_use("complete_task", {"task_id": "t1", "status": "done", "note": "2 files"})),
            turn(text("Task done.")),
        ]
    )
    receipt = wake(load_agent(agent_dir), live=True)

    assert receipt.status == "done"
    assert "t1: count the files in the workspace" in first_user_text(api.requests[0])
    assert "complete_task" in [t["name"] for t in api.requests[0].body["tools"]]
    tasks = load_tasks(agent_dir / "state")
    assert (tasks[0].status, tasks[0].note, tasks[0].claimed_by) == ("done", "2 files", receipt.run_id)
    assert tasks[1].status == "todo"  # one task per wake
    types = [e.type for e in read_events(agent_dir / "state" / EVENTS_FILE)]
    assert "task_claimed" in types


@pytest.mark.docker
def test_complete_task_cannot_close_a_task_this_wake_did_not_claim(agent_dir, fake_api):
    from orchestrator.wake.loop import wake

    add_task(agent_dir / "state", "first")
    add_task(agent_dir / "state", "second")
    api = fake_api(
        [turn(tool_use("complete_task", {"task_id": "t2", "status": "done", "note": "x"})), turn(text("ok"))]
    )
    wake(load_agent(agent_dir), live=True)
    answer = api.requests[1].body["messages"][-1]["content"][0]
    assert answer.get("is_error") and "t2 is todo" in str(answer["content"])
    assert [t.status for t in load_tasks(agent_dir / "state")] == ["claimed", "todo"]


@pytest.mark.docker
def test_a_policy_can_take_complete_task_away(agent_dir, fake_api):
    from orchestrator.wake.loop import wake

    set_policy(agent_dir, {"tools": {"complete_task": {"enabled": False}}})
    add_task(agent_dir / "state", "first")
    api = fake_api([turn(text("nothing to do"))])
    wake(load_agent(agent_dir), live=True)
    assert "complete_task" not in [t["name"] for t in api.requests[0].body.get("tools", [])]
