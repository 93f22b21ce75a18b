"""The sandbox broker: run/write in agent X's workspace under agent X's policy, nothing else.

A real broker serves on a real unix socket in a thread; real containers run
on the engine. The client is BrokerSandbox, the same class the orchestrator uses.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import docker
import pytest

from orchestrator.broker.client import BrokerClient, BrokerSandbox
from orchestrator.broker.ops import APPEND_MAX_BYTES
from orchestrator.broker.server import Broker
from orchestrator.broker.wire import BrokerError
from orchestrator.escapes.broker_probes import _egress_keys
from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.policy.ceiling import Ceiling
from orchestrator.policy.schema import DEFAULT
from orchestrator.sandbox import keeper as keeper_module
from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.change_set import MAX_LISTED, WakeChanges
from orchestrator.sandbox.disks import disk, disk_attach, disk_index, disk_room, layers
from orchestrator.sandbox.egress import egress_plan, network
from orchestrator.sandbox.engine import LABEL
from orchestrator.sandbox.keeper import HOST_ROOT_ENV
from orchestrator.sandbox.wakes import undo_folders, wake_layer
from orchestrator.wake.journal_stub import CLOSING_NOTE_CAP, append_in_sandbox
from tests.helpers import REPO, scrubbed_env, set_policy, today, wait_for
from tests.helpers.broker import served, served_tls
from tests.helpers.leftovers import our_containers

POOL_WAIT_S = 30  # a pool refill: create and start two containers
MEMORY_PROBE = (
    "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"  # cgroup v1, else v2
)


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "agents"
    init_agent(root / "alpha")
    return root


@pytest.fixture
def broker(root):
    with served(root) as sock:
        yield sock


def view(root: Path, name: str = "alpha") -> Path:
    """Where the broker mounts agent `name`'s disk: the workspace as its boxes see it
    (the folder under ROOT is not: only the broker mounts the disk): files/ of its root."""
    return layers.files(disk.path_of(disk_index.lookup(root / name), "view"))


def pool_containers(client, workspace: Path) -> dict[str, int]:
    """Idle warm containers for this workspace: short id -> their memory limit."""
    found = client.api.containers(
        filters={"label": [f"{LABEL}=1", f"wakeloop.workspace={workspace.resolve()}", "wakeloop.call_id=pool"]}
    )
    limits = {}
    for c in found:
        try:
            limits[c["Id"][:12]] = client.api.inspect_container(c["Id"])["HostConfig"]["Memory"]
        except docker.errors.NotFound:
            pass  # taken by a call and removed meanwhile
    return limits


def raw_request(sock: Path, request: dict) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(str(sock))
        s.sendall(json.dumps(request).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


def test_a_command_runs_in_a_fresh_hardened_box_and_nothing_is_left(broker, root, tmp_path, docker_client):
    box = BrokerSandbox(broker, "alpha")
    result = box.run(
        "echo hello > note.txt; cat note.txt; id -u; grep CapEff /proc/self/status", timeout_s=30, max_output_chars=2000
    )
    assert result.exit_code == 0 and result.container_id
    lines = result.output.split()
    assert lines[0] == "hello" and lines[1] != "0" and lines[-1] == "0000000000000000"
    assert (view(root) / "note.txt").read_text() == "hello\n"
    # The call's own container is gone; the pool's idle ones go when the broker stops.
    gone = lambda: result.container_id not in our_containers(docker_client, tmp_path)
    wait_for(gone, "the call's container to be removed", POOL_WAIT_S)


def test_the_timeout_is_the_policys_not_the_requests(broker, root):
    set_policy(root / "alpha", {"tools": {"bash": {"timeout_s": 2}}})
    result = BrokerSandbox(broker, "alpha").run("sleep 60", timeout_s=999, max_output_chars=100)
    assert result.timed_out and result.exit_code == 124 and result.duration_ms < 20_000


def test_writes_obey_the_agents_write_file_policy(broker, root):
    set_policy(root / "alpha", {"tools": {"write_file": {"max_bytes": 100, "deny": ["secret/**"]}}})
    box = BrokerSandbox(broker, "alpha")
    assert box.write("notes/a.md", b"fine\n").exit_code == 0
    assert (view(root) / "notes/a.md").read_text() == "fine\n"
    with pytest.raises(SandboxError, match="deny glob"):
        box.write("secret/key", b"x")
    with pytest.raises(SandboxError, match="at most 100 bytes"):
        box.write("big.txt", b"x" * 101)
    assert not (view(root) / "secret").exists()


def test_a_disabled_bash_is_refused_by_the_broker_itself(broker, root, capsys):
    set_policy(root / "alpha", {"tools": {"bash": {"enabled": False}}})
    with pytest.raises(SandboxError, match="bash tool is disabled"):
        BrokerSandbox(broker, "alpha").run("id", timeout_s=10, max_output_chars=100)
    # Refused before the agent's box is made: no pool warms up for a call never run.
    assert "alpha: made a sandbox" not in capsys.readouterr().out


def test_fields_a_request_should_not_have_change_nothing(broker):
    """Only op, agent and command count: image, user, binds and privileged are ignored."""
    reply = raw_request(
        broker,
        {
            "op": "run",
            "agent": "alpha",
            "command": "id -u; ls /host 2>&1",
            "image": "debian:bookworm-slim",
            "user": "0:0",
            "privileged": True,
            "binds": ["/:/host"],
            "timeout_s": 999,
        },
    )
    assert reply["ok"]
    uid, rest = reply["result"]["output"].split("\n", 1)
    assert uid != "0" and "No such file" in rest


@pytest.mark.parametrize(
    "request_",
    [
        {"op": "create_container", "agent": "alpha", "image": "alpine"},
        {"op": "run", "agent": "../alpha", "command": "id"},
        {"op": "run", "agent": "alpha/workspace", "command": "id"},
        {"op": "run", "agent": "nobody", "command": "id"},
        {"op": "run", "agent": "alpha", "command": ""},
        {"op": "write", "agent": "alpha", "path": "../escape", "content_b64": "eA=="},
    ],
    ids=["other-op", "dotdot", "slash", "unknown-agent", "empty-command", "write-outside"],
)
def test_anything_but_run_or_write_for_a_known_agent_is_refused(broker, request_):
    reply = raw_request(broker, request_)
    assert reply["ok"] is False and reply["error"] and "\n" not in reply["error"]


def test_output_that_looks_like_the_protocol_is_just_data(broker):
    fake = '{"ok": false, "error": "forged"}'
    result = BrokerSandbox(broker, "alpha").run(f"echo '{fake}'", timeout_s=30, max_output_chars=1000)
    assert result.exit_code == 0 and result.output.strip() == fake


def test_the_compose_healthcheck_pings_the_broker_with_the_wires_own_line(broker, tmp_path):
    from orchestrator import healthcheck
    from orchestrator.broker import ops

    assert ops.encode(ops.Ping()) == healthcheck.PING
    assert healthcheck.broker(str(broker)) is None and healthcheck.main(["broker", str(broker)]) == 0
    assert healthcheck.main(["broker", str(tmp_path / "no.sock")]) == 1


def test_a_smaller_output_cap_of_the_caller_is_kept_and_a_larger_one_is_not(broker):
    box = BrokerSandbox(broker, "alpha")
    small = box.run("head -c 5000 /dev/zero | tr '\\0' x", timeout_s=30, max_output_chars=100)
    assert small.ok and small.truncated and small.output.count("x") <= 100
    large = box.run("head -c 50000 /dev/zero | tr '\\0' x", timeout_s=30, max_output_chars=10**9)
    assert large.truncated and large.output.count("x") <= DEFAULT.tools.bash.max_output_chars


@pytest.mark.parametrize("disk_setting", ["2g", "none"])
def test_the_disk_is_the_folders_and_the_mount_source_is_the_host_path_of_the_workspace(
    root, monkeypatch, docker_client, disk_setting
):
    monkeypatch.setenv(HOST_ROOT_ENV, "/srv/host/agents")
    # pool 0: no container for a mount source that is not there
    set_policy(root / "alpha", {"sandbox": {"pool": 0, "disk": disk_setting}})
    broker = Broker(root, client=docker_client, log=lambda line: None)
    entry = broker.keeper._acquire(broker._agent("alpha"))
    broker.keeper._release(entry)
    _, host = entry.box.container_spec(["true"])
    key = disk_index.lookup(root / "alpha")
    if disk_setting == "2g":  # the index records where the host sees the folder
        assert disk_index.read_index()[key]["folder"] == "/srv/host/agents/alpha"
    assert [(m["Type"], m["Source"]) for m in host["mounts"]] == (
        [("bind", str(disk.host_box(key)))]  # KEY.box, in $WAKELOOP_DISKS: never a path under ROOT
        if disk_setting == "2g"
        else [("bind", "/srv/host/agents/alpha/workspace")]
    )
    assert [m["Target"] for m in host["mounts"]] == ["/workspace"]
    broker.close()
    monkeypatch.delenv(HOST_ROOT_ENV)
    assert Broker(root, client=docker_client).keeper.host_root == root.resolve()  # not in a container


def test_a_whole_wake_through_the_broker_needs_no_docker_access(broker, root):
    env = scrubbed_env()
    env["WAKELOOP_BROKER"] = str(broker)
    env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"  # the orchestrator has no engine
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "wake", str(root / "alpha")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    receipt = json.loads(done.stdout.strip().splitlines()[-1])
    assert receipt["status"] == "done" and receipt["tool_calls"] == 4 and receipt["journal"] == "agent"
    assert (view(root) / "memory/dry-run.md").exists()


def test_over_the_ceiling_a_wake_does_not_start_and_says_why_in_one_line(root, docker_client):
    set_policy(root / "alpha", {"sandbox": {"pids": 4096}})
    env = scrubbed_env()
    with served(root, Ceiling(max={"pids": 256}, source="ceiling.yaml")) as sock:
        env["WAKELOOP_BROKER"] = str(sock)
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", "wake", str(root / "alpha")],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=REPO,
        )
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    assert "sandbox.pids: 4,096 is over the broker's ceiling of 256 (ceiling ceiling.yaml)" in done.stderr
    assert not list((root / "alpha/state").glob("events*"))  # refused before the wake began
    assert our_containers(docker_client, root) == []


def test_the_shipped_ceiling_refuses_a_hundred_billion_output_chars_at_check(root, docker_client):
    """Issue 20: through the broker, a policy with tools.bash.max_output_chars 100000000000
    passed `check` (max had no bound for it); the broker holds a call's output in memory."""
    from orchestrator.policy.ceiling import load_ceiling

    set_policy(root / "alpha", {"tools": {"bash": {"max_output_chars": 100_000_000_000}}})
    with served(root, load_ceiling(REPO / "policies" / "ceiling.yaml")) as sock:
        with pytest.raises(SandboxError, match="tools.bash.max_output_chars: 100,000,000,000 is over"):
            BrokerSandbox(sock, "alpha").check()
        with pytest.raises(SandboxError, match="max_output_chars"):
            BrokerSandbox(sock, "alpha").run("true", timeout_s=30, max_output_chars=100)
    assert our_containers(docker_client, root) == []


