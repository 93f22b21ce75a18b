"""Receipts are honest: a wake whose changes were not committed ends `not_committed`, never `done`.

A real commit failure, as a wake meets it: the agent fills its disk's
inodes, so the commit's first step (its undo folder) fails with ENOSPC and
is rolled back whole (sandbox/wakes/transaction.py). The wake, run as the CLI
runs it, ends `not_committed` with exit 1; `wakeloop status`, the console,
/metrics and a notification sent to a real webhook each say so, as they say
a dead letter. Not here: the commit's own rollback at every step
(test_transaction.py), a wake killed before its commit (test_wake_layer.py).
"""

from __future__ import annotations

import json

import pytest

from orchestrator import metrics
from orchestrator.console.app import Console, start
from orchestrator.console.auth import Access
from orchestrator.escapes.surfaces.receivers import Hook
from orchestrator.records import event_types as ev
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.testing.fakeapi import text, tool_use, turn
from tests.helpers import cli_here, make_agent
from tests.helpers.console import TOKEN, Client

SMALL = {"disk": "64m", "files": 2000}  # the escape suite's small disk (escapes/resources.py)
# A real change first, then every inode of the disk: the commit then cannot make its undo folder.
FILL = "echo kept > a.txt; mkdir fill && cd fill && seq 1 5000 | xargs touch 2>/dev/null; ls | wc -l"


@pytest.mark.docker
def test_a_wake_whose_commit_failed_ends_not_committed_everywhere_a_failure_shows(
    tmp_path, fake_api, disk_view, capsys
):
    root = tmp_path / "agents"
    with Hook() as hook:
        agent_dir = make_agent(
            root, "filler", policy={"version": 1, "sandbox": SMALL}, notify=[{"webhook": hook.url()}]
        )
        console = start(Console(root, Access(TOKEN, True)), "127.0.0.1", 0, ())
        try:
            fake_api([turn(tool_use("bash", {"command": FILL})), turn(text("Done."))])
            code = cli_here("wake", str(agent_dir), "--live")
            receipt = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
            client = Client(console.url).sign_in()
            agent_page = client.get("/agents/filler")[2]
            wake_page = client.get(f"/agents/filler/wakes/{receipt['run_id']}")[2]
            exposition = client.get("/metrics")[2]
        finally:
            console.stop()
        sent = [(n["event"], n["run_id"]) for n in hook.received]
    assert code == 1, receipt
    assert receipt["status"] == "not_committed", receipt
    assert receipt["reason"].startswith("the wake's changes were not committed: "), receipt["reason"]
    assert "No space left on device" in receipt["reason"] and "ended done" in receipt["reason"]
    records = [e.record for e in read_events(agent_dir / "state" / EVENTS_FILE)]
    [changes] = [r for r in records if isinstance(r, ev.WorkspaceChanges)]
    [said] = [r for r in records if isinstance(r, ev.NotCommitted)]
    assert changes.outcome == "error" and said.ended == "done"
    assert [r.status for r in records if isinstance(r, ev.WakeFinished)] == ["not_committed"]
    assert not (disk_view(agent_dir) / "a.txt").exists()  # nothing of the wake landed: rolled back whole
    # Told as a failure is: the webhook got it, and the agent's failing streak began (below: status).
    assert sent == [("not_committed", receipt["run_id"])], sent
    assert cli_here("status", str(agent_dir), "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert status["last_receipt"]["status"] == "not_committed" and status["health"]["failures"] == 1
    assert cli_here("status", str(agent_dir)) == 0
    assert "#1 not_committed: the wake's changes were not committed" in capsys.readouterr().out
    assert "failing since" in agent_page and "not_committed" in agent_page
    assert '<span class="badge bad">not_committed</span>' in wake_page
    assert 'wakeloop_wakes_total{agent="filler",status="not_committed"} 1.0' in exposition
    assert metrics.enabled()


@pytest.mark.docker
def test_the_next_wake_of_that_agent_commits_again_and_says_done(tmp_path, fake_api, disk_view, capsys):
    agent_dir = make_agent(tmp_path / "agents", "filler", policy={"version": 1, "sandbox": SMALL}, notify=[])
    fake_api([turn(tool_use("bash", {"command": FILL})), turn(text("Done."))])
    assert cli_here("wake", str(agent_dir), "--live") == 1
    fake_api([turn(tool_use("bash", {"command": "echo again > b.txt"})), turn(text("Done."))])
    assert cli_here("wake", str(agent_dir), "--live") == 0
    receipt = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert receipt["status"] == "done", receipt
    assert (disk_view(agent_dir) / "b.txt").read_text() == "again\n"
