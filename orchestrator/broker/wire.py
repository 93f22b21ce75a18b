"""The broker's wire format: what both sides of the socket agree on, and nothing else.

Wire format: one JSON object per line, one request per connection.
  -> {"op": "run",   "agent": "demo", "command": "ls -la"}
  -> {"op": "write", "agent": "demo", "path": "notes/a.md", "content_b64": "..."}
  -> {"op": "append", "agent": "demo", "path": "memory/journal/2026-01-31.md", "content_b64": "..."}
  -> {"op": "check", "agent": "demo"}   # would X be served as its policy stands? (at wake start;
                                        # X's kept pool makes one container ahead again)
  -> {"op": "wind_down", "agent": "demo"}   # X's wake expects no more calls but its journal stub:
                                        # its pool makes none ahead (a hint; answers {})
  -> {"op": "read", "agent": "demo", "what": "read_text", "arg": "memory/core.md"}
                                        # files.Files, read by the broker: X's disk is mounted only there
  -> {"op": "rate"}                     # the engine's create-start-remove rate, for serve's K:
                                        # {"per_s", "calls", "seconds", "latency_s"}; at most every 10 min
  -> {"op": "ping"}
  <- {"ok": true, "result": {SandboxResult fields}}   # read: {"value": ...}
   | {"ok": false, "error": "one line", "refused": true|false}   # refused: the request or policy

The server (server.py) and the client (client.py) both import this module;
neither imports the other.

Not here: serving (server.py), the orchestrator's Sandbox (client.py).
"""

from __future__ import annotations

import base64
import json
import socket
import time

from orchestrator.errors import EXIT_USAGE, ConfigError
from orchestrator.sandbox.box import SandboxError

BROKER_ENV = "WAKELOOP_BROKER"      # the socket path; set, the orchestrator uses the broker
HOST_ROOT_ENV = "WAKELOOP_HOST_ROOT"  # where ROOT lives on the host, if not discoverable
MAX_REQUEST_BYTES = 32 * 2**20      # one request line; write content is capped by policy below
MAX_COMMAND_CHARS = 256 * 1024      # a shell string; the kernel's ARG_MAX is ~2 MB
CONNECT_WAIT_S = 30.0               # the client waits this long for a broker still starting
REPLY_MARGIN_S = 60.0               # on top of the call's own timeout: create, remove, a slow engine
APPEND_TIMEOUT_S = 30.0             # one journal append; as workspace.STUB_TIMEOUT_S
READ_TIMEOUT_S = 60.0               # one read: a first one attaches the agent's disk (mkfs, mount)
APPEND_MAX_BYTES = 160 * 1024       # the largest harness append is a closing note: loop.CLOSING_NOTE_CAP
                                    # (32K chars) at up to 4 UTF-8 bytes each, plus its heading


class BrokerError(ConfigError):
    """A request the broker refuses: one line, sent back to the client."""


class BrokerRefusal(SandboxError):
    """The client's side of a BrokerError: the box is usable, this request or policy is not.
    Still a SandboxError (a tool call gets it as text), but the CLI's exit is 2, not 3."""

    exit_code = EXIT_USAGE


def encode_content(content: bytes) -> str:
    return base64.b64encode(content).decode()


def decode_content(request: dict) -> bytes:
    try:
        return base64.b64decode(request.get("content_b64", ""), validate=True)
    except (ValueError, TypeError):
        raise BrokerError("content_b64 must be base64") from None


def request(socket_path: str, req: dict, timeout_s: float) -> dict:
    """One request, one reply; waits CONNECT_WAIT_S for a broker that is starting."""
    sock = _connect(socket_path)
    try:
        sock.settimeout(timeout_s)
        sock.sendall(json.dumps(req).encode() + b"\n")
        with sock.makefile("rb") as f:
            line = f.readline(MAX_REQUEST_BYTES)
    except socket.timeout:
        raise SandboxError(f"the sandbox broker at {socket_path} did not answer within {timeout_s:g}s") from None
    except OSError as exc:
        raise SandboxError(f"lost the sandbox broker at {socket_path}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    try:
        reply = json.loads(line)
    except ValueError:
        raise SandboxError(f"the sandbox broker at {socket_path} closed without an answer") from None
    if not reply.get("ok"):
        error = BrokerRefusal if reply.get("refused") else SandboxError
        raise error(f"the sandbox broker refused: {reply.get('error', 'no reason given')}")
    return reply["result"]


def _connect(socket_path: str) -> socket.socket:
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(socket_path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            if time.monotonic() >= deadline:
                raise SandboxError(f"no sandbox broker at {socket_path} ({exc.strerror}); start it "
                                   f"with `wakeloop broker ROOT --socket {socket_path}`") from None
            time.sleep(0.2)
        except OSError as exc:
            sock.close()
            raise SandboxError(f"cannot reach the sandbox broker at {socket_path}: {exc.strerror}") from None