# -- one warm pool per agent ----------------------------------------------------------------


def no_model_turn(monkeypatch) -> None:
    """These tests' first calls come straight after begin, from no model: however loaded the host,
    a first call that waits for its fill does not grow the pool (pool.FIRST_TURN_S), which a test
    counting containers ahead would otherwise see or not by the host's load."""
    from orchestrator.sandbox.containers import pool

    monkeypatch.setattr(pool, "FIRST_TURN_S", POOL_WAIT_S)


def test_calls_for_one_agent_are_served_from_its_pool_and_nothing_outlives_the_broker(root, docker_client, monkeypatch):
    workspace = root / "alpha/workspace"
    no_model_turn(monkeypatch)
    with served(root) as sock:
        box = BrokerSandbox(sock, "alpha")
        box.begin("0123456789ab")  # in a wake, as the loop calls (one outside a wake is a wake of its own)
        first = box.run("true", timeout_s=30, max_output_chars=100)
        # The first call's own container may still be listed: it is removed after the call, off its path.
        warm = wait_for(
            lambda: set(pool_containers(docker_client, workspace)) - {first.container_id},
            "the agent's pool to be warm",
            POOL_WAIT_S,
        )
        second = box.run("true", timeout_s=30, max_output_chars=100)
        assert first.ok and second.ok and second.container_id != first.container_id
        assert second.container_id in warm, "the second call should take a warm container"
        wait_for(lambda: len(pool_containers(docker_client, workspace)) >= 1, "the pool to refill", POOL_WAIT_S)
        box.finish()
    assert our_containers(docker_client, root.resolve()) == []


