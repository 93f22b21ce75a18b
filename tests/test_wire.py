"""The broker's typed wire (orchestrator/broker/ops.py, replies.py, wire.py): one parse, one encoder each way.

No engine: what a line becomes, what is refused before any agent is looked
up, and that what the client encodes the server parses back unchanged.
The server's use of it, against a real engine, is in test_broker.py.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict

import pytest

from orchestrator.broker import ops, replies, wire
from orchestrator.broker.wire import BrokerError
from orchestrator.sandbox.box import SandboxResult

EVERY_OP = [
    ops.Ping(),
    ops.Rate(),
    ops.Check("alpha"),
    ops.WindDown("alpha"),
    ops.Run("alpha", "ls -la"),
    ops.Run("alpha", "ls", max_output_chars=100),
    ops.Run("alpha", "curl https://api.example.com", grant_hosts=("api.example.com", "b.example.com:8443")),
    ops.Write("alpha", "notes/a.md", b"\x00\xffbytes"),
    ops.Append("alpha", "memory/journal/2026-12-01.md", "€".encode()),
    ops.Read("alpha", "read_text", "memory/core.md"),
    ops.Read("alpha", "journal_names", None),
    ops.Begin("alpha", "0123456789ab"),
    ops.Finish("alpha", "0123456789ab"),
    ops.Diff("alpha", "0123456789ab"),
    ops.Diff("alpha", None),
    ops.Undo("alpha", "0123456789ab"),
    ops.Undo("alpha", "0123456789ab", force=True),
    ops.Export("alpha"),
    ops.Import("alpha"),
    ops.Drop("alpha"),
]


@pytest.mark.parametrize("request_", EVERY_OP, ids=lambda r: type(r).__name__)
def test_what_the_client_encodes_the_server_parses_back_unchanged(request_):
    line = ops.encode(request_)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert ops.parse(json.loads(line)) == request_


def test_every_op_has_its_type_and_each_type_one_op():
    assert set(ops.OPS) == {type(r).op for r in EVERY_OP}


@pytest.mark.parametrize(
    "raw, says",
    [
        ([], "one JSON object"),
        ({"op": "create_container", "image": "alpine"}, "unknown op"),
        ({"op": ["run"]}, "unknown op"),
        ({"op": "run", "agent": "../alpha", "command": "id"}, "agent must be the name of a folder"),
        ({"op": "check", "agent": 7}, "agent must be the name of a folder"),
        ({"op": "run", "agent": "alpha", "command": " "}, "non-empty string"),
        ({"op": "run", "agent": "alpha", "command": "x" * (ops.MAX_COMMAND_CHARS + 1)}, "at most"),
        ({"op": "run", "agent": "alpha", "command": "id", "max_output_chars": 0}, "positive whole number"),
        ({"op": "run", "agent": "alpha", "command": "id", "max_output_chars": True}, "positive whole number"),
        ({"op": "run", "agent": "alpha", "command": "id", "grant_hosts": "a.org"}, "grant_hosts must be a list"),
        ({"op": "run", "agent": "alpha", "command": "id", "grant_hosts": [1]}, "grant_hosts must be a list"),
        ({"op": "run", "agent": "alpha", "command": "id", "grant_hosts": ["h.org"] * 17}, "at most 16"),
        ({"op": "begin", "agent": "alpha", "run_id": "../../etc"}, "run_id must be 12 hex digits"),
        ({"op": "finish", "agent": "alpha"}, "run_id must be 12 hex digits"),
        ({"op": "write", "agent": "alpha", "path": 3, "content_b64": ""}, "path must be a string"),
        ({"op": "diff", "agent": "alpha", "run_id": "../../other/.wakeloop"}, "run_id must be 12 hex digits"),
        ({"op": "undo", "agent": "alpha", "run_id": "0123456789AB"}, "run_id must be 12 hex digits"),
        ({"op": "undo", "agent": "alpha"}, "run_id must be 12 hex digits"),
        ({"op": "undo", "agent": "alpha", "run_id": "0123456789ab", "force": "yes"}, "force must be true or false"),
        ({"op": "write", "agent": "alpha", "path": "a", "content_b64": "not base64!"}, "base64"),
        ({"op": "append", "agent": "alpha", "path": "memory/core.md", "content_b64": ""}, "append is only for"),
        (
            {
                "op": "append",
                "agent": "alpha",
                "path": "memory/journal/2026-12-01.md",
                "content_b64": base64.b64encode(b"x" * (ops.APPEND_MAX_BYTES + 1)).decode(),
            },
            "at most",
        ),
        ({"op": "read", "agent": "alpha", "what": "__class__", "arg": "x"}, "read is one of"),
        ({"op": "read", "agent": "alpha", "what": "read_text"}, "needs a string arg"),
    ],
)
def test_a_malformed_request_is_refused_in_one_line_before_any_agent_is_looked_up(raw, says):
    with pytest.raises(BrokerError, match=says) as refused:
        ops.parse(raw)
    assert "\n" not in str(refused.value)


def test_fields_a_request_should_not_have_are_dropped_not_obeyed():
    parsed = ops.parse(
        {
            "op": "run",
            "agent": "alpha",
            "command": "id",
            "image": "alpine",
            "privileged": True,
            "timeout_s": 999,
            "user": "0:0",
        }
    )
    assert parsed == ops.Run("alpha", "id")


def test_a_results_asked_hosts_cross_the_wire_as_they_were():
    result = SandboxResult(0, "", 0, False, False, False, 1, "c", asked_hosts=("a.example.com", "b.example.com:8443"))
    sent = json.loads(json.dumps(asdict(result)))  # as the server answers
    assert replies.from_json(SandboxResult, sent) == result


def test_a_refusal_has_one_shape():
    assert wire.refusal(wire.Refusal("no", refused=True)) == {"ok": False, "error": "no", "refused": True}
    assert wire.ok({"value": 1}) == {"ok": True, "result": {"value": 1}}


def test_swarm_certs_makes_the_stacks_files_once_and_listen_without_them_is_one_line(tmp_path, capsys):
    from orchestrator.broker import tls
    from orchestrator.cli import main

    assert main(["swarm", "certs", str(tmp_path / "certs")]) == 0
    made = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "certs").iterdir()}
    assert made == {
        tls.CA: 0o644,
        tls.CA_KEY: 0o600,
        "wakeloop-broker.pem": 0o644,
        "wakeloop-broker.key": 0o600,
        "wakeloop-orchestrator.pem": 0o644,
        "wakeloop-orchestrator.key": 0o600,
    }
    assert tls.server_context(tmp_path / "certs") and tls.client_context(tmp_path / "certs")  # they load
    assert main(["swarm", "certs", str(tmp_path / "certs")]) == 2  # never over a stack's CA
    assert main(["broker", str(tmp_path), "--listen", "tls://127.0.0.1:7443"]) == 2
    with pytest.raises(SystemExit) as both:  # argparse: one or the other
        main(["broker", str(tmp_path), "--socket", "/tmp/x.sock", "--listen", "tls://127.0.0.1:1"])
    assert both.value.code == 2
    err = capsys.readouterr().err
    assert "never made over others" in err and "needs --tls-dir" in err
    with pytest.raises(tls.TLSConfigError, match="tls://HOST:PORT"):
        tls.host_port("tls://nohost")


def test_a_plain_container_broker_is_refused_in_one_line_off_a_swarm_task_and_gets_only_its_tls_files(tmp_path, capsys):
    import io
    import tarfile

    from orchestrator.broker import plain_container
    from orchestrator.cli import main

    certs = tmp_path / "certs"
    assert main(["swarm", "certs", str(certs)]) == 0
    capsys.readouterr()
    assert main(["broker", str(tmp_path), "--socket", str(tmp_path / "b.sock"), "--plain-container"]) == 2
    assert "needs --listen" in capsys.readouterr().err
    listen = ["--listen", "tls://127.0.0.1:7443", "--tls-dir", str(certs), "--plain-container"]
    assert main(["broker", str(tmp_path), *listen]) == 2  # this test runs on a plain host, not in a task
    assert "runs in a container (a swarm task)" in capsys.readouterr().err

    # What the task copies into the broker's container: the CA and the broker's pair, root's alone;
    # never the CA's key or the orchestrator's.
    with tarfile.open(fileobj=io.BytesIO(plain_container._tls_files(certs))) as tar:
        modes = {m.name: (m.mode, m.isdir()) for m in tar.getmembers()}
    tls_dir = plain_container.TLS_DIR.lstrip("/")
    assert modes == {
        tls_dir: (0o700, True),
        f"{tls_dir}/wakeloop-ca.pem": (0o400, False),
        f"{tls_dir}/wakeloop-broker.pem": (0o400, False),
        f"{tls_dir}/wakeloop-broker.key": (0o400, False),
    }
