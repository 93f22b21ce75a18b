"""The broker's requests: one frozen dataclass per op, one parse, one encoder.

Each op is a frozen dataclass below; `parse()` turns a request line's object
into one of them and owns every check that needs no agent's policy (the
server applies the policy's: is bash on, may this path be written);
`encode()` is the one way onto the wire. What each op answers is replies.py.

  -> {"op": "run",   "agent": "demo", "command": "ls -la", "max_output_chars": 2000}
                                        # + "grant_hosts": ["api.example.com"]: a call a person approved
                                        # runs with those hosts too, if X's policy and the ceiling allow
  -> {"op": "write", "agent": "demo", "path": "notes/a.md", "content_b64": "..."}
  -> {"op": "edit",  "agent": "demo", "tool": "str_replace_based_edit_tool", "args": {"command": "view", ...}}
                                        # Claude's text editor or memory tool (edit_op.py); tool "memory" too
  -> {"op": "append", "agent": "demo", "path": "memory/journal/2026-01-31.md", "content_b64": "..."}
  -> {"op": "check", "agent": "demo"}   # would X be served as its policy stands? (at wake start;
                                        # X's kept pool makes one container ahead again)
  -> {"op": "wind_down", "agent": "demo"}   # X's wake expects no more calls but its journal stub:
                                        # its pool makes none ahead (a hint; answers {})
  -> {"op": "read", "agent": "demo", "what": "read_text", "arg": "memory/core.md"}
                                        # files.Files, read by the broker: X's disk is mounted only there
  -> {"op": "begin", "agent": "demo", "run_id": "0123456789ab"}   # a wake starts (wake_layer.py)
  -> {"op": "finish", "agent": "demo", "run_id": "0123456789ab"}  # and ends: committed or dropped
  -> {"op": "diff", "agent": "demo", "run_id": "0123456789ab"}   # one wake's diff (wake_diff.py),
                                        # read on X's disk; run_id null: the last to commit
  -> {"op": "undo", "agent": "demo", "run_id": "0123456789ab", "force": false}
                                        # put back what that wake changed (undo_folders.py)
  -> {"op": "export", "agent": "demo"}   # X's disk's files/ as a tar stream (workspace_stream.py), in
                                        # frames (wire.py), then the reply line
  -> {"op": "import", "agent": "demo"}   # a first reply (ready), then the client's frames
                                        # go into X's disk here (made, emptied), then the reply line
  -> {"op": "drop", "agent": "demo"}     # delete X's disk here: X must be placed on another node
                                        # (`wakeloop move`'s last step, once the new disk is in use)
  -> {"op": "rate"}                     # the engine's create-start-remove rate, for serve's K
                                        # (EngineRate); measured at most every 10 min
  -> {"op": "ping"}

Fields a request should not have are ignored, never obeyed. A run's
`max_output_chars` may only lower the policy's cap (the orchestrator's own
tool setting); the broker takes timeouts and caps from the policy it reads.

Not here: the replies (replies.py), the line, the envelope and the frames
(wire.py), serving (server.py), the orchestrator's side (client.py).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, fields
from typing import TypeVar

from orchestrator.broker import replies, wire
from orchestrator.broker.wire import BrokerError
from orchestrator.policy.editor_paths import EDITOR, MEMORY
from orchestrator.sandbox.disks import layers
from orchestrator.sandbox.disks.workspace_reads import JOURNAL_DIR, READS
from orchestrator.sandbox.egress.egress_plan import MAX_GRANT

MAX_COMMAND_CHARS = 256 * 1024  # a shell string; the kernel's ARG_MAX is ~2 MB
MAX_EDIT_CHARS = (
    24 * 1024 * 1024
)  # an edit's arguments: a create's file_text, max_bytes at most (the line's cap is 32 MiB)
APPEND_TIMEOUT_S = 30.0  # one journal append; as workspace.STUB_TIMEOUT_S
READ_TIMEOUT_S = 60.0  # one read: a first one attaches the agent's disk (mkfs, mount)
APPEND_MAX_BYTES = 160 * 1024  # the largest harness append is a closing note: journal_stub.CLOSING_NOTE_CAP
# (32K chars) at up to 4 UTF-8 bytes each, plus its heading
R = TypeVar("R")
_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# The only path append may name (fullmatch; [0-9], not \d, which takes any Unicode digit).
_JOURNAL_PATH = re.compile(re.escape(JOURNAL_DIR) + r"/[0-9]{4}-[0-9]{2}-[0-9]{2}\.md")


# -- the ops ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ping:
    op = "ping"


@dataclass(frozen=True)
class Rate:
    op = "rate"


@dataclass(frozen=True)
class Check:
    agent: str
    op = "check"


@dataclass(frozen=True)
class WindDown:
    agent: str
    op = "wind_down"


@dataclass(frozen=True)
class Run:
    agent: str
    command: str
    max_output_chars: int | None = None  # None: the policy's cap; else the smaller of the two
    grant_hosts: tuple[str, ...] = ()  # an approved call's hosts (approve.rules network_host)
    op = "run"


@dataclass(frozen=True)
class Write:
    agent: str
    path: str
    content: bytes
    op = "write"


@dataclass(frozen=True)
class Edit:
    """One call of Claude's text editor or memory tool: the model's arguments as it sent them
    (the broker checks them against its own copy of the policy: broker/edit_op.py)."""

    agent: str
    tool: str  # editor_paths.EDITOR or MEMORY
    args_json: str  # the tool_use input, a JSON object, at most MAX_EDIT_CHARS
    op = "edit"


@dataclass(frozen=True)
class Append:
    agent: str
    path: str  # memory/journal/YYYY-MM-DD.md, nothing else
    content: bytes  # at most APPEND_MAX_BYTES
    op = "append"


@dataclass(frozen=True)
class Read:
    agent: str
    what: str  # one of files.READS
    arg: str | None  # None only for journal_names
    op = "read"


@dataclass(frozen=True)
class Begin:
    """A wake starts: what earlier wakes left is settled, then its overlay is mounted (wake_layer.py)."""

    agent: str
    run_id: str  # 12 hex digits (layers.RUN_ID)
    op = "begin"


@dataclass(frozen=True)
class Finish:
    """The wake ends: its changes checked against the broker's copy of the policy, committed or dropped."""

    agent: str
    run_id: str  # the wake begun; another is refused
    op = "finish"