def test_a_policy_change_reaches_the_next_call_and_the_pool(broker, root, docker_client):
    workspace = root / "alpha/workspace"
    box = BrokerSandbox(broker, "alpha")
    assert box.run(MEMORY_PROBE, timeout_s=30, max_output_chars=100).output.strip() == str(512 * 2**20)
    wait_for(lambda: len(pool_containers(docker_client, workspace)) >= 1, "the pool to be warm", POOL_WAIT_S)
    set_policy(root / "alpha", {"sandbox": {"memory": "300m"}})
    result = box.run(MEMORY_PROBE, timeout_s=30, max_output_chars=100)
    assert result.ok and result.output.strip() == str(300 * 2**20)
    # The idle containers made under 512m are drained; the refill is made under 300m.
    wait_for(
        lambda: (p := pool_containers(docker_client, workspace)) and len(p) >= 1 and set(p.values()) == {300 * 2**20},
        "a pool made under the new memory limit",
        POOL_WAIT_S,
    )
    assert box.run(MEMORY_PROBE, timeout_s=30, max_output_chars=100).output.strip() == str(300 * 2**20)


def test_an_agent_yaml_edited_past_the_ceiling_is_refused_before_any_container(root, docker_client):
    # What a taken-over orchestrator can do under compose: edit agent.yaml.
    ceiling = Ceiling(
        runtimes=("runc", "runsc"), networks=("none",), max={"pids": 256, "memory": 256 * 2**20}, source="ceiling.yaml"
    )
    with served(root, ceiling) as sock:
        box = BrokerSandbox(sock, "alpha")
        for ask, refusal in [
            ({"pids": 100_000}, "sandbox.pids: 100,000 is over the broker's ceiling of 256"),
            ({"network": "bridge"}, "sandbox.network: bridge is not one the broker allows"),
            ({"runtime": "kata"}, "sandbox.runtime: kata is not one the broker allows"),
        ]:
            set_policy(root / "alpha", {"sandbox": {"memory": "128m", **ask}})
            with pytest.raises(SandboxError, match=f"alpha: {root}/alpha/agent.yaml:[0-9]+: {refusal}"):
                box.run("echo ran", timeout_s=30, max_output_chars=100)
            assert our_containers(docker_client, root) == []
        set_policy(root / "alpha", {"sandbox": {"memory": "128m", "pids": 256}})  # at the ceiling: served
        assert box.run("echo ran", timeout_s=30, max_output_chars=100).output == "ran\n"


def test_an_allowlist_agents_dead_proxy_is_made_anew_by_its_next_call(root, docker_client, monkeypatch, capsys):
    monkeypatch.setattr(keeper_module, "EGRESS_CHECK_S", 0.0)  # check on every call
    hosts = ["x.wakeloop.test"]  # never dialled: the test reads only the proxy's address
    set_policy(root / "alpha", {"sandbox": {"network": "allowlist", "allow_hosts": hosts, "pool": 1}})
    egress = egress_plan.plan((root / "alpha/workspace").resolve(), tuple(hosts))
    try:
        with served(root) as sock:
            box = BrokerSandbox(sock, "alpha")
            assert box.run("echo $HTTPS_PROXY", timeout_s=30, max_output_chars=100).output.strip() == egress.proxy_url
            dead = docker_client.api.inspect_container(egress.proxy)["Id"]
            docker_client.api.kill(egress.proxy)  # as an OOM kill would
            assert not network.alive(docker_client, egress)
            result = box.run("echo $HTTPS_PROXY", timeout_s=30, max_output_chars=100)
            assert result.exit_code == 0 and result.output.strip() == egress.proxy_url
            assert network.alive(docker_client, egress)
            assert docker_client.api.inspect_container(egress.proxy)["Id"] != dead
        assert "alpha: its allowlist proxy or network holder is gone" in capsys.readouterr().out
    finally:
        network.shutdown(docker_client, {egress.key})


