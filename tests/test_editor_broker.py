"""The broker's `edit` op (broker/edit_op.py): Claude's file tools under compose, judged by the broker's
own copy of the policy. A real broker on a real socket, real boxes; the client is BrokerSandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.broker.client import BrokerSandbox
from orchestrator.policy.agent import init_agent
from orchestrator.policy.editor_paths import EDITOR, MEMORY
from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.disks import disk, disk_index, layers
from tests.helpers import set_policy
from tests.helpers.broker import served

ASKED_CAPS = {"max_bytes": 10**9, "max_chars": 10**9, "protect_git": False}  # a taken-over orchestrator's


@pytest.fixture
def root(tmp_path, docker_client) -> Path:
    root = tmp_path / "agents"
    init_agent(root / "alpha")
    return root


def view(root: Path) -> Path:
    """The workspace as the broker's boxes see it (the broker alone mounts the disk)."""
    return layers.files(disk.path_of(disk_index.lookup(root / "alpha"), "view"))


def test_edits_run_in_the_agents_box_under_the_brokers_policy(root):
    set_policy(root / "alpha", {"tools": {"write_file": {"max_bytes": 100, "deny": ["secret/**"]}}})
    with served(root) as sock:
        box = BrokerSandbox(sock, "alpha")
        made = box.edit(EDITOR, {"command": "create", "path": "notes/a.md", "file_text": "one\n"}, 30, **ASKED_CAPS)
        assert made.exit_code == 0, made.output
        args = {"command": "str_replace", "path": "/workspace/notes/a.md", "old_str": "one", "new_str": "two"}
        assert box.edit(EDITOR, args, 30, **ASKED_CAPS).exit_code == 0
        assert (view(root) / "notes/a.md").read_text() == "two\n"
        with pytest.raises(SandboxError, match="deny glob"):
            box.edit(EDITOR, {"command": "create", "path": "secret/k", "file_text": "x"}, 30, **ASKED_CAPS)
        big = {"command": "create", "path": "big.md", "file_text": "x" * 101}
        with pytest.raises(SandboxError, match="at most 100 bytes"):
            box.edit(EDITOR, big, 30, **ASKED_CAPS)
        with pytest.raises(SandboxError, match="memory tool is disabled"):
            box.edit(MEMORY, {"command": "view", "path": "/memories"}, 30, **ASKED_CAPS)
        with pytest.raises(SandboxError, match="outside /workspace"):
            box.edit(EDITOR, {"command": "view", "path": "/etc/shadow"}, 30, **ASKED_CAPS)
        assert not (view(root) / "secret").exists() and not (view(root) / "big.md").exists()


def test_the_memory_tool_through_the_broker_stays_in_memory(root):
    set_policy(root / "alpha", {"tools": {"memory": {"enabled": True}}})
    with served(root) as sock:
        box = BrokerSandbox(sock, "alpha")
        made = box.edit(
            MEMORY, {"command": "create", "path": "/memories/facts.md", "file_text": "a\n"}, 30, **ASKED_CAPS
        )
        assert made.exit_code == 0, made.output
        with pytest.raises(SandboxError, match="must start with /memories"):
            box.edit(MEMORY, {"command": "create", "path": "/workspace/x", "file_text": "x"}, 30, **ASKED_CAPS)
        moved = {"command": "rename", "old_path": "/memories/facts.md", "new_path": "/memories/../x.md"}
        with pytest.raises(SandboxError, match="'..'"):
            box.edit(MEMORY, moved, 30, **ASKED_CAPS)
        assert (view(root) / "memory/facts.md").read_text() == "a\n" and not (view(root) / "x.md").exists()
