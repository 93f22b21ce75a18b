"""The broker's typed wire (orchestrator/broker/ops.py, replies.py, wire.py): one parse, one encoder each way.

No engine: what a line becomes, what is refused before any agent is looked
up, and that what the client encodes the server parses back unchanged.
The server's use of it, against a real engine, is in test_broker.py.
"""

from __future__ import annotations

import ast
import base64
import json
import re
from dataclasses import asdict, replace
from typing import get_args

import pytest

from orchestrator.broker import ops, replies, wire
from orchestrator.broker.wire import BrokerError
from orchestrator.records.event_types import WorkspaceChanges
from orchestrator.sandbox.box import SandboxError, SandboxResult
from orchestrator.sandbox.change_set import Change
from orchestrator.sandbox.disks.workspace_reads import READS
from orchestrator.sandbox.wakes.undo_folders import Undone
from orchestrator.sandbox.wakes.wake_diff import PathDiff, Side, WakeDiff
from tests.helpers import REPO

EVERY_OP = [
    ops.Ping(),
    ops.Rate(),
    ops.Check("alpha"),
    ops.WindDown("alpha"),
    ops.Run("alpha", "ls -la"),
    ops.Run("alpha", "ls", max_output_chars=100),
    ops.Run("alpha", "curl https://api.example.com", grant_hosts=("api.example.com", "b.example.com:8443")),
    ops.Write("alpha", "notes/a.md", b"\x00\xffbytes"),
    ops.Edit("alpha", "str_replace_based_edit_tool", '{"command": "view", "path": "/workspace/a.md"}'),
    ops.Edit("alpha", "memory", '{"command": "rename", "old_path": "/memories/a", "new_path": "/memories/b"}'),
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
        ({"op": "edit", "agent": "alpha", "tool": "bash", "args": {}}, "tool must be"),
        ({"op": "edit", "agent": "alpha", "tool": "memory", "args": "view"}, "args must be a JSON object"),
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


# -- the replies: one type per op's answer, one way onto the wire and one way back ---------------

CHANGES = WorkspaceChanges(
    outcome="committed", of_run="0123456789ab", paths=("a.md", "d"), kinds=("added", "deleted"),
    types=("file", "dir"), sizes=(3, 0), refused=("deploy/x",), rules=("deploy/**",),
    refused_kinds=("added",), count=2, refused_count=1,
)  # fmt: skip
DIFF = WakeDiff(
    "0123456789ab",
    "committed",
    1765000000.5,
    (PathDiff(Change("a.md", "added", "file", 3), Side("none"), Side("file", 3, 0o644, "ab" * 32, None, "hi\n")),),
)
EVERY_REPLY = [
    SandboxResult(0, "out\n", 4, False, False, False, 12, "c0ffee", asked_hosts=("a.example.com",)),
    replies.Standing("/agents", "n1", 2.5, 10 * 2**30),
    replies.Standing("/agents", "", None, None),
    replies.EngineRate(3.5, 16, 4.6, 0.28),
    replies.Checked("alpha"),
    replies.WoundDown(),
    replies.Text("# core\n"),
    replies.MaybeText(None),
    replies.MaybeText("x"),
    replies.Names(("2026-12-01.md", "2026-12-02.md")),
    replies.Size(None),
    replies.Size(1234),
    replies.Begun(("finished the commit of wake 0123456789aa",), (replace(CHANGES, outcome="discarded"),)),
    replies.Begun((), ()),
    replies.Finished(CHANGES, ({"host": "api.example.com", "allowed": True},)),
    DIFF,
    replies.UndoAnswer(Undone("0123456789ab", 2, ("a.md", "d"), ("0123456789ac",))),
    replies.UndoAnswer(refused="a later wake changed a.md: undo that first, or --force"),
    replies.Streamed("ab" * 32, 10240, "cd" * 32, 7),
    replies.Ready(),
    replies.Dropped("0123456789abcdef"),
]


@pytest.mark.parametrize("reply", EVERY_REPLY, ids=lambda r: type(r).__name__)
def test_what_the_server_answers_the_client_reads_back_as_the_same_reply(reply):
    sent = json.loads(json.dumps(wire.ok(replies.to_json(reply))))  # as the transport writes it
    assert replies.from_json(type(reply), sent["result"]) == reply


@pytest.mark.parametrize(
    "kind, result, says",
    [
        (SandboxResult, {"exit_code": 0}, "result"),
        (replies.EngineRate, {"per_s": "fast"}, "rate"),
        (replies.Checked, {}, "check"),
        (replies.Text, {"value": 3}, "read"),
        (replies.Names, {"value": ["a", 3]}, "read"),
        (replies.Size, {"value": "12"}, "read"),
        (replies.Begun, {"lines": "x", "discarded": []}, "begin"),
        (replies.Begun, {"lines": [], "discarded": [{"count": "many"}]}, "change set"),
        (replies.Finished, {"changes": None, "egress": []}, "change set"),
        (WakeDiff, {"diff": {"run_id": "0123456789ab"}}, "diff"),
        (replies.UndoAnswer, {"undone": {"run_id": "0123456789ab"}}, "undo"),
        (replies.UndoAnswer, {}, "undo"),
        (replies.Streamed, {"sha256": "ab", "bytes": 1}, "stream summary"),
        (replies.Dropped, {"dropped": 7}, "drop"),
    ],
)
def test_a_reply_that_does_not_fit_its_type_is_one_sandbox_error(kind, result, says):
    with pytest.raises(SandboxError, match=f"^the sandbox broker sent a malformed {says}$"):
        replies.from_json(kind, result)


def test_a_pings_standing_is_not_trusted_to_be_sane_and_what_does_not_fit_is_unknown():
    """Another node's broker: a rate or room that is not a finite count is not believed, not an error."""
    sent = {"root": 7, "node": ["n1"], "rate": float("inf"), "room": True}
    assert replies.from_json(replies.Standing, sent) == replies.Standing("", "", None, None)


def test_a_finish_keeps_the_egress_decisions_that_are_objects_and_drops_the_rest():
    sent = {"changes": CHANGES.to_data(), "egress": [{"host": "a.org"}, "junk", 3]}
    assert replies.from_json(replies.Finished, sent).egress == ({"host": "a.org"},)
    assert replies.from_json(replies.Finished, {"changes": CHANGES.to_data()}).egress == ()


EVERY_REPLY_TYPE = {type(r) for r in EVERY_REPLY}


def test_every_reply_type_is_declared_in_replies_and_every_read_has_its_own():
    assert set(get_args(replies.Reply)) == EVERY_REPLY_TYPE
    assert set(replies.READ_REPLIES) == set(READS)


# -- docs/architecture.md §5 lists every op the broker serves, with its reply ---------------------

REPLIES_OF = {  # each op's reply types, as docs/architecture.md §5 names them
    "ping": ("Standing",),
    "rate": ("EngineRate",),
    "check": ("Checked",),
    "wind_down": ("WoundDown",),
    "run": ("SandboxResult",),
    "write": ("SandboxResult",),
    "edit": ("SandboxResult",),
    "append": ("SandboxResult",),
    "read": ("Text", "MaybeText", "Names", "Size"),
    "begin": ("Begun",),
    "finish": ("Finished",),
    "diff": ("WakeDiff",),
    "undo": ("UndoAnswer",),
    "export": ("Streamed",),
    "import": ("Ready", "Streamed"),
    "drop": ("Dropped",),
}


def _served_ops() -> set[str]:
    """The ops `Broker.serve` matches (its `case ops.X()` patterns), read from the source."""
    tree = ast.parse((REPO / "orchestrator/broker/server.py").read_text())
    serve = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "serve")
    matched = {
        n.cls.attr
        for n in ast.walk(serve)
        if isinstance(n, ast.MatchClass)
        and isinstance(n.cls, ast.Attribute)
        and isinstance(n.cls.value, ast.Name)
        and n.cls.value.id == "ops"
    }
    return {cls.op for cls in ops.OPS.values() if cls.__name__ in matched}


def _section_5_rows() -> dict[str, str]:
    """Each op's row of the table in docs/architecture.md §5, by the op it names first."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index("## 5. The broker's wire") : text.index("## 6.")]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", section, re.M)}


def test_the_broker_serves_every_op_the_wire_parses_and_each_answers_a_declared_reply():
    assert _served_ops() == set(ops.OPS) == set(REPLIES_OF)
    declared = {kind.__name__ for kind in EVERY_REPLY_TYPE}
    assert {name for names in REPLIES_OF.values() for name in names} == declared


def test_architecture_section_5_lists_every_op_the_broker_serves_with_its_reply():
    rows = _section_5_rows()
    missing = sorted(_served_ops() - set(rows))
    assert not missing, f"docs/architecture.md §5 has no row for op(s) the broker serves: {missing}"
    unnamed = [f"{op}: {name}" for op, names in REPLIES_OF.items() for name in names if f"`{name}`" not in rows[op]]
    assert not unnamed, f"docs/architecture.md §5 does not name these replies in their op's row: {unnamed}"
    assert not set(rows) - set(ops.OPS), f"§5 lists ops the broker does not serve: {sorted(set(rows) - set(ops.OPS))}"