def test_concurrent_calls_for_one_agent_share_one_pool(broker, root, docker_client):
    box = BrokerSandbox(broker, "alpha")
    results = [None] * 6

    def call(i):
        results[i] = box.run(f"echo {i}", timeout_s=30, max_output_chars=100)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [r.output.strip() for r in results] == [str(i) for i in range(len(results))]
    assert len({r.container_id for r in results}) == len(results)  # one container per call
    # One pool for the agent, not one per request: one ahead, or the policy's 2 if calls outran it.
    wait_for(
        lambda: 1 <= len(pool_containers(docker_client, root / "alpha/workspace")) <= 2, "a pool of 1 or 2", POOL_WAIT_S
    )


@pytest.mark.parametrize("why", ["renamed", "idle"])
def test_a_pool_is_closed_when_its_agent_is_gone_or_idle(root, docker_client, monkeypatch, why):
    broker = Broker(root, client=docker_client, log=lambda line: None)
    try:
        reply = broker.handle({"op": "run", "agent": "alpha", "command": "true"})
        assert reply["ok"]
        wait_for(lambda: len(pool_containers(docker_client, root / "alpha/workspace")) >= 1, "a warm pool", POOL_WAIT_S)
        if why == "renamed":
            (root / "alpha").rename(root / "beta")  # the workspace path of the pool is gone
        else:
            monkeypatch.setattr(keeper_module, "IDLE_CLOSE_S", 0)
        broker.keeper._next_sweep = 0  # sweep now, not in SWEEP_EVERY_S
        broker.sweep()
        assert broker.keeper._boxes == {}
        assert our_containers(docker_client, root.resolve()) == []  # close() waits for the removals
    finally:
        broker.close()


def test_a_swarm_tasks_broker_without_loop_devices_refuses_a_disk_agent_in_one_line(root, docker_client, monkeypatch):
    # A broker run as a swarm task without --plain-container: no /dev/loop-control (the stand-in
    # here for the devices a swarm service cannot be given). A disk agent is refused, saying the way
    # out; an agent without a disk is served.
    from orchestrator.broker import nodes

    monkeypatch.setenv(nodes.NODE_ENV, "swx-n1")
    no_loops = "this host has no loop devices (/dev/loop-control is missing)"
    monkeypatch.setattr(disk_attach, "unavailable", lambda: no_loops)
    broker = Broker(root, client=docker_client, log=lambda line: None)
    try:
        with pytest.raises(BrokerError, match="run the broker with --plain-container"):
            broker.handle({"op": "check", "agent": "alpha"})
        set_policy(root / "alpha", {"sandbox": {"disk": "none"}})
        assert broker.handle({"op": "check", "agent": "alpha"})["ok"]
    finally:
        broker.close()


def test_a_disk_agents_first_wake_through_the_broker_makes_its_first_container_at_begin(root, docker_client):
    # Its boxes bind the wake's overlay, mounted at begin: a container its new box made at once was
    # drained at begin unused, one in vain for each agent's first wake (the fleet bench through the
    # broker: 67 containers for 50 calls at 10 agents, against 50 in process).
    workspace = (root / "alpha/workspace").resolve()
    since = int(time.time()) - 1
    broker = Broker(root, client=docker_client, log=lambda line: None)
    try:
        assert broker.handle({"op": "check", "agent": "alpha"})["ok"]
        assert broker.handle({"op": "begin", "agent": "alpha", "run_id": "0123456789ab"})["ok"]
        assert broker.keeper._boxes["alpha"].box.pool.wait_ready(1, POOL_WAIT_S), "one container ahead at begin"
        assert broker.handle({"op": "wind_down", "agent": "alpha"})["ok"]  # no call comes: none more
        assert broker.handle({"op": "finish", "agent": "alpha", "run_id": "0123456789ab"})["ok"]
    finally:
        broker.close()
    creates = docker_client.events(
        since=since,
        until=int(time.time()) + 1,  # the window's end: every create above is in it
        decode=True,
        filters={"type": "container", "event": "create", "label": f"wakeloop.workspace={workspace}"},
    )
    assert len(list(creates)) == 1, "a container made for nothing"


def test_a_wake_winding_down_stops_its_pool_and_the_next_wakes_check_rearms_it(root, docker_client, monkeypatch):
    no_model_turn(monkeypatch)
    broker = Broker(root, client=docker_client, log=lambda line: None)
    workspace = root / "alpha/workspace"
    try:
        assert broker.handle({"op": "begin", "agent": "alpha", "run_id": "0123456789ab"})["ok"]
        assert broker.handle({"op": "run", "agent": "alpha", "command": "true"})["ok"]
        wait_for(lambda: len(pool_containers(docker_client, workspace)) == 1, "one container ahead", POOL_WAIT_S)
        assert broker.handle({"op": "wind_down", "agent": "alpha"}) == {"ok": True, "result": {}}
        assert broker.handle({"op": "run", "agent": "alpha", "command": "true"})["ok"]  # the stub, say
        pool = broker.keeper._boxes["alpha"].box.pool
        assert (pool.want, pool.idle(), pool._making) == (0, [], 0), "nothing made for a call that won't come"
        assert broker.handle({"op": "finish", "agent": "alpha", "run_id": "0123456789ab"})["ok"]
        assert broker.handle({"op": "check", "agent": "alpha"})["ok"]  # the next wake
        assert broker.handle({"op": "begin", "agent": "alpha", "run_id": "0123456789ac"})["ok"]
        wait_for(lambda: len(pool_containers(docker_client, workspace)) == 1, "one ahead again", POOL_WAIT_S)
        with pytest.raises(BrokerError):  # a hint names an agent as strictly as a call does
            broker.handle({"op": "wind_down", "agent": "../alpha"})
    finally:
        broker.close()
    assert our_containers(docker_client, root.resolve()) == []


