"""The broker's `edit` op: one call of Claude's text editor or memory tool, under the broker's policy.

The orchestrator sends the model's arguments and nothing else. Here they
meet the agent's policy as the broker read it: the tool must be enabled,
the path must land in the tool's folder and, for a write, pass write_file's
globs and protect_git (policy/editor_paths.py); max_bytes and
max_characters are the policy's. The call then runs as any other, in a
fresh box of the agent's (DockerSandbox.edit).

Not here: the op's shape (ops.py `Edit`), the call slots, the ceiling and the
box (server.py `Broker._call`), the program (sandbox/containers/in_box/edit.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.broker import ops
from orchestrator.broker.wire import BrokerError
from orchestrator.policy import editor_paths
from orchestrator.policy.editor_paths import EDITOR
from orchestrator.policy.schema import Policy


@dataclass(frozen=True)
class EditCall:
    """An edit the policy allows, with the policy's caps: what the box's `edit` is given."""

    tool: str
    args: dict[str, Any]
    timeout_s: float
    max_bytes: int
    max_characters: int
    protect_git: bool


def allowed(name: str, policy: Policy, req: ops.Edit) -> EditCall:
    """The edit the agent's policy allows, or BrokerError with the one line why."""
    cfg = policy.tools.text_editor if req.tool == EDITOR else policy.tools.memory
    if not cfg.enabled:
        raise BrokerError(f"{name}: the {req.tool} tool is disabled by this agent's policy")
    args = json.loads(req.args_json)
    reason = editor_paths.refusal(policy.tools.write_file, req.tool, args)
    if reason:
        raise BrokerError(f"{name}: {reason}")
    rules = policy.tools.write_file
    return EditCall(req.tool, args, cfg.timeout_s, rules.max_bytes, cfg.max_characters, rules.protect_git)
