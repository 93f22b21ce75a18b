"""Placement past one host without a swarm: the record, and the choice of node (broker/nodes.py)
by count, rate and room, with the discovery stood in by fixed answers. The swarm itself: tests/test_swarm.py."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from orchestrator.broker import nodes
from orchestrator.records.placement import PLACEMENT_FILE, placed, read_node, write_node

ADDRESS = "tls://tasks.broker:7443"


def agent(root, name):
    (root / name / "state").mkdir(parents=True)
    return root / name


def test_a_placement_is_written_whole_and_a_bad_one_reads_as_none(tmp_path):
    a = agent(tmp_path, "a")
    assert read_node(a / "state") is None
    write_node(a / "state", "swx-n2")
    assert read_node(a / "state") == "swx-n2" and placed(tmp_path) == {"swx-n2": 1}
    for bad in ("", "[]", '{"node": 3}', "{" * 5000):
        (a / "state" / PLACEMENT_FILE).write_text(bad)
        assert read_node(a / "state") is None


def test_agents_go_to_the_node_with_fewest_and_stay(tmp_path, monkeypatch):
    up = {"n1": "tls://10.0.0.1:7443", "n2": "tls://10.0.0.2:7443"}
    monkeypatch.setattr(nodes, "discover", lambda address: tuple(nodes.Node(n, a) for n, a in up.items()))
    where = {name: nodes.address_for(agent(tmp_path, name), ADDRESS) for name in ("a", "b", "c", "d")}
    assert sorted(placed(tmp_path).values()) == [2, 2]
    for name, address in where.items():
        assert address == up[read_node(tmp_path / name / "state")]
    lost = read_node(tmp_path / "a" / "state")
    del up[lost]
    with pytest.raises(nodes.NodeUnavailable, match=lost):
        nodes.address_for(tmp_path / "a", ADDRESS)  # its node gone: unavailable, not moved
    assert read_node(tmp_path / "a" / "state") == lost


def place_all(tmp_path, monkeypatch, up: list[nodes.Node], count: int, disk_bytes: int = 0) -> dict[str, int]:
    monkeypatch.setattr(nodes, "discover", lambda address: tuple(up))
    for i in range(count):
        nodes.address_for(agent(tmp_path, f"a{i}"), ADDRESS, disk_bytes)
    return placed(tmp_path)


def test_a_node_whose_engine_is_three_times_faster_takes_three_times_the_agents(tmp_path, monkeypatch):
    up = [nodes.Node("n1", "tls://10.0.0.1:7443", rate=3.0), nodes.Node("n2", "tls://10.0.0.2:7443", rate=1.0)]
    assert place_all(tmp_path, monkeypatch, up, 8) == {"n1": 6, "n2": 2}


def test_a_node_not_yet_measured_counts_as_the_others_mean(tmp_path, monkeypatch):
    up = [nodes.Node("n1", "tls://10.0.0.1:7443", rate=2.0), nodes.Node("n2", "tls://10.0.0.2:7443")]
    assert place_all(tmp_path, monkeypatch, up, 6) == {"n1": 3, "n2": 3}


def test_an_agent_goes_only_where_its_disk_can_be_promised_and_nowhere_is_said(tmp_path, monkeypatch):
    gib = 2**30
    up = [nodes.Node("n1", "tls://10.0.0.1:7443", 9.0, 1 * gib), nodes.Node("n2", "tls://10.0.0.2:7443", 1.0, 8 * gib)]
    assert place_all(tmp_path, monkeypatch, up, 4, disk_bytes=2 * gib) == {"n2": 4}  # n1, faster, has no room
    with pytest.raises(nodes.NodeUnavailable, match=r"no node .* can promise its sandbox.disk of 10,737,418,240"):
        nodes.address_for(agent(tmp_path, "big"), ADDRESS, 10 * gib)
    assert read_node(tmp_path / "big" / "state") is None  # not placed: its next wake asks again


@pytest.mark.parametrize("sent", [True, -1, float("nan"), float("inf"), "3", None, [1]])
def test_a_rate_or_room_a_ping_sends_that_is_not_a_finite_count_is_not_believed(sent):
    from orchestrator.broker import replies

    standing = replies.from_json(replies.Standing, {"root": "/r", "node": "n1", "rate": sent, "room": sent})
    assert (standing.rate, standing.room) == (None, None)
    assert replies.from_json(replies.Standing, {"rate": 3, "room": 3}) == replies.Standing("", "", 3.0, 3)


def test_one_host_is_not_placed(tmp_path, monkeypatch):
    monkeypatch.setattr(nodes, "discover", lambda address: (nodes.Node("", address),))
    a = agent(tmp_path, "a")
    assert nodes.address_for(a, "/run/wakeloop/broker.sock") == "/run/wakeloop/broker.sock"
    assert nodes.address_for(a, "tls://127.0.0.1:7443") == "tls://127.0.0.1:7443"  # a broker naming no node
    assert read_node(a / "state") is None


def test_a_planted_fifo_or_link_in_place_of_the_placement_is_never_opened_or_followed(tmp_path):
    # read under nodes' lock at every wake: a FIFO opened there would hang every wake on the swarm
    (tmp_path / "elsewhere.json").write_text('{"node": "theirs"}')
    os.mkfifo(tmp_path / PLACEMENT_FILE)
    assert read_node(tmp_path) is None  # returns at once: a FIFO is not a regular file
    os.unlink(tmp_path / PLACEMENT_FILE)
    (tmp_path / PLACEMENT_FILE).symlink_to(tmp_path / "elsewhere.json")
    assert read_node(tmp_path) is None
    write_node(tmp_path, "n1")
    assert read_node(tmp_path) == "n1" and (tmp_path / "elsewhere.json").read_text() == '{"node": "theirs"}'


def test_a_lost_node_is_told_once_per_series_of_skipped_wakes_not_at_each(tmp_path, monkeypatch):
    from orchestrator.notify import queue
    from orchestrator.policy.agent import load_agent
    from orchestrator.records.state import load_state, save_state
    from orchestrator.wake.loop import wake
    from tests.helpers import make_agent

    root = tmp_path / "agents"
    a = make_agent(root, "a", notify=[{"webhook": "http://127.0.0.1:9/hook"}])
    write_node(a / "state", "n-gone")  # placed on a node no broker answers for now
    monkeypatch.setenv("WAKELOOP_BROKER", "tls://127.0.0.1:9")  # discard: nothing listens
    agent = load_agent(a)

    def unavailable() -> list[str]:
        return [item.payload["text"] for item in queue.pending(agent.state_dir) if item.event == "unavailable"]

    receipts = [wake(agent) for _ in range(3)]
    assert [r.status for r in receipts] == ["skipped_node"] * 3
    (text,) = unavailable()
    assert "n-gone" in text and "skipped, not failed" in text
    state, _ = load_state(agent.state_dir)
    save_state(agent.state_dir, replace(state, last_receipt=replace(receipts[-1], status="done")))  # it came back
    assert wake(agent).status == "skipped_node" and len(unavailable()) == 2  # and went again: told again


def test_move_places_an_agent_on_a_live_node_off_a_lost_one_and_refuses_what_it_cannot_move(
    tmp_path, monkeypatch, capsys
):
    from orchestrator.cli.wakeloop import main
    from orchestrator.records.state import WakeLock
    from tests.helpers import make_agent

    root = tmp_path / "agents"
    a = make_agent(root, "a", policy={"sandbox": {"disk": "none"}})
    write_node(a / "state", "n-gone")  # its node lost: moving it off is the point
    up = {"n1": "tls://127.0.0.1:9", "n2": "tls://127.0.0.1:10"}  # discard ports: nothing listens
    monkeypatch.setattr(nodes, "discover", lambda address: tuple(nodes.Node(n, a) for n, a in up.items()))
    monkeypatch.delenv("WAKELOOP_BROKER", raising=False)
    assert main(["move", str(a), "--to", "n2"]) == 2  # one host: no nodes
    assert "only past one host" in capsys.readouterr().err
    monkeypatch.setenv("WAKELOOP_BROKER", ADDRESS)

    assert main(["move", str(a), "--to", "n2"]) == 0
    assert "n-gone -> n2" in capsys.readouterr().out
    assert read_node(a / "state") == "n2" and nodes.address_for(a, ADDRESS) == up["n2"]

    assert main(["move", str(a), "--to", "n9"]) == 2
    assert "no broker of node 'n9' answers" in capsys.readouterr().err and read_node(a / "state") == "n2"
    waking = WakeLock(a / "state")
    assert waking.acquire() is None
    try:
        assert main(["move", str(a), "--to", "n1"]) == 2
        assert "is waking" in capsys.readouterr().err and read_node(a / "state") == "n2"
    finally:
        waking.release()
    b = make_agent(root, "b", policy={"sandbox": {"disk": "1g"}})
    write_node(b / "state", "n-gone")  # its disk is there: a disk moves only between two live nodes
    assert main(["move", str(b), "--to", "n2"]) == 2
    assert "only between two live nodes" in capsys.readouterr().err and read_node(b / "state") == "n-gone"


def test_a_nodes_broker_refusing_connections_fails_a_call_in_seconds_not_the_wait_for_a_starting_one(
    tmp_path, monkeypatch
):
    """A node whose engine stopped refuses connections; waiting CONNECT_WAIT_S (for a broker still
    starting) on every call kept a wake under way there going for minutes after its node went."""
    import time

    from orchestrator.broker import tls, wire
    from orchestrator.broker.client import open_sandbox
    from orchestrator.policy.agent import load_agent
    from orchestrator.sandbox.box import SandboxError
    from tests.helpers import make_agent

    tls.make_certs(tmp_path / "certs")
    monkeypatch.setenv(tls.TLS_DIR_ENV, str(tmp_path / "certs"))
    monkeypatch.setenv("WAKELOOP_BROKER", ADDRESS)
    monkeypatch.setattr(nodes, "discover", lambda address: (nodes.Node("n1", "tls://127.0.0.1:9"),))  # discard
    agent = load_agent(make_agent(tmp_path / "agents", "a", policy={"sandbox": {"disk": "none"}}))
    started = time.monotonic()
    with pytest.raises(SandboxError, match="no sandbox broker at tls://127.0.0.1:9"):
        open_sandbox(agent)
    assert time.monotonic() - started < wire.CONNECT_WAIT_S and read_node(agent.state_dir) == "n1"