def test_the_rate_op_measures_the_engine_once_however_often_it_is_asked_and_pings_then_say_it(root, docker_client):
    broker = Broker(root, client=docker_client, log=lambda line: None)
    try:
        before = broker.handle({"op": "ping"})["result"]  # placement's inputs past one host (nodes.py)
        assert before["rate"] is None  # a ping never measures: that takes seconds
        assert before["room"] == disk_room.promise_room(broker.keeper.overcommit) and before["room"] > 0
        first = broker.handle({"op": "rate"})["result"]
        assert first["per_s"] > 0 and first["calls"] >= 1 and first["latency_s"] > 0
        assert broker.handle({"op": "rate"})["result"] == first  # kept, not measured again
        assert broker.handle({"op": "ping"})["result"]["rate"] == first["per_s"]
    finally:
        broker.close()
    assert our_containers(docker_client, root.resolve()) == []


def test_a_rate_whose_calls_could_not_be_made_is_an_error_not_a_rate(tmp_path, docker_client):
    # The broker in a container once measured on its own /tmp, which the engine cannot bind: each
    # call raised in its thread, none ran, and "8 cold calls in 0.0 s" came back as 400 containers/s.
    from orchestrator.policy.schema import DEFAULT
    from orchestrator.sandbox import rate

    with pytest.raises(SandboxError, match="measuring the engine's rate: .*cannot create a sandbox container"):
        rate.measure(docker_client, DEFAULT.sandbox, 4, 2, under=(tmp_path, tmp_path / "not-on-the-host"))
    assert not list(tmp_path.iterdir())  # the scratch folder went with it


def test_closing_the_broker_removes_every_agents_pool(root, docker_client):
    init_agent(root / "beta")
    broker = Broker(root, client=docker_client, log=lambda line: None)
    try:
        for name in ("alpha", "beta"):
            assert broker.handle({"op": "run", "agent": name, "command": "true"})["ok"]
            wait_for(
                lambda name=name: len(pool_containers(docker_client, root / name / "workspace")) >= 1,
                "a warm pool",
                POOL_WAIT_S,
            )
    finally:
        broker.close()
    assert our_containers(docker_client, root.resolve()) == []


# -- the journal stub: append, for any agent, to today's journal only -------------------------


def test_an_agent_without_bash_or_write_file_still_gets_its_journal_stub(broker, root, tmp_path):
    set_policy(root / "alpha", {"tools": {"bash": {"enabled": False}, "write_file": {"enabled": False}}})
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "I forgot to journal."}]))
    env = scrubbed_env()
    env["WAKELOOP_BROKER"] = str(broker)
    env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"  # the orchestrator has no engine
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "wake", str(root / "alpha"), "--script", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    receipt = json.loads(done.stdout.strip().splitlines()[-1])
    assert receipt["journal"] == "stub", receipt
    assert "harness stub" in (view(root) / f"memory/journal/{today()}.md").read_text()


def test_append_adds_to_the_journal_and_never_truncates(broker, root):
    box, rel = BrokerSandbox(broker, "alpha"), f"memory/journal/{today()}.md"
    assert append_in_sandbox(box, rel, "one\n")[0]
    ok, detail = append_in_sandbox(box, rel, "two\n")
    assert ok and detail.startswith("appended 4 bytes"), detail
    assert (view(root) / rel).read_text() == "one\ntwo\n"


@pytest.mark.parametrize(
    "path",
    [
        "notes/x.md",
        "memory/journal/../../x.md",
        "memory/journal/2026-11-29.md.sh",
        "memory/journal/2026-11-29.md\n",
        "./memory/journal/2026-11-29.md",
        "/workspace/memory/journal/2026-11-29.md",
        "memory/journal/sub/2026-11-29.md",
        "memory/journal/٢٠٢٦-11-29.md",
        "memory/core.md",
        None,
    ],
)
def test_append_is_refused_for_any_path_but_a_journal_day(broker, root, path):
    reply = raw_request(broker, {"op": "append", "agent": "alpha", "path": path, "content_b64": "eA=="})
    assert reply["ok"] is False and "append is only for memory/journal/YYYY-MM-DD.md" in reply["error"]
    assert not (root / "x.md").exists() and not (view(root) / "notes").exists()


def test_append_is_capped_and_the_cap_holds_a_full_closing_note(broker, root):
    box, rel = BrokerSandbox(broker, "alpha"), f"memory/journal/{today()}.md"
    with pytest.raises(SandboxError, match="at most"):
        box.write(rel, b"x" * (APPEND_MAX_BYTES + 1), append=True)
    note = "\n## Wake #1 (closing note at the token budget, appended by the harness)\n" + "€" * CLOSING_NOTE_CAP
    assert box.write(rel, note.encode(), append=True).ok


def test_append_through_a_symlinked_journal_is_refused_as_write_is(broker, root, tmp_path):
    outside = tmp_path / "host-file"
    outside.write_text("host original\n")
    os.chmod(outside, 0o666)  # writable by anyone: only not following the link protects it
    journal = root / "alpha/workspace/memory/journal"
    (journal / "2026-01-01.md").symlink_to(outside)
    (journal / "2026-01-02.md").symlink_to("../core.md")
    core = (root / "alpha/workspace/memory/core.md").read_bytes()  # copied onto the disk at its first call
    box = BrokerSandbox(broker, "alpha")
    for day in ("2026-01-01", "2026-01-02"):
        ok, detail = append_in_sandbox(box, f"memory/journal/{day}.md", "pwned\n")
        assert not ok and detail.startswith("refused"), detail
    assert outside.read_text() == "host original\n"
    assert (view(root) / "memory/core.md").read_bytes() == core