@dataclass(frozen=True)
class Diff:
    agent: str
    run_id: str | None  # 12 hex digits (layers.RUN_ID); None: the wake that committed last
    op = "diff"


@dataclass(frozen=True)
class Undo:
    agent: str
    run_id: str  # 12 hex digits (layers.RUN_ID)
    force: bool = False  # over later wakes that changed the same paths
    op = "undo"


@dataclass(frozen=True)
class Export:
    """X's workspace (its disk's files/) streamed to the client: `wakeloop move`'s first half."""

    agent: str
    op = "export"


@dataclass(frozen=True)
class Import:
    """X's workspace streamed from the client into X's disk here: `wakeloop move`'s second half."""

    agent: str
    op = "import"


@dataclass(frozen=True)
class Drop:
    """X's disk here deleted: X is placed on another node, where its new disk is in use."""

    agent: str
    op = "drop"


Request = (
    Ping
    | Rate
    | Check
    | WindDown
    | Run
    | Write
    | Edit
    | Append
    | Read
    | Begin
    | Finish
    | Diff
    | Undo
    | Export
    | Import
    | Drop
)
OPS: dict[str, type[Request]] = {
    cls.op: cls
    for cls in (
        Run,
        Write,
        Edit,
        Append,
        Check,
        Read,
        WindDown,
        Rate,
        Ping,
        Begin,
        Finish,
        Diff,
        Undo,
        Export,
        Import,
        Drop,
    )
}


# -- one parse, one encoder --------------------------------------------------------------


def parse(obj: object) -> Request:
    """A request line's JSON value as its op, or BrokerError with the one line why."""
    if not isinstance(obj, dict):
        raise BrokerError("a request is one JSON object")
    op = obj.get("op")
    cls = OPS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise BrokerError(f"unknown op {op!r:.80}; the broker offers only {', '.join(OPS)}")
    if cls is Ping:
        return Ping()
    if cls is Rate:
        return Rate()
    agent = agent_name(obj.get("agent"))
    if cls is Run:
        return Run(
            agent, _command(obj.get("command")), _cap(obj.get("max_output_chars")), _hosts(obj.get("grant_hosts", []))
        )
    if cls is Edit:
        return Edit(agent, _edit_tool(obj.get("tool")), _edit_args(obj.get("args")))
    if cls in (Write, Append):
        path, content = obj.get("path"), _content(obj.get("content_b64", ""))
        if cls is Append:
            return Append(agent, _journal_path(agent, path), _append_content(agent, content))
        if not isinstance(path, str):
            raise BrokerError("path must be a string")
        return Write(agent, path, content)
    if cls is Read:
        return _read(agent, obj.get("what"), obj.get("arg"))
    if cls in (Begin, Finish):
        run_id = _run_id(obj.get("run_id"))
        return Begin(agent, run_id) if cls is Begin else Finish(agent, run_id)
    if cls is Diff:
        given = obj.get("run_id")
        return Diff(agent, None if given is None else _run_id(given))
    if cls is Undo:
        force = obj.get("force", False)
        if not isinstance(force, bool):
            raise BrokerError("force must be true or false")
        return Undo(agent, _run_id(obj.get("run_id")), force)
    return cls(agent)  # type: ignore[call-arg]  # Check, WindDown, Export, Import, Drop: the agent alone


