"""A tool as the registry holds it, and what one call answers: the model's text, whether it is an
error, and the event log's detail.

Not here: the tools (tools.py, editor_tool.py), the order of calls and the events (loop.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.sandbox.box import SandboxResult


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model reads
    is_error: bool = False
    denied: str | None = None  # a policy refusal, logged as policy_denied
    detail: dict[str, Any] = field(default_factory=dict)  # exit code, duration, bytes, ... for the event log

    def to_anthropic(self, tool_use_id: str) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": self.text}
        if self.is_error:
            block["is_error"] = True
        return block


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: Callable[[dict[str, Any]], ToolResult]
    enabled: bool = True
    disabled_reason: str = ""
    granted: Callable[[dict[str, Any], tuple[str, ...]], ToolResult] | None = (
        None  # bash: run with hosts a person approved
    )
    offered: dict[str, Any] | None = (
        None  # an Anthropic-defined tool's entry ({"type", "name", ...}): sent in place of ours
    )

    def to_anthropic(self) -> dict[str, Any]:
        if self.offered is not None:
            return dict(self.offered)
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


def error(text: str, **detail: Any) -> ToolResult:
    return ToolResult(text=f"ERROR: {text}", is_error=True, detail=detail)


def denied(reason: str) -> ToolResult:
    return ToolResult(text=f"REFUSED by policy: {reason}", is_error=True, denied=reason)


def sandbox_detail(result: SandboxResult) -> dict[str, Any]:
    """A box call's facts for the event log's tool_result: exit code, duration, bytes, container."""
    return {
        "exit_code": result.exit_code,
        "duration_ms": result.duration_ms,
        "bytes": result.output_bytes,
        "truncated": result.truncated,
        "timed_out": result.timed_out,
        "oom_killed": result.oom_killed,
        "container_id": result.container_id,
        **({"stopped": True} if result.stopped else {}),
        **({"asked_hosts": list(result.asked_hosts)} if result.asked_hosts else {}),
    }
