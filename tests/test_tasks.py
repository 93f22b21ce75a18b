"""Tasks (seed 001): todo -> claimed -> done | failed, in state/tasks.json.

Unit tests pin the queue; the wake tests run the real loop with the real SDK
against orchestrator/testing/fakeapi.py: the task is claimed, named in the first user message,
and closed by the agent's complete_task call.
"""

from __future__ import annotations

import json
import threading

import pytest

from orchestrator.policy.agent import load_agent
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.tasks import (
    TASKS_FILE,
    TaskError,
    add_task,
    cancel,
    claim_next,
    finish,
    load_tasks,
    next_task,
    open_tasks,
    remove,
)
from orchestrator.testing.fakeapi import FAKE_KEY, text, tool_use, turn
from tests.helpers import run_cli, set_policy
from tests.helpers.recorded import first_user_text

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


def test_a_cancelled_task_is_never_taken_and_a_removed_ones_id_is_not_given_again(tmp_path):
    for title in ("one", "two", "three"):
        add_task(tmp_path, title)
    claimed = claim_next(tmp_path, "run-1")
    assert claimed is not None and claimed.id == "t1"
    gone = cancel(tmp_path, "t1", "  done   by hand ")
    assert (gone.status, gone.note) == ("cancelled", "done by hand")
    with pytest.raises(TaskError, match="t1 is cancelled, not claimed by this wake"):
        finish(tmp_path, "t1", "done", run_id="run-1")  # the wake that had it cannot close it now
    with pytest.raises(TaskError, match="t1 is cancelled already"):
        cancel(tmp_path, "t1")
    assert next_task(tmp_path).id == "t2" and claim_next(tmp_path, "run-2").id == "t2"
    assert remove(tmp_path, "t3").title == "three"
    assert add_task(tmp_path, "four").id == "t4"  # t3 named a task that was: never another
    with pytest.raises(TaskError, match="there is no task 't3'"):
        remove(tmp_path, "t3")
    assert [(t.id, t.status) for t in load_tasks(tmp_path)] == [("t1", "cancelled"), ("t2", "claimed"), ("t4", "todo")]


def test_task_cancel_and_rm_on_the_command_line(agent_dir):
    for title in ("one", "two"):
        assert run_cli("task", "add", str(agent_dir), title).returncode == 0
    cancelled = run_cli("task", "cancel", str(agent_dir), "t1", "--note", "not needed")
    assert cancelled.returncode == 0 and "cancelled t1" in cancelled.stdout, cancelled.stderr
    removed = run_cli("task", "rm", str(agent_dir), "t2")
    assert removed.returncode == 0 and "removed t2 (todo)" in removed.stdout, removed.stderr
    listed = run_cli("task", "list", str(agent_dir)).stdout.splitlines()
    assert len(listed) == 1 and listed[0].split()[:2] == ["t1", "cancelled"] and "not needed" in listed[0]
    for command in ("cancel", "rm"):
        bad = run_cli("task", command, str(agent_dir), "t9")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "there is no task 't9'" in bad.stderr


# -- whole wakes -----------------------------------------------------------------------------


@pytest.mark.docker
def test_a_dry_run_names_the_task_a_live_wake_would_and_leaves_it_as_it_found_it(agent_dir, fake_api, tmp_path):
    add_task(agent_dir / "state", "count the files in the workspace")
    before = (agent_dir / "state" / TASKS_FILE).read_bytes()
    script = tmp_path / "script.json"  # a dry run's script that tries to close the task
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "complete_task", "input": {"task_id": "t1", "status": "done"}}]}])
    )
    runs = []
    for extra in ((), ("--script", str(script))):
        done = run_cli("wake", str(agent_dir), "--dry-run", *extra, timeout=180)
        assert done.returncode == 0, done.stderr
        receipt = json.loads(done.stdout.splitlines()[-1])
        assert (receipt["status"], receipt["task"]) == ("done", "t1"), receipt
        assert "task t1: count the files in the workspace (a dry run: left todo, as it was)" in done.stderr
        runs.append(receipt["run_id"])
    assert (agent_dir / "state" / TASKS_FILE).read_bytes() == before  # as found, byte for byte
    transcript = run_cli("transcript", str(agent_dir), runs[1], "--json").stdout
    assert "Your task for this wake is t1: count the files in the workspace" in transcript
    assert "a dry run leaves tasks as it found them; task t1 stays todo" in transcript
    log = run_cli("log", str(agent_dir)).stdout.splitlines()
    assert sum("task_shown" in line and "task=t1" in line for line in log) == 2
    assert sum("wake_finished" in line and "task=t1" in line for line in log) == 2
    fake_api([turn(text("On it."))])  # then a live wake claims it, as before
    receipt = wake_live(agent_dir)
    assert receipt.task == "t1" and load_tasks(agent_dir / "state")[0].claimed_by == receipt.run_id


def wake_live(agent_dir):
    from orchestrator.wake.loop import wake

    return wake(load_agent(agent_dir), live=True)


@pytest.mark.docker
def test_the_console_shows_which_task_each_wake_had(tmp_path):
    from orchestrator.console.app import Console, start
    from orchestrator.console.auth import Access
    from tests.helpers import make_agent
    from tests.helpers.console import TOKEN, Client

    root = tmp_path / "agents"
    agent_dir = make_agent(root, "one")
    add_task(agent_dir / "state", "tidy the notes")
    done = run_cli("wake", str(agent_dir), "--dry-run", timeout=180)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout.splitlines()[-1])["run_id"]
    listening = start(Console(root, Access(TOKEN, True)), "127.0.0.1", 0, ())
    try:
        client = Client(listening.url).sign_in()
        agent_page = client.get("/agents/one")[2]
        wake_page = client.get(f"/agents/one/wakes/{run_id}")[2]
    finally:
        listening.stop()
    assert '<td class="task">t1</td>' in agent_page and "dry run" in agent_page
    assert '· task <span id="task">t1</span>' in wake_page


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
