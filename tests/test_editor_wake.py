"""Claude's text editor and memory tool in whole wakes: the real SDK against testing/fakeapi.py, real boxes.

A scripted wake edits a file and a memory; the wake's transaction commits
both; the next wake's context reads the memory and a view sees the edit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.console.pages import turns
from orchestrator.records.event_types import ToolResult
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.testing.fakeapi import edit, memory, text, tool_use, turn
from orchestrator.views.logview import render_line
from tests.helpers import live_wake, set_policy
from tests.helpers.recorded import result_text, tool_results

EDITOR_ENTRY = {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool", "max_characters": 20_000}


def results_of(agent_dir: Path) -> list:
    return [e.record for e in read_events(agent_dir / "state" / EVENTS_FILE) if isinstance(e.record, ToolResult)]


def test_a_wake_edits_a_file_and_a_memory_and_the_next_wake_sees_both(agent_dir, fake_api, disk_view):
    set_policy(agent_dir, {"tools": {"memory": {"enabled": True}}})
    plan = disk_view(agent_dir) / "plan.md"
    plan.write_text("step one\nstep two\nstep three\n")
    os.chown(plan, 1000, 1000)  # as the agent would have made it
    api = fake_api(
        [
            turn(text("Fixing step two."), edit("str_replace", "/workspace/plan.md", old_str="two", new_str="2")),
            turn(edit("insert", "plan.md", insert_line=0, insert_text="# Plan")),
            turn(memory("create", path="/memories/core.md", file_text="The plan lives in plan.md.\n")),
            turn(memory("str_replace", path="/memories/core.md", old_str="plan.md", new_str="/workspace/plan.md")),
            turn(text("done")),
        ]
    )
    receipt = live_wake(agent_dir)
    assert receipt.status == "done", receipt
    offered = api.requests[0].body["tools"]
    assert EDITOR_ENTRY in offered and {"type": "memory_20250818", "name": "memory"} in offered
    for request in api.requests[1:5]:
        block = tool_results(request)[0]
        assert not block.get("is_error"), block
    assert "has been edited" in result_text(tool_results(api.requests[1])[0])
    workspace = disk_view(agent_dir)
    assert (workspace / "plan.md").read_text() == "# Plan\nstep one\nstep 2\nstep three\n"
    assert (workspace / "memory/core.md").read_text() == "The plan lives in /workspace/plan.md.\n"
    diffs = [r.detail.get("diff") for r in results_of(agent_dir) if r.detail.get("diff")]
    assert diffs[0].splitlines() == ["--- /workspace/plan.md", "+++ /workspace/plan.md", "-two", "+2"]

    lines = [
        json.loads(x) for x in (agent_dir / "state/transcripts" / f"{receipt.run_id}.jsonl").read_text().splitlines()
    ]
    shown = "\n".join(render_line(line) for line in lines)
    assert "-> str_replace_based_edit_tool str_replace\n     --- /workspace/plan.md" in shown
    assert "     -two\n     +2" in shown and "@@ after line 0 @@\n     +# Plan" in shown
    calls = [call for step in turns(lines) for call in step["calls"]]
    assert calls[0]["input"].splitlines()[2:] == ["-two", "+2"]  # the console's view of it

    api = fake_api([turn(edit("view", "/workspace/plan.md", view_range=[3, 3])), turn(text("seen"))])
    assert live_wake(agent_dir).status == "done"
    first = api.requests[0].body
    assert "The plan lives in /workspace/plan.md." in str(first["system"]) + str(first["messages"][0])
    assert result_text(tool_results(api.requests[1])[0]).endswith("     3\tstep 2")


def test_a_disabled_editor_is_not_offered_and_a_call_anyway_is_refused(agent_dir, fake_api, disk_view):
    set_policy(agent_dir, {"tools": {"text_editor": {"enabled": False}}})
    api = fake_api(
        [
            turn(edit("create", "/workspace/x.md", file_text="x")),
            turn(tool_use("memory", {"command": "view", "path": "/memories"})),
            turn(text("ok")),
        ]
    )
    assert live_wake(agent_dir).status == "done"
    names = [t["name"] for t in api.requests[0].body["tools"]]
    assert "str_replace_based_edit_tool" not in names and "memory" not in names
    assert "disabled" in result_text(tool_results(api.requests[1])[0])
    assert "disabled" in result_text(tool_results(api.requests[2])[0])
    assert not (disk_view(agent_dir) / "x.md").exists()


@pytest.mark.parametrize(
    "args, says",
    [
        ({"command": "create", "path": "/workspace/.git/hooks/pre-commit", "file_text": "x"}, "protect_git"),
        ({"command": "create", "path": "/workspace/secret/x", "file_text": "x"}, "deny glob"),
        ({"command": "view", "path": "/etc/passwd"}, "outside /workspace"),
    ],
)
def test_the_editor_obeys_write_files_rules_even_with_write_file_off(agent_dir, fake_api, disk_view, args, says):
    set_policy(agent_dir, {"tools": {"write_file": {"enabled": False, "deny": ["secret/**"]}}})
    api = fake_api([turn(tool_use("str_replace_based_edit_tool", args)), turn(text("ok"))])
    assert live_wake(agent_dir).status == "done"
    block = tool_results(api.requests[1])[0]
    assert block.get("is_error") and says in result_text(block)
    assert not (disk_view(agent_dir) / "secret").exists()


def test_an_editor_write_matching_a_write_file_approval_rule_waits_for_a_person(agent_dir, fake_api, disk_view):
    rules = [{"tool": "write_file", "paths": ["deploy/**"]}]
    set_policy(agent_dir, {"approve": {"rules": rules}})
    api = fake_api([turn(edit("create", "/workspace/deploy/run.sh", file_text="echo hi\n")), turn(text("ok"))])
    assert live_wake(agent_dir).status == "done"
    assert "WAITING for a person" in result_text(tool_results(api.requests[1])[0])
    assert not (disk_view(agent_dir) / "deploy").exists()


def test_the_fake_api_refuses_a_client_tool_under_another_name(fake_api):
    from orchestrator.testing.fakeapi import refused

    assert "must be named" in refused({"tools": [{"type": "text_editor_20250728", "name": "edit"}]})
    assert "max_characters" in refused({"tools": [{**EDITOR_ENTRY, "max_characters": 0}]})
    assert refused({"tools": [EDITOR_ENTRY, {"type": "memory_20250818", "name": "memory"}]}) == ""