# -- a taken-over orchestrator (the attacks themselves: the escape suite's "orchestrator") --


def test_allow_hosts_changed_on_every_call_leaves_one_proxy_not_one_per_change(root, docker_client):
    # Each change makes a new box with a new proxy, holder and network; the retired
    # box's must go with it, or a request loop leaks one set per request.
    workspace = (root / "alpha/workspace").resolve()
    lists = [[f"h{i}.wakeloop.test"] for i in range(3)]  # never dialled
    keys = {egress_plan.plan(workspace, tuple(hosts)).key for hosts in lists}
    broker = Broker(root, client=docker_client, log=lambda line: None)
    try:
        for hosts in lists:
            set_policy(root / "alpha", {"sandbox": {"network": "allowlist", "allow_hosts": hosts, "pool": 0}})
            assert broker.handle({"op": "run", "agent": "alpha", "command": "true"})["ok"]
        assert _egress_keys(docker_client) & keys == {egress_plan.plan(workspace, tuple(lists[-1])).key}
        broker.close()
        assert not _egress_keys(docker_client) & keys  # close() removed the last
    finally:
        broker.close()
        network.shutdown(docker_client, keys)


def test_past_max_agents_the_longest_idle_pool_is_closed_and_a_busy_one_refuses(root, docker_client):
    init_agent(root / "beta")
    for name in ("alpha", "beta"):
        set_policy(root / name, {"sandbox": {"pool": 1}})
    broker = Broker(
        root, client=docker_client, log=lambda line: None, ceiling=Ceiling(max={"agents": 1}, source="c.yaml")
    )
    try:
        assert broker.handle({"op": "run", "agent": "alpha", "command": "true"})["ok"]
        assert broker.handle({"op": "run", "agent": "beta", "command": "true"})["ok"]
        assert list(broker.keeper._boxes) == ["beta"]  # alpha's idle pool made room
        assert pool_containers(docker_client, root / "alpha/workspace") == {}
        broker.keeper._boxes["beta"].busy += 1  # as if a call of beta's were in flight
        with pytest.raises(BrokerError, match="alpha: busy: 1 agents hold a sandbox, the broker's max.agents is 1"):
            broker.handle({"op": "run", "agent": "alpha", "command": "true"})
        broker.keeper._boxes["beta"].busy -= 1
    finally:
        broker.close()
    assert our_containers(docker_client, root.resolve()) == []


def test_the_read_op_reads_only_the_agents_own_disk_without_following_links(broker, root):
    box = BrokerSandbox(broker, "alpha")
    assert box.run(
        "echo remembered > memory/core.md; ln -s /etc/passwd memory/link.md", timeout_s=30, max_output_chars=100
    ).ok
    files = box.files()
    assert files.read_text_or_none("memory/core.md") == "remembered\n"
    assert "symlink, which the harness never follows" in files.read_text("memory/link.md")
    assert "not a plain relative path" in files.read_text("../../../etc/passwd")
    assert files.journal_size("../../../../etc/passwd") is None  # a day, not a path
    assert files.read_text_or_none("memory/none.md") is None
    reply = raw_request(broker, {"op": "read", "agent": "alpha", "what": "open", "arg": "/etc/passwd"})
    assert reply["ok"] is False and "read is one of" in reply["error"]


# -- past one host: the same wire over TCP with mutual TLS (broker/tls.py) ----------------------


def test_over_mutual_tls_a_wake_s_calls_and_reads_go_through_and_another_stacks_broker_is_refused(
    root, tmp_path, monkeypatch, capsys
):
    from orchestrator.broker import tls
    from orchestrator.broker.client import BrokerClient
    from orchestrator.broker.wire import BrokerRefusal

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    tls.make_certs(ours)
    tls.make_certs(theirs)
    with served_tls(root, ours, capsys) as address:
        with pytest.raises(BrokerRefusal, match="WAKELOOP_TLS_DIR"):  # no certificates named: one line
            BrokerSandbox(address, "alpha").check()
        monkeypatch.setenv(tls.TLS_DIR_ENV, str(ours))
        box = BrokerSandbox(address, "alpha")
        box.check()
        result = box.run("echo over-tls > note.txt; cat note.txt", timeout_s=30, max_output_chars=1000)
        assert result.ok and result.output.strip() == "over-tls"
        assert box.files().read_text("note.txt") == "over-tls\n"
        assert BrokerClient(address).ping().root == str(root.resolve())
        # A node lost sends nothing: a silent connection is probed, and a request left unacknowledged
        # (no probes then) is given up after 11 s, not the kernel's ~15 minutes of retransmissions.
        with tls.connect(address) as conn:
            assert conn.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 11_000
        monkeypatch.setenv(tls.TLS_DIR_ENV, str(theirs))  # a client of another stack: its CA does not know ours
        with pytest.raises(SandboxError, match="failed the TLS handshake"):
            BrokerSandbox(address, "alpha").check()


