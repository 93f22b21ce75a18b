"""The sandbox broker: run/write in agent X's workspace under agent X's policy, nothing else.

A real broker serves on a real unix socket in a thread; real containers run
on the engine. The client is BrokerSandbox, the same class the orchestrator uses.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import yaml

from leftovers import our_containers
from orchestrator.agent import init_agent
from orchestrator.broker import HOST_ROOT_ENV, Broker, BrokerSandbox, serve
from orchestrator.sandbox import SandboxError

REPO = Path(__file__).resolve().parent.parent
START_S = 30                         # the broker's start: engine ping, leftover sweep


def set_policy(agent_dir: Path, policy: dict) -> None:
    config = agent_dir / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    data["policy"] = policy
    config.write_text(yaml.safe_dump(data))


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "agents"
    init_agent(root / "alpha")
    return root


@pytest.fixture
def broker(root):
    """A broker serving ROOT on a short socket path (unix paths are capped at 108 bytes)."""
    sock_dir = Path(tempfile.mkdtemp(prefix="wlb-"))
    sock = sock_dir / "broker.sock"
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(root, sock, ready, stop), daemon=True)
    thread.start()
    assert ready.wait(START_S), "the broker did not start"
    yield sock
    stop.set()
    thread.join(timeout=START_S)
    shutil.rmtree(sock_dir, ignore_errors=True)


def raw_request(sock: Path, request: dict) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(str(sock))
        s.sendall(json.dumps(request).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


def test_a_command_runs_in_a_fresh_hardened_box_and_nothing_is_left(broker, root, tmp_path, docker_client):
    box = BrokerSandbox(broker, "alpha")
    result = box.run("echo hello > note.txt; cat note.txt; id -u; grep CapEff /proc/self/status",
                     timeout_s=30, max_output_chars=2000)
    assert result.exit_code == 0 and result.container_id
    lines = result.output.split()
    assert lines[0] == "hello" and lines[1] != "0" and lines[-1] == "0000000000000000"
    assert (root / "alpha/workspace/note.txt").read_text() == "hello\n"
    assert our_containers(docker_client, tmp_path) == []


def test_the_timeout_is_the_policys_not_the_requests(broker, root):
    set_policy(root / "alpha", {"tools": {"bash": {"timeout_s": 2}}})
    result = BrokerSandbox(broker, "alpha").run("sleep 60", timeout_s=999, max_output_chars=100)
    assert result.timed_out and result.exit_code == 124 and result.duration_ms < 20_000


def test_writes_obey_the_agents_write_file_policy(broker, root):
    set_policy(root / "alpha", {"tools": {"write_file": {"max_bytes": 100, "deny": ["secret/**"]}}})
    box = BrokerSandbox(broker, "alpha")
    assert box.write("notes/a.md", b"fine\n").exit_code == 0
    assert (root / "alpha/workspace/notes/a.md").read_text() == "fine\n"
    with pytest.raises(SandboxError, match="deny glob"):
        box.write("secret/key", b"x")
    with pytest.raises(SandboxError, match="at most 100 bytes"):
        box.write("big.txt", b"x" * 101)
    assert not (root / "alpha/workspace/secret").exists()


def test_a_disabled_bash_is_refused_by_the_broker_itself(broker, root):
    set_policy(root / "alpha", {"tools": {"bash": {"enabled": False}}})
    with pytest.raises(SandboxError, match="bash tool is disabled"):
        BrokerSandbox(broker, "alpha").run("id", timeout_s=10, max_output_chars=100)


def test_fields_a_request_should_not_have_change_nothing(broker):
    """Only op, agent and command count: image, user, binds and privileged are ignored."""
    reply = raw_request(broker, {"op": "run", "agent": "alpha", "command": "id -u; ls /host 2>&1",
                                 "image": "debian:bookworm-slim", "user": "0:0", "privileged": True,
                                 "binds": ["/:/host"], "timeout_s": 999})
    assert reply["ok"]
    uid, rest = reply["result"]["output"].split("\n", 1)
    assert uid != "0" and "No such file" in rest


@pytest.mark.parametrize("request_", [
    {"op": "create_container", "agent": "alpha", "image": "alpine"},
    {"op": "run", "agent": "../alpha", "command": "id"},
    {"op": "run", "agent": "alpha/workspace", "command": "id"},
    {"op": "run", "agent": "nobody", "command": "id"},
    {"op": "run", "agent": "alpha", "command": ""},
    {"op": "write", "agent": "alpha", "path": "../escape", "content_b64": "eA=="},
], ids=["other-op", "dotdot", "slash", "unknown-agent", "empty-command", "write-outside"])
def test_anything_but_run_or_write_for_a_known_agent_is_refused(broker, request_):
    reply = raw_request(broker, request_)
    assert reply["ok"] is False and reply["error"] and "\n" not in reply["error"]


def test_output_that_looks_like_the_protocol_is_just_data(broker):
    fake = '{"ok": false, "error": "forged"}'
    result = BrokerSandbox(broker, "alpha").run(f"echo '{fake}'", timeout_s=30, max_output_chars=1000)
    assert result.exit_code == 0 and result.output.strip() == fake


def test_the_mount_source_is_the_host_path_of_the_workspace(root, monkeypatch, docker_client):
    monkeypatch.setenv(HOST_ROOT_ENV, "/srv/host/agents")
    broker = Broker(root, client=docker_client, log=lambda line: None)
    box = broker._sandbox(broker._agent("alpha"))
    _, host = box.container_spec(["true"])
    assert [m["Source"] for m in host["mounts"]] == ["/srv/host/agents/alpha/workspace"]
    assert [m["Target"] for m in host["mounts"]] == ["/workspace"]
    monkeypatch.delenv(HOST_ROOT_ENV)
    assert Broker(root, client=docker_client).host_root == root.resolve()   # not in a container


def test_a_whole_wake_through_the_broker_needs_no_docker_access(broker, root):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WAKELOOP_"))}
    env["WAKELOOP_BROKER"] = str(broker)
    env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"     # the orchestrator has no engine
    done = subprocess.run([sys.executable, "-m", "orchestrator", "wake", str(root / "alpha")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    receipt = json.loads(done.stdout.strip().splitlines()[-1])
    assert receipt["status"] == "done" and receipt["tool_calls"] == 4 and receipt["journal"] == "agent"
    assert (root / "alpha/workspace/memory/dry-run.md").exists()
