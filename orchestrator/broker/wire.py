"""The broker's wire: the line, the envelope and the frames, what both sides of the socket
agree on before any op.

One JSON object per line, one request per connection: the request line
(ops.py), then one reply line in one envelope:

  <- {"ok": true, "result": {...}}                                 # ok(): the op's reply (replies.py)
   | {"ok": false, "error": "one line", "refused": true|false}   # Refusal; refused: the request or policy

A frame is 4 bytes of length (big-endian) and that many bytes, at most
MAX_FRAME; one of length 0 ends the stream (export and import stream a
workspace in frames).

The server (server.py) and the client (client.py) both import this module;
neither imports the other. Two transports carry the same lines: a unix
socket on one host, and TCP with mutual TLS past it (tls.py), chosen by the
address: a path, or tls://HOST:PORT.

Not here: the requests (ops.py), the replies (replies.py), serving (server.py,
transport.py), the orchestrator's Sandbox (client.py).
"""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

from orchestrator.broker import tls
from orchestrator.errors import EXIT_USAGE, ConfigError
from orchestrator.sandbox.box import SandboxError

BROKER_ENV = "WAKELOOP_BROKER"  # the socket path, or tls://HOST:PORT; set, the orchestrator uses the broker
MAX_REQUEST_BYTES = 32 * 2**20  # one request line (and one reply line); write content is capped by policy
CONNECT_WAIT_S = 30.0  # the client waits this long for a broker still starting
REPLY_MARGIN_S = 60.0  # on top of the call's own timeout: create, remove, a slow engine
MAX_FRAME = 2**20  # one frame of a streamed workspace (export, import)
STREAM_IDLE_S = 120.0  # a stream with no frame for this long is cut off (a move's relay waits on both ends)
_FRAME = struct.Struct(">I")
JSONObject = dict[str, Any]  # one JSON object as json.loads gives it: a reply, a result


class BrokerError(ConfigError):
    """A request the broker refuses: one line, sent back to the client."""


class BrokerRefusal(SandboxError):
    """The client's side of a BrokerError: the box is usable, this request or policy is not.
    Still a SandboxError (a tool call gets it as text), but the CLI's exit is 2, not 3."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Refusal:
    """The one error reply. `refused`: the request or the agent's policy (the CLI exits 2);
    else the box failed (3)."""

    error: str
    refused: bool


# -- the envelope ---------------------------------------------------------------------------


def ok(result: JSONObject) -> JSONObject:
    """A reply's JSON (replies.to_json) in its envelope."""
    return {"ok": True, "result": result}


def refusal(refused: Refusal) -> JSONObject:
    return {"ok": False, **asdict(refused)}


def request(socket_path: str, line: bytes, timeout_s: float, connect_wait_s: float = CONNECT_WAIT_S) -> JSONObject:
    """One request line (ops.encode), one reply: its result, still JSON (replies.from_json types it);
    waits `connect_wait_s` for a broker that is starting."""
    sock = _connect(socket_path, connect_wait_s)
    try:
        sock.settimeout(timeout_s)
        sock.sendall(line)
        with sock.makefile("rb") as f:
            answer = f.readline(MAX_REQUEST_BYTES)
    except TimeoutError:
        raise SandboxError(f"the sandbox broker at {socket_path} did not answer within {timeout_s:g}s") from None
    except OSError as exc:
        raise SandboxError(f"lost the sandbox broker at {socket_path}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    return result_line(answer, socket_path)


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


def open_stream(address: str, line: bytes) -> tuple[socket.socket, BinaryIO]:
    """A connection for a streamed op (export, import), its request line sent: the socket and its
    reading side."""
    sock = _connect(address, CONNECT_WAIT_S)
    try:
        sock.settimeout(STREAM_IDLE_S)
        sock.sendall(line)
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
