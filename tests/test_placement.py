"""Placement past one host without a swarm: the record, and the choice of node (broker/nodes.py)
with the discovery stood in by fixed answers. The swarm itself: tests/test_swarm.py."""

from __future__ import annotations

import os

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
