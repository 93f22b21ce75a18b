"""An agent's disk moved from its node to another: streamed broker to broker, checked by hash,
the old copy removed only after the new one is in use (`wakeloop move`, past one host).

The orchestrator relays: it opens `import` on the new node's broker (which makes the agent's
disk there, or takes the one it has, and empties its files/), then `export` on the old node's,
and passes each frame from one to the other as it comes (wire.py), hashing what passes. Both
brokers already trust the orchestrator's certificate and no other, so no broker needs to prove
itself to another, and a node never connects to a node. The relay holds one frame at a time.

Checked, or nothing changes: the sha256 and byte count of the stream as the old broker sent
it, as the relay passed it and as the new broker read it; and the digest of the workspace tree
(workspace_stream.py) as the old broker packed it and as the new one reads it back from its
disk. Only then is the agent placed on the new node (its state), the new disk put in use
(`check`, and a `read` of its journal from it), and then the old disk dropped. A move that fails
before the placement leaves the agent where it was, and the new node's copy is dropped.

What moves is the agent's files (its disk's files/, as its last wake committed them). The undo
history of its earlier wakes (.wakeloop/) stays with the old disk and goes with it: `wakeloop
undo` of a wake before the move is refused on the new node as a wake it does not know.

Not here: placement and discovery (nodes.py), the stream's format and its checks on arrival
(sandbox/disks/workspace_stream.py), what each broker does (server.py `export`, `import_`, `drop`;
the disk's side: sandbox/keeper.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from orchestrator.broker import ops, replies, wire
from orchestrator.records import placement
from orchestrator.sandbox.box import SandboxError

PROGRESS_EVERY = 64 * 2**20  # a line per this many bytes relayed
REPLY_TIMEOUT_S = 60.0  # check, read, drop: a disk attached or released on the way
R = TypeVar("R")


@dataclass(frozen=True)
class Moved:
    """What arrived and what became of the old copy."""

    bytes: int
    entries: int
    digest: str
    problem: str = ""  # why the old copy stays, if it does ("": deleted)


def move(agent_dir: Path, source: str, dest: str, to: str, say: Callable[[str], None]) -> Moved:
    """Move the agent's disk from the broker at `source` to the one at `dest` (node `to`) and place
    it there. The caller holds the agent's wake lock: no wake of it runs meanwhile."""
    name = agent_dir.name
    try:
        arrived = relay(source, dest, name, say)
    except SandboxError:
        _try(dest, ops.Drop(name), replies.Dropped)  # the agent still lives on `source`: a copy half made goes
        raise
    placement.write_node(agent_dir / "state", to)
    # The new disk in use (attached, read from), and only then the old one dropped.
    unused = _try(dest, ops.Check(name), replies.Checked) or _try(
        dest, ops.Read(name, "journal_names", None), replies.Names
    )
    if unused:
        problem = f"its new disk on {to} did not answer in use ({unused}), so the old one is kept"
    else:
        problem = _try(source, ops.Drop(name), replies.Dropped)
    return Moved(arrived.bytes, arrived.entries, arrived.digest, problem)


def relay(source: str, dest: str, name: str, say: Callable[[str], None]) -> replies.Streamed:
    """Stream `name`'s workspace from `source`'s broker into `dest`'s; the import's result once
    every hash agrees, else SandboxError saying which did not."""
    sha, passed = hashlib.sha256(), 0
    into, into_reply = wire.open_stream(dest, ops.encode(ops.Import(name)))
    try:
        _reply(replies.Ready, into_reply, dest)  # ready, or its refusal
        out, out_reply = wire.open_stream(source, ops.encode(ops.Export(name)))
        try:
            for data in wire.frames(out_reply):
                sha.update(data)
                passed += len(data)
                wire.send_frame(into, data)
                if passed // PROGRESS_EVERY != (passed - len(data)) // PROGRESS_EVERY:
                    say(f"{name}: {passed / 2**20:,.0f} MiB streamed")
            sent = _reply(replies.Streamed, out_reply, source)
        finally:
            out.close()
        wire.send_frame(into, b"")
        got = _reply(replies.Streamed, into_reply, dest)
    except wire.StreamBroken as exc:
        raise SandboxError(f"{name}: the stream from {source} broke: {exc}") from None
    except (TimeoutError, OSError) as exc:
        raise SandboxError(f"{name}: the move broke off: {getattr(exc, 'strerror', None) or exc}") from None
    finally:
        into.close()
    _agree(name, sha.hexdigest(), passed, sent, got)
    return got


def _reply(kind: type[R], f: BinaryIO, address: str) -> R:
    """A streamed op's reply line, as its type; its refusal or anything malformed a SandboxError."""
    return replies.from_json(kind, wire.result_line(f.readline(wire.MAX_REQUEST_BYTES), address))


def _agree(name: str, sha: str, passed: int, sent: replies.Streamed, got: replies.Streamed) -> None:
    """The stream as sent, relayed and read; the tree as packed and as read back from the new disk."""
    stream = {"sent": (sent.sha256, sent.bytes), "received": (got.sha256, got.bytes)}
    for end, seen in stream.items():
        if seen != (sha, passed):
            raise SandboxError(f"{name}: the stream {end} ({seen[1]} bytes) is not the one relayed ({passed} bytes)")
    if (sent.digest, sent.entries) != (got.digest, got.entries):
        raise SandboxError(
            f"{name}: the new disk holds {got.entries} entries (digest {got.digest[:12]}), "
            f"not the {sent.entries} sent ({sent.digest[:12]})"
        )


def _try(address: str, req: ops.Request, kind: type) -> str:
    """The request's refusal or failure as one line; "" if it was done."""
    try:
        ops.ask(address, req, kind, REPLY_TIMEOUT_S)
    except SandboxError as exc:
        return str(exc)
    return ""