def test_through_the_broker_a_wake_sees_its_changes_and_the_broker_commits_them_under_its_policy(broker, root):
    set_policy(root / "alpha", {"workspace": {"protect": ["deploy/**"]}})
    box = BrokerSandbox(broker, "alpha")
    run_id = "00112233aabb"
    box.begin(run_id)
    assert box.run("echo a > a.txt; mkdir -p deploy; echo b > deploy/x", 30, 2000).exit_code == 0
    seen = box.run("cat a.txt", 30, 2000).output
    assert not (view(root) / "a.txt").exists()  # the disk's files/: not until the wake ends
    changes = box.finish((), True)  # the broker's own copy of the policy decides, not ours
    assert seen.endswith("a\n") and (view(root) / "a.txt").read_text() == "a\n"
    assert not (view(root) / "deploy/x").exists()
    assert "a.txt" in [c.path for c in changes.committed]
    assert [(r.change.path, r.rule) for r in changes.refused] == [("deploy", "deploy/**"), ("deploy/x", "deploy/**")]
    with pytest.raises(SandboxError, match="no wake"):  # finished: a second finish names no open wake
        BrokerClient(broker).finish("alpha", run_id)


def test_through_the_broker_a_wake_of_hundreds_of_changes_is_counted_whole(broker, root):
    """The record names MAX_LISTED changes and counts the rest; back through the broker it kept
    the names and lost the count (300 files recorded as 200, `more: 0`)."""
    set_policy(root / "alpha", {"workspace": {"protect": ["deploy/**"]}})
    box = BrokerSandbox(broker, "alpha")
    box.begin("00112233aacc")
    made = "mkdir -p many deploy && for i in $(seq 300); do echo $i > many/$i; echo $i > deploy/$i; done"
    assert box.run(made, 60, 2000).exit_code == 0
    changes = box.finish((), True)
    record = changes.record()
    assert (changes.count, changes.refused_count) == (301, 301)  # many/ and its 300 files; deploy/ and its
    assert (record.count, record.refused_count) == (301, 301)
    assert len(record.paths) == len(record.refused) == MAX_LISTED
    assert record.more == 2 * (301 - MAX_LISTED)
    assert WakeChanges.from_record(record).record() == record  # through the wire again: nothing lost


def test_nothing_of_an_agents_is_served_while_its_wake_is_committed(broker, root, monkeypatch):
    """A call, a begin, a second finish or an undo that arrives while a wake's finish runs is
    refused at once. Before, a call then made a box that bound KEY.box as the overlay went and
    wrote files/ directly during the commit (a protected path included); a second finish
    committed the same layer twice at once. The commit is held here by the test, not by a sleep."""
    set_policy(root / "alpha", {"workspace": {"protect": ["deploy/**"]}})
    committing, go_on = threading.Event(), threading.Event()
    commit = wake_layer.finish

    def held_commit(*args, **kwargs):
        committing.set()
        assert go_on.wait(POOL_WAIT_S), "the test did not let the commit go on"
        return commit(*args, **kwargs)

    monkeypatch.setattr(wake_layer, "finish", held_commit)
    box, client, run_id = BrokerSandbox(broker, "alpha"), BrokerClient(broker), "00112233aabc"
    box.begin(run_id)
    assert box.run("echo a > a.txt", 30, 2000).exit_code == 0
    finished: list = []
    finisher = threading.Thread(target=lambda: finished.append(box.finish()))
    finisher.start()
    try:
        assert committing.wait(POOL_WAIT_S), "the finish never reached its commit"
        refusals = {
            "run": lambda: box.run("mkdir -p deploy; echo owned > deploy/x", 30, 2000),
            "write": lambda: box.write("deploy/y", b"owned"),
            "begin": lambda: client.begin("alpha", "00112233aabd"),
            "finish": lambda: client.finish("alpha", run_id),
            "undo": lambda: client.undo("alpha", run_id, False),
        }
        said = {}
        for op, ask in refusals.items():
            try:
                said[op] = f"served: {ask()}"
            except SandboxError as exc:
                said[op] = str(exc)
    finally:
        go_on.set()
        finisher.join(POOL_WAIT_S)
    assert all("being begun, committed or undone" in line for line in said.values()), said
    assert [c.path for c in finished[0].committed] == ["a.txt"]
    assert not (view(root) / "deploy").exists()
    assert box.run("cat a.txt", 30, 2000).output.endswith("a\n")  # after the finish: served again


def test_a_call_outside_a_wake_is_a_wake_of_its_own_that_protect_binds(root, docker_client):
    """`wakeloop sandbox exec`, or an orchestrator that never begins: the call runs in a wake of
    its own, committed at its end, so workspace.protect binds it as it binds a wake's calls.
    Calls that overlap share it (the first sees what the second wrote before either landed),
    and no wake begins under it."""
    set_policy(root / "alpha", {"workspace": {"protect": ["deploy/**"]}})
    broker = Broker(root, client=docker_client, log=lambda line: None)
    run = lambda command: broker.handle({"op": "run", "agent": "alpha", "command": command})["result"]
    try:
        alone = run("mkdir -p deploy; echo owned > deploy/x; echo ok > ok.txt")
        assert alone["exit_code"] == 0
        assert "not landed, refused by the policy at the call's end:" in alone["output"]
        assert "deploy/x (deploy/**)" in alone["output"]
        assert (view(root) / "ok.txt").read_text() == "ok\n" and not (view(root) / "deploy").exists()

        first: list = []
        waits = "until [ -e go ]; do sleep 0.05; done; echo 1 > one"  # for the second call's file
        waiting = threading.Thread(target=lambda: first.append(run(waits)))
        waiting.start()
        begun = lambda: "alpha" in broker.keeper._own and "alpha" not in broker.keeper._layering
        wait_for(begun, "the first call's own wake", POOL_WAIT_S)
        with pytest.raises(BrokerError, match="a call is still running"):
            broker.handle({"op": "begin", "agent": "alpha", "run_id": "0123456789ab"})
        assert run("echo go > go")["exit_code"] == 0
        waiting.join(POOL_WAIT_S)
        assert first[0]["exit_code"] == 0 and broker.keeper._own == {}
        assert (view(root) / "go").is_file() and (view(root) / "one").read_text() == "1\n"
        shared = undo_folders.last(view(root).parent)  # one wake committed both calls' files
        assert sorted(c.path for c in shared.changes) == ["go", "one"]
    finally:
        broker.close()
    assert our_containers(docker_client, root.resolve()) == []


