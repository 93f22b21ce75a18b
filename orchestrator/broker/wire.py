"""The broker's wire format: what both sides of the socket agree on, and nothing else.

One JSON object per line, one request per connection. Each op is a frozen
dataclass below; `parse()` turns a line's object into one of them and owns
every check that needs no agent's policy (the server applies the policy's:
is bash on, may this path be written); `encode()` is the one way to the wire.

  -> {"op": "run",   "agent": "demo", "command": "ls -la", "max_output_chars": 2000}
                                        # + "grant_hosts": ["api.example.com"]: a call a person approved
                                        # runs with those hosts too, if X's policy and the ceiling allow
  -> {"op": "write", "agent": "demo", "path": "notes/a.md", "content_b64": "..."}
  -> {"op": "append", "agent": "demo", "path": "memory/journal/2026-01-31.md", "content_b64": "..."}
  -> {"op": "check", "agent": "demo"}   # would X be served as its policy stands? (at wake start;
                                        # X's kept pool makes one container ahead again)
  -> {"op": "wind_down", "agent": "demo"}   # X's wake expects no more calls but its journal stub:
                                        # its pool makes none ahead (a hint; answers {})
  -> {"op": "read", "agent": "demo", "what": "read_text", "arg": "memory/core.md"}
                                        # files.Files, read by the broker: X's disk is mounted only there
  -> {"op": "diff", "agent": "demo", "run_id": "0123456789ab"}   # one wake's diff (wake_diff.py),
                                        # read on X's disk; run_id null: the last to commit
  -> {"op": "undo", "agent": "demo", "run_id": "0123456789ab", "force": false}
                                        # put back what that wake changed (undo_folders.py);
                                        # answers {"undone": {...}} or {"refused": "one line"}
  -> {"op": "export", "agent": "demo"}   # X's disk's files/ as a tar stream (workspace_stream.py), in
                                        # frames, then the reply line: its sha256, bytes and digest
  -> {"op": "import", "agent": "demo"}   # <- a first reply {"ready": true}, then the client's frames
                                        # go into X's disk here (made, emptied), then the reply line
  -> {"op": "drop", "agent": "demo"}     # delete X's disk here: X must be placed on another node
                                        # (`wakeloop move`'s last step, once the new disk is in use)
  -> {"op": "rate"}                     # the engine's create-start-remove rate, for serve's K
                                        # (EngineRate); measured at most every 10 min
  -> {"op": "ping"}
  <- {"ok": true, "result": {SandboxResult fields}}   # read: {"value": ...}
   | {"ok": false, "error": "one line", "refused": true|false}   # Refusal; refused: the request or policy

A frame is 4 bytes of length (big-endian) and that many bytes, at most
MAX_FRAME; one of length 0 ends the stream.

Fields a request should not have are ignored, never obeyed. A run's
`max_output_chars` may only lower the policy's cap (the orchestrator's own
tool setting); the broker takes timeouts and caps from the policy it reads.

The server (server.py) and the client (client.py) both import this module;
neither imports the other. Two transports carry the same lines: a unix
socket on one host, and TCP with mutual TLS past it (tls.py), chosen by the
address: a path, or tls://HOST:PORT.

Not here: serving (server.py, transport.py), the orchestrator's Sandbox (client.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import ssl
import struct
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, BinaryIO, Iterator

from orchestrator.broker import tls
from orchestrator.errors import EXIT_USAGE, ConfigError
from orchestrator.sandbox import layers
from orchestrator.sandbox.box import SandboxError, SandboxResult
from orchestrator.sandbox.network import MAX_GRANT
from orchestrator.sandbox.workspace_reads import JOURNAL_DIR, READS

BROKER_ENV = "WAKELOOP_BROKER"  # the socket path, or tls://HOST:PORT; set, the orchestrator uses the broker
HOST_ROOT_ENV = "WAKELOOP_HOST_ROOT"  # where ROOT lives on the host, if not discoverable
MAX_REQUEST_BYTES = 32 * 2**20  # one request line; write content is capped by policy below
MAX_COMMAND_CHARS = 256 * 1024  # a shell string; the kernel's ARG_MAX is ~2 MB
CONNECT_WAIT_S = 30.0  # the client waits this long for a broker still starting
REPLY_MARGIN_S = 60.0  # on top of the call's own timeout: create, remove, a slow engine
APPEND_TIMEOUT_S = 30.0  # one journal append; as workspace.STUB_TIMEOUT_S
READ_TIMEOUT_S = 60.0  # one read: a first one attaches the agent's disk (mkfs, mount)
MAX_FRAME = 2**20  # one frame of a streamed workspace (export, import)
STREAM_IDLE_S = 120.0  # a stream with no frame for this long is cut off (a move's relay waits on both ends)
_FRAME = struct.Struct(">I")
APPEND_MAX_BYTES = 160 * 1024  # the largest harness append is a closing note: loop.CLOSING_NOTE_CAP
# (32K chars) at up to 4 UTF-8 bytes each, plus its heading
_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# The only path append may name (fullmatch; [0-9], not \d, which takes any Unicode digit).
_JOURNAL_PATH = re.compile(re.escape(JOURNAL_DIR) + r"/[0-9]{4}-[0-9]{2}-[0-9]{2}\.md")


class BrokerError(ConfigError):
    """A request the broker refuses: one line, sent back to the client."""


class BrokerRefusal(SandboxError):
    """The client's side of a BrokerError: the box is usable, this request or policy is not.
    Still a SandboxError (a tool call gets it as text), but the CLI's exit is 2, not 3."""

    exit_code = EXIT_USAGE


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
    Ping | Rate | Check | WindDown | Run | Write | Append | Read | Begin | Finish | Diff | Undo | Export | Import | Drop
)
JSONObject = dict[str, Any]  # one JSON object as json.loads gives it: a reply, a result
OPS: dict[str, type[Request]] = {
    cls.op: cls
    for cls in (Run, Write, Append, Check, Read, WindDown, Rate, Ping, Begin, Finish, Diff, Undo, Export, Import, Drop)
}


