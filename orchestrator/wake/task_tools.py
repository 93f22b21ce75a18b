"""complete_task: the one tool that acts on the host, not in the box.

It closes the task this wake claimed in state/tasks.json and touches nothing
else; the policy can disable it (tools.complete_task.enabled).

Not here: the queue itself (records/tasks.py), the sandbox tools (tools.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.policy.schema import Tools
from orchestrator.records.tasks import MAX_NOTE_CHARS, Task, TaskError, finish
from orchestrator.wake.tool_result import Tool, ToolResult, error

COMPLETE_TASK_SCHEMA = {
    "type": "object",
    "properties": {
        "task_id": {"type": "string"},
        "status": {"type": "string", "enum": ["done", "failed"]},
        "note": {"type": "string"},
    },
    "required": ["task_id", "status"],
}


def complete_task_tools(
    state_dir: Path, run_id: str, task: Task | None, policy_tools: Tools, live: bool = True
) -> list[Tool]:
    """The host-side complete_task tool for a wake that claimed `task` (none without one).
    It writes state/tasks.json only, never the workspace; the policy can disable it. A dry run
    is offered the same tool, which changes nothing: it leaves every task as it found it."""
    if task is None:
        return []
    enabled = policy_tools.complete_task.enabled

    def handler(args: dict[str, Any]) -> ToolResult:
        if not live:
            return error(f"complete_task: a dry run leaves tasks as it found them; task {task.id} stays {task.status}")
        try:
            closed = finish(state_dir, args["task_id"], args["status"], args.get("note", ""), run_id=run_id)
        except TaskError as exc:
            return error(f"complete_task: {exc}")
        return ToolResult(
            text=f"task {closed.id} is now {closed.status}.", detail={"task": closed.id, "task_status": closed.status}
        )

    return [
        Tool(
            "complete_task",
            (
                f"Close the task named at the start of this wake ({task.id}) as done or failed, with a "
                f"one-line note for your human (at most {MAX_NOTE_CHARS:,} characters). Only that task "
                "can be closed, once."
            ),
            COMPLETE_TASK_SCHEMA,
            handler,
            enabled,
            "the complete_task tool is disabled by this agent's policy",
        )
    ]