def encode(request: Request) -> bytes:
    """The request as its line on the wire."""
    body = {"op": request.op, **{f.name: getattr(request, f.name) for f in fields(request)}}
    if isinstance(request, (Write, Append)):
        body["content_b64"] = base64.b64encode(body.pop("content")).decode()
    if isinstance(request, Edit):
        body["args"] = json.loads(body.pop("args_json"))
    if isinstance(request, Run) and request.max_output_chars is None:
        del body["max_output_chars"]
    if isinstance(request, Run):
        body["grant_hosts"] = list(request.grant_hosts)
        if not request.grant_hosts:
            del body["grant_hosts"]
    return json.dumps(body).encode() + b"\n"


def ask(address: str, req: Request, kind: type[R], timeout_s: float, connect_wait_s: float = wire.CONNECT_WAIT_S) -> R:
    """One request to the broker at `address`, its reply as `kind` (replies.py); SandboxError (a
    refusal: BrokerRefusal) if it is refused, lost, late or malformed."""
    return replies.from_json(kind, wire.request(address, encode(req), timeout_s, connect_wait_s))


def agent_name(name: object) -> str:
    if not isinstance(name, str) or not _AGENT_NAME.match(name):
        raise BrokerError(f"agent must be the name of a folder under the agents root, got {name!r:.80}")
    return name


def _command(command: object) -> str:
    if not isinstance(command, str) or not command.strip():
        raise BrokerError("command must be a non-empty string")
    if len(command) > MAX_COMMAND_CHARS:
        raise BrokerError(f"command is {len(command):,} characters; at most {MAX_COMMAND_CHARS:,}")
    return command


def _cap(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BrokerError(f"max_output_chars must be a positive whole number, got {value!r:.40}")
    return value


def _hosts(value: object) -> tuple[str, ...]:
    """Their shape only: which hosts this agent may be granted is the server's (its policy, its ceiling)."""
    if not isinstance(value, list) or len(value) > MAX_GRANT or not all(isinstance(h, str) for h in value):
        raise BrokerError(f"grant_hosts must be a list of at most {MAX_GRANT} host names")
    return tuple(value)


def _edit_tool(tool: object) -> str:
    if tool not in (EDITOR, MEMORY):
        raise BrokerError(f"tool must be {EDITOR} or {MEMORY}, got {tool!r:.60}")
    return str(tool)


def _edit_args(args: object) -> str:
    """The tool_use input as one JSON object's text; what it asks is the server's to judge (edit_op.py)."""
    if not isinstance(args, dict):
        raise BrokerError("args must be a JSON object (the tool_use input)")
    text = json.dumps(args)
    if len(text) > MAX_EDIT_CHARS:
        raise BrokerError(f"args is {len(text):,} characters; at most {MAX_EDIT_CHARS:,}")
    return text


def _content(value: object) -> bytes:
    try:
        if not isinstance(value, str):
            raise TypeError(value)
        return base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        raise BrokerError("content_b64 must be base64") from None


def _journal_path(agent: str, path: object) -> str:
    """Append is allowed whatever the tools policy says, so it must not become a
    general write: one path shape (a symlinked journal is refused in the box)."""
    if not isinstance(path, str) or not _JOURNAL_PATH.fullmatch(path):
        raise BrokerError(f"{agent}: append is only for {JOURNAL_DIR}/YYYY-MM-DD.md, not {path!r:.80}")
    return path


def _append_content(agent: str, content: bytes) -> bytes:
    if len(content) > APPEND_MAX_BYTES:
        raise BrokerError(f"{agent}: an append is at most {APPEND_MAX_BYTES:,} bytes, got {len(content):,}")
    return content


def _read(agent: str, what: object, arg: object) -> Read:
    if not isinstance(what, str) or what not in READS:
        raise BrokerError(f"read is one of {', '.join(READS)}, not {what!r:.40}")
    if what == "journal_names":
        return Read(agent, what, None)
    if not isinstance(arg, str):
        raise BrokerError(f"read {what} needs a string arg")
    return Read(agent, what, arg)


def _run_id(run_id: object) -> str:
    """A run id the harness makes, or BrokerError: no id from the wire walks out of .wakeloop/."""
    if not isinstance(run_id, str) or not layers.RUN_ID.fullmatch(run_id):
        raise BrokerError(f"run_id must be 12 hex digits, got {run_id!r:.40}")
    return run_id