def test_hosts_are_granted_only_where_the_policy_asks_about_them_and_the_ceiling_allows_them(root, docker_client):
    # What stands between a taken-over orchestrator and a host the agent was never meant to reach:
    # the broker's own reading of the policy (its network_host globs) and of the ceiling.
    set_policy(
        root / "alpha",
        {
            "sandbox": {"network": "allowlist", "allow_hosts": ["pypi.org"], "pool": 0},
            "approve": {"rules": [{"network_host": "*.wakeloop.test"}]},
        },
    )
    ceiling = Ceiling(hosts=("pypi.org", "a.wakeloop.test"), source="c.yaml")
    broker = Broker(root, client=docker_client, log=lambda line: None, ceiling=ceiling)
    try:
        for grant, says in (
            (["evil.example.org"], "evil.example.org is not covered by any approve.rules network_host"),
            (["b.wakeloop.test"], "b.wakeloop.test is not a host the broker allows (ceiling c.yaml)"),
            (["*.wakeloop.test"], "not a wildcard"),
            ("a.wakeloop.test", "grant_hosts must be a list"),
        ):
            with pytest.raises(BrokerError, match=re.escape(says)):
                broker.handle({"op": "run", "agent": "alpha", "command": "true", "grant_hosts": grant})
        policy = load_agent(root / "alpha").policy.sandbox
        assert egress_plan.plan_for((root / "alpha/workspace").resolve(), policy).key not in _egress_keys(docker_client)
    finally:
        broker.close()


@pytest.fixture
def node_broker(root, tmp_path, monkeypatch, capsys):
    """(address, stop) of a broker over mutual TLS as node n1's, the only node: setting `stop`
    takes the node away (its port then refuses, as a stopped node's does)."""
    from orchestrator.broker import nodes, tls

    certs = tmp_path / "certs"
    tls.make_certs(certs)
    monkeypatch.setenv(tls.TLS_DIR_ENV, str(certs))
    monkeypatch.setenv("WAKELOOP_BROKER", "tls://tasks.broker:7443")
    stop = threading.Event()
    with served_tls(root, certs, capsys, stop) as address:
        # as DNS and the pings of nodes.discover find it: listed while it answers
        monkeypatch.setattr(nodes, "discover", lambda _: (nodes.Node("n1", address),) if answers(address) else ())
        yield address, stop


def answers(address: str) -> bool:
    try:
        BrokerClient(address, connect_wait_s=1).ping()
    except SandboxError:
        return False
    return True


def lose(node_broker) -> None:
    address, stop = node_broker
    stop.set()
    wait_for(lambda: not answers(address), "the node's broker stopped", 30)


def test_a_wake_whose_node_goes_mid_wake_ends_not_committed_with_its_receipt_but_no_backoff(root, node_broker):
    """Seen on the swarm lab: a wake under way when its node stopped raised at its end (the journal's
    size read through the gone broker), so it left no receipt and counted as a failure: serve's
    backoff held the agent 60 s before its wakes were skipped as unavailable. Then it said `done`
    though nothing it changed was committed (issue 43): it says `not_committed`, and why, and its
    node's loss is no failure of the agent's (no backoff), as a skipped wake's is not."""
    from orchestrator.records import health
    from orchestrator.wake.loop import wake
    from orchestrator.wake.model import ScriptedModel

    class NodeLostAtTheEnd(ScriptedModel):
        def call(self, **kwargs):
            if self.step == 1:  # the tool call ran: the node goes before the wake's end
                lose(node_broker)
            return super().call(**kwargs)

    turns = [{"tool_calls": [{"name": "bash", "input": {"command": "echo ran"}}]}, {"text": "done"}]
    receipt = wake(load_agent(root / "alpha"), model=NodeLostAtTheEnd(turns))
    assert receipt.status == "not_committed" and receipt.tool_calls == 1, receipt
    assert receipt.reason.startswith("the wake's changes were not committed: "), receipt.reason
    assert "n1 does not answer" in receipt.node_lost and receipt.node_lost in receipt.reason, receipt
    assert receipt.journal.startswith("stub not written: the sandbox is unavailable"), receipt.journal
    assert health.load(root / "alpha/state").failures == 0


def test_a_wake_whose_node_goes_as_it_begins_is_skipped_as_unavailable_not_failed(root, node_broker, monkeypatch):
    """The other case seen on the lab: the node answered the wake's ping, then went before its box
    was opened; the wake raised, counted as a failure, and was held back 60 s."""
    from orchestrator.broker import nodes
    from orchestrator.records import health
    from orchestrator.wake.loop import wake
    from orchestrator.wake.model import ScriptedModel

    check = nodes.check_node

    def answered_then_lost(*args, **kwargs):
        check(*args, **kwargs)
        lose(node_broker)

    monkeypatch.setattr(nodes, "check_node", answered_then_lost)
    receipt = wake(load_agent(root / "alpha"), model=ScriptedModel([{"text": "never asked"}]))
    assert receipt.status == "skipped_node" and "it went as the wake began" in receipt.reason, receipt
    assert "n1 does not answer" in receipt.reason and health.load(root / "alpha/state").failures == 0