@dataclass(frozen=True)
class EngineRate:
    """The `rate` op's result: sandbox/rate.py's measurement of the broker's engine."""

    per_s: float
    calls: int
    seconds: float
    latency_s: float


@dataclass(frozen=True)
class Refusal:
    """The one error reply. `refused`: the request or the agent's policy (the CLI exits 2);
    else the box failed (3)."""

    error: str
    refused: bool


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
    if isinstance(request, Run) and request.max_output_chars is None:
        del body["max_output_chars"]
    if isinstance(request, Run):
        body["grant_hosts"] = list(request.grant_hosts)
        if not request.grant_hosts:
            del body["grant_hosts"]
    return json.dumps(body).encode() + b"\n"


def ok(result: JSONObject) -> JSONObject:
    return {"ok": True, "result": result}


def refusal(refused: Refusal) -> JSONObject:
    return {"ok": False, **asdict(refused)}


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


def result_of(reply: JSONObject) -> SandboxResult:
    try:
        result = SandboxResult(**reply)
        return replace(result, asked_hosts=tuple(map(str, result.asked_hosts)))
    except TypeError:
        raise SandboxError("the sandbox broker sent a malformed result") from None


def request(socket_path: str, req: Request, timeout_s: float, connect_wait_s: float = CONNECT_WAIT_S) -> JSONObject:
    """One request, one reply (its result); waits `connect_wait_s` for a broker that is starting."""
    sock = _connect(socket_path, connect_wait_s)
    try:
        sock.settimeout(timeout_s)
        sock.sendall(encode(req))
        with sock.makefile("rb") as f:
            line = f.readline(MAX_REQUEST_BYTES)
    except socket.timeout:
        raise SandboxError(f"the sandbox broker at {socket_path} did not answer within {timeout_s:g}s") from None
    except OSError as exc:
        raise SandboxError(f"lost the sandbox broker at {socket_path}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    return result_line(line, socket_path)


def result_line(line: bytes, address: str) -> JSONObject:
    """A reply line's result; a refusal or anything malformed as the SandboxError it is."""
    try:
        reply = json.loads(line)
    except ValueError:
        raise SandboxError(f"the sandbox broker at {address} closed without an answer") from None
    if not isinstance(reply, dict):
        raise SandboxError(f"the sandbox broker at {address} sent a malformed reply")
    if not reply.get("ok"):
        error = BrokerRefusal if reply.get("refused") else SandboxError
        raise error(f"the sandbox broker refused: {reply.get('error', 'no reason given')}")
    result = reply.get("result")
    if not isinstance(result, dict):
        raise SandboxError(f"the sandbox broker at {address} sent a malformed reply")
    return result


def open_stream(address: str, req: Export | Import) -> tuple[socket.socket, BinaryIO]:
    """A connection for a streamed op, its request sent: the socket and its reading side."""
    sock = _connect(address, CONNECT_WAIT_S)
    try:
        sock.settimeout(STREAM_IDLE_S)
        sock.sendall(encode(req))
        return sock, sock.makefile("rb")
    except OSError as exc:
        sock.close()
        raise SandboxError(f"lost the sandbox broker at {address}: {exc.strerror or exc}") from None


# -- frames: a workspace streamed (export, import) -------------------------------------------


def send_frame(sock: socket.socket, data: bytes) -> None:
    """One frame; b"" ends the stream."""
    sock.sendall(_FRAME.pack(len(data)) + data)


def frames(f: BinaryIO) -> Iterator[bytes]:
    """Each frame's bytes until the one that ends the stream; StreamBroken if it breaks off first."""
    while True:
        head = f.read(_FRAME.size)
        if len(head) < _FRAME.size:
            raise StreamBroken("the stream ended before its last frame")
        (size,) = _FRAME.unpack(head)
        if size > MAX_FRAME:
            raise StreamBroken(f"a frame of {size:,} bytes; at most {MAX_FRAME:,}")
        if not size:
            return
        data = f.read(size)
        if len(data) < size:
            raise StreamBroken("the stream ended inside a frame")
        yield data


class StreamBroken(BrokerError):
    """A stream of frames that broke off or broke the format: one line."""


class FrameWriter:
    """A file object that sends what is written in frames of MAX_FRAME (tarfile writes 10 KiB
    records); counted and hashed as sent."""

    def __init__(self, sock: socket.socket):
        self.sock, self.pending = sock, bytearray()
        self.sha, self.bytes = hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.pending += data
        while len(self.pending) >= MAX_FRAME:
            self._send(bytes(self.pending[:MAX_FRAME]))
            del self.pending[:MAX_FRAME]
        return len(data)

    def end(self) -> None:
        """The rest, then the frame that ends the stream."""
        if self.pending:
            self._send(bytes(self.pending))
            self.pending.clear()
        send_frame(self.sock, b"")

    def _send(self, data: bytes) -> None:
        self.sha.update(data)
        self.bytes += len(data)
        send_frame(self.sock, data)


class FrameReader:
    """A file object that reads the frames of `f` as one stream, at most `limit` bytes in all
    (StreamBroken past it); counted and hashed as read. `rest()` reads to the end frame."""

    def __init__(self, f: BinaryIO, limit: int):
        self.frames, self.limit = frames(f), limit
        self.pending, self.done = b"", False
        self.sha, self.bytes = hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        while not self.done and (n < 0 or len(self.pending) < n):
            data = next(self.frames, None)
            if data is None:
                self.done = True
                break
            self.bytes += len(data)
            if self.bytes > self.limit:
                raise StreamBroken(f"a stream over {self.limit:,} bytes")
            self.sha.update(data)
            self.pending += data
        n = len(self.pending) if n < 0 else n
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def rest(self) -> None:
        while not self.done:
            self.read(MAX_FRAME)
            self.pending = b""


def _connect(address: str, wait_s: float = CONNECT_WAIT_S) -> socket.socket:
    """A unix socket's path, or tls://HOST:PORT (tls.py); waits for a broker that is starting."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if address.startswith(tls.SCHEME):
                return tls.connect(address, min(wait_s, tls.CONNECT_TIMEOUT_S))
            return _unix(address)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if time.monotonic() >= deadline:
                how = "--listen" if address.startswith(tls.SCHEME) else "--socket"
                raise SandboxError(
                    f"no sandbox broker at {address} ({exc.strerror}); start it "
                    f"with `wakeloop broker ROOT {how} {address}`"
                ) from None
            time.sleep(0.2)
        except tls.TLSConfigError as exc:  # our own certificates: one line, a refusal (exit 2), not a bug
            raise BrokerRefusal(str(exc)) from None
        except ssl.SSLError as exc:  # a broker this stack's CA did not sign, or one that refused us
            raise SandboxError(
                f"the sandbox broker at {address} failed the TLS handshake: {exc.reason or exc}"
            ) from None
        except OSError as exc:
            raise SandboxError(f"cannot reach the sandbox broker at {address}: {exc.strerror or exc}") from None


def _unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock
