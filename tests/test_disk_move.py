"""`wakeloop move` of an agent with a disk of its own: two real brokers, each a node with its own
disks, on one engine, over mutual TLS; the disk streamed from one to the other through the
orchestrator, checked by hash, the old copy deleted once the new one is in use."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from orchestrator.broker import nodes, ops, tls, wire
from orchestrator.cli.wakeloop import main
from orchestrator.records.placement import read_node, write_node
from orchestrator.sandbox.box import SandboxResult
from tests.helpers import make_agent
from tests.helpers.broker import node_process

pytestmark = pytest.mark.docker

ADDRESS = "tls://tasks.broker:7443"
MAKE = (
    "mkdir -p sub/deeper && echo kept > sub/deeper/a.md && head -c 3000000 /dev/urandom > big.bin "
    "&& ln -s /etc/hostname host && printf '#!/bin/sh\\necho ran\\n' > run.sh && chmod 755 run.sh"
)
LOOK = "sha256sum big.bin sub/deeper/a.md && readlink host && ./run.sh && stat -c '%a %U' run.sh big.bin"


def run(address: str, agent: str, command: str) -> str:
    result = ops.ask(address, ops.Run(agent, command), SandboxResult, 120)
    assert result.exit_code == 0, result
    return result.output


def images(disks: Path) -> list[str]:
    return sorted(p.name for p in disks.glob("*.img"))


@pytest.fixture
def two_nodes(tmp_path, monkeypatch, docker_client):
    certs, root = tmp_path / "certs", tmp_path / "agents"
    tls.make_certs(certs)
    root.mkdir()
    disks = {n: tmp_path / f"disks-{n}" for n in ("n1", "n2")}
    monkeypatch.setenv(tls.TLS_DIR_ENV, str(certs))
    monkeypatch.setenv("WAKELOOP_BROKER", ADDRESS)
    with node_process(root, certs, "n1", disks["n1"]) as one, node_process(root, certs, "n2", disks["n2"]) as two:
        up = {"n1": one, "n2": two}
        monkeypatch.setattr(nodes, "discover", lambda address: tuple(nodes.Node(n, a) for n, a in up.items()))
        yield root, up, disks


def test_a_disk_moves_to_another_node_whole_checked_and_leaves_nothing_behind(two_nodes, capsys):
    root, up, disks = two_nodes
    agent = make_agent(root, "mover", policy={"sandbox": {"disk": "64m"}})
    write_node(agent / "state", "n1")
    run(up["n1"], "mover", MAKE)
    before = run(up["n1"], "mover", LOOK)
    assert len(images(disks["n1"])) == 1 and images(disks["n2"]) == []

    assert main(["move", str(agent), "--to", "n2"]) == 0
    said = capsys.readouterr().out
    assert "its disk moved from n1 to n2" in said and "agreed at both ends" in said, said
    assert "deleted its old disk on n1" in said, said
    assert read_node(agent / "state") == "n2"
    assert run(up["n2"], "mover", LOOK) == before  # the same bytes, link, mode and owner, run from there
    assert images(disks["n1"]) == [] and len(images(disks["n2"])) == 1  # the old copy gone, after

    run(up["n2"], "mover", "echo written-on-n2 > later.md")
    assert main(["move", str(agent), "--to", "n1"]) == 0  # and back, with what it wrote there
    assert "deleted its old disk on n2" in capsys.readouterr().out
    assert run(up["n1"], "mover", "cat later.md") == "written-on-n2\n"
    assert images(disks["n2"]) == [] and len(images(disks["n1"])) == 1


def test_a_broker_refuses_to_import_over_or_drop_the_disk_in_use_and_a_hostile_stream(two_nodes, tmp_path):
    root, up, disks = two_nodes
    agent = make_agent(root, "kept", policy={"sandbox": {"disk": "64m"}})
    write_node(agent / "state", "n1")
    run(up["n1"], "kept", "echo mine > note.md")
    for req in (ops.Drop("kept"),):  # placed on n1: its disk there is the one in use
        with pytest.raises(wire.BrokerRefusal, match="placed on this node"):
            wire.request(up["n1"], ops.encode(req), 60)
    sock, reply = wire.open_stream(up["n1"], ops.encode(ops.Import("kept")))
    with sock:
        assert "placed on this node" in json.loads(reply.readline())["error"]

    # A taken-over orchestrator streams a tar that climbs out of the new disk: refused, nothing lands.
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        info = tarfile.TarInfo("../../../../escaped")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    sock, reply = wire.open_stream(up["n2"], ops.encode(ops.Import("kept")))
    with sock:
        assert json.loads(reply.readline())["result"] == {"ready": True}
        wire.send_frame(sock, evil.getvalue())
        wire.send_frame(sock, b"")
        answer = json.loads(reply.readline())
    assert not answer["ok"] and "without . or .." in answer["error"], answer
    assert not any(p.name == "escaped" for p in tmp_path.rglob("escaped"))
    assert run(up["n1"], "kept", "cat note.md") == "mine\n"  # the agent, on its node, untouched
