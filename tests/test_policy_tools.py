"""Tool restriction through a whole wake (issue 4): the shipped strict.yaml and the
default write_file protections, driven by the real anthropic SDK against
orchestrator/testing/fakeapi.py with real tools in real containers.

test_loop.py covers a disabled bash, send_message's max_per_wake and a custom
deny glob; this file covers the shipped policies and every refusal's reason
reaching both the model and the event log.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from orchestrator.policy.agent import load_agent
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.state import read_outbox
from orchestrator.testing.fakeapi import FAKE_KEY, text, tool_use, turn
from tests.helpers import REPO, live_wake, set_policy
from tests.helpers.recorded import result_text, tool_results

KEY = FAKE_KEY


def denials(agent_dir: Path) -> list[dict]:
    return [e.data for e in read_events(agent_dir / "state" / EVENTS_FILE) if e.type == "policy_denied"]


def test_strict_offers_write_file_alone_and_refuses_bash_and_send_message(agent_dir, fake_api, disk_view):
    set_policy(agent_dir, str(REPO / "policies/strict.yaml"))
    api = fake_api(
        [
            turn(tool_use("bash", {"command": "touch /workspace/pwned"}), tool_use("send_message", {"text": "hello"})),
            turn(text("done")),
        ]
    )
    live_wake(agent_dir, stream=False)
    assert [t["name"] for t in api.requests[0].body["tools"]] == ["write_file"]
    bash, message = tool_results(api.requests[1])
    assert bash["is_error"] and "the bash tool is disabled" in result_text(bash)
    assert message["is_error"] and "the send_message tool is disabled" in result_text(message)
    assert not (disk_view(agent_dir) / "pwned").exists()
    assert "hello" not in read_outbox(agent_dir / "state")
    assert [(d["tool"], d["reason"]) for d in denials(agent_dir)] == [
        ("bash", "the bash tool is disabled by this agent's policy"),
        ("send_message", "the send_message tool is disabled by this agent's policy"),
    ]


def test_strict_write_file_globs_and_size_are_enforced_with_reasons(
    agent_dir, fake_api, tmp_path, monkeypatch, disk_view
):
    set_policy(agent_dir, str(REPO / "policies/strict.yaml"))
    # strict's $0.25 a wake would stop this wake before its second call (64 KiB of
    # content in the context, priced at the worst case): not what this test is about.
    cheap = tmp_path / "prices.json"
    cheap.write_text(
        json.dumps(
            {
                "models": {
                    load_agent(agent_dir).model: {
                        "input": 0.01,
                        "output": 0.01,
                        "cache_write_5m": 0.01,
                        "cache_write_1h": 0.01,
                        "cache_read": 0.01,
                        "source": "a test price",
                    }
                }
            }
        )
    )
    monkeypatch.setenv("WAKELOOP_PRICES", str(cheap))
    api = fake_api(
        [
            turn(
                tool_use("write_file", {"path": "notes/ok.md", "content": "fine"}),
                tool_use("write_file", {"path": "src/main.py", "content": "print(1)"}),
                tool_use("write_file", {"path": "notes/.env", "content": "X=1"}),
                tool_use("write_file", {"path": "notes/big.md", "content": "x" * (64 * 1024 + 1)}),
            ),
            turn(text("done")),
        ]
    )
    live_wake(agent_dir, stream=False)
    ok, outside, dotfile, big = tool_results(api.requests[1])
    assert not ok.get("is_error") and (disk_view(agent_dir) / "notes/ok.md").read_text() == "fine"
    assert outside["is_error"] and "allows only memory/**, notes/**, *.md" in result_text(outside)
    assert dotfile["is_error"] and "deny glob '**/.*'" in result_text(dotfile)
    assert big["is_error"] and "at most 65,536 bytes" in result_text(big)
    for path in ("src/main.py", "notes/.env", "notes/big.md"):
        assert not (disk_view(agent_dir) / path).exists(), path
    reasons = [d["reason"] for d in denials(agent_dir)]
    assert len(reasons) == 3 and all(
        reason in result_text(block) for reason, block in zip(reasons, (outside, dotfile, big), strict=True)
    )


def test_default_policy_refuses_git_hooks_and_config_even_when_disguised(agent_dir, fake_api, disk_view):
    api = fake_api(
        [
            turn(
                tool_use("write_file", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\nid\n"}),
                tool_use("write_file", {"path": "./.git//config", "content": "[core]\nfsmonitor=id\n"}),
                tool_use("write_file", {"path": "vendor/lib/.git/hooks/post-checkout", "content": "id"}),
            ),
            turn(text("done")),
        ]
    )
    live_wake(agent_dir, stream=False)
    results = tool_results(api.requests[1])
    assert all(r["is_error"] and "denied by this agent's policy" in result_text(r) for r in results)
    assert not (disk_view(agent_dir) / ".git").exists()
    assert not (disk_view(agent_dir) / "vendor").exists()
    assert [d["tool"] for d in denials(agent_dir)] == ["write_file"] * 3


def test_default_policy_refuses_a_gitdir_pointer_submodule_hooks_and_case_variants(agent_dir, fake_api, disk_view):
    paths = [
        ".git",
        "vendor/lib/.git",
        ".git/modules/lib/hooks/post-checkout",
        ".git/config.worktree",
        ".GIT/hooks/pre-commit",
        ".Git/config",
    ]
    api = fake_api(
        [
            turn(*(tool_use("write_file", {"path": p, "content": "gitdir: ../evil\n"}) for p in paths)),
            turn(text("done")),
        ]
    )
    live_wake(agent_dir, stream=False)
    results = tool_results(api.requests[1])
    assert len(results) == len(paths)
    assert all(
        r["is_error"] and "(protect_git)" in result_text(r) and "git's own directory" in result_text(r) for r in results
    )
    assert not any((disk_view(agent_dir) / p).exists() for p in (".git", ".GIT", ".Git", "vendor"))
    assert [d["tool"] for d in denials(agent_dir)] == ["write_file"] * len(paths)


def test_default_policy_refuses_a_planted_bare_git_repositorys_hook_in_the_box(agent_dir, fake_api, disk_view):
    repo = agent_dir / "workspace/lib.git"
    (repo / "objects").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "HEAD").write_text("ref: refs/heads/main\n")
    subprocess.run(["chown", "-R", "1000:1000", str(repo)], check=True)
    api = fake_api(
        [turn(tool_use("write_file", {"path": "lib.git/hooks/post-checkout", "content": "id\n"})), turn(text("done"))]
    )
    live_wake(agent_dir, stream=False)
    [result] = tool_results(api.requests[1])
    assert result["is_error"] and "git takes it for a repository" in result_text(result)
    assert not (disk_view(agent_dir) / "lib.git/hooks").exists()  # on the disk the wake used
