"""Past one host: every node's broker found by DNS, each agent placed on one node and kept there.

With WAKELOOP_BROKER=tls://NAME:PORT, NAME may resolve to several addresses:
a swarm's `tasks.broker` (compose.yaml under `docker stack deploy`: a global service, dnsrr) names
one task per node. Each address's broker is asked its node (ping's `node`,
the broker's $WAKELOOP_NODE); a broker that names none is one broker on one
host, and the address is used as given. An agent first woken is placed on
the answering node whose disks can still promise its disk (ping's `room`)
with the fewest agents placed for its engine's measured rate (ping's `rate`:
a node twice as fast takes twice the agents; one not yet measured counts as
the others' mean), recorded in its state (records/placement.py), and every
call of it goes to that node's broker at whatever address its task has now
(a task restarted gets a new one). Its node not answering: NodeUnavailable, which a
wake turns into a skipped wake (status skipped_node, wake/loop.py) until
the node returns. Discovery is kept DISCOVER_KEEP_S, so a fleet's wakes in
one tick ask once.

`wakeloop move` places an agent on another live node by hand (`move`): with
`sandbox.disk: none` its workspace is a folder of the shared ROOT, so nothing
is copied, and it can leave a lost node. An agent with a disk of its own has
it on its node (the node's broker attaches it: plain_container.py); its disk
is streamed to the new node and checked there (disk_move.py), so both nodes
must answer.

Not here: the wire (wire.py, tls.py).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from orchestrator.broker import disk_move, ops, replies, tls
from orchestrator.records import placement
from orchestrator.sandbox.box import SandboxError

NODE_ENV = "WAKELOOP_NODE"  # the broker's node (a swarm template: {{.Node.Hostname}})
DISCOVER_KEEP_S = 5.0
PING_TIMEOUT_S = 3.0  # a node that is down answers nothing: its ping must not hold a wake long
NODE_CONNECT_WAIT_S = 5.0  # a node's broker refusing connections: its engine stopped, or its task restarting


class NodeUnavailable(SandboxError):
    """The agent's node (or, for an agent not yet placed, every node) does not answer: one line."""


@dataclass(frozen=True)
class Node:
    name: str  # "" from a broker that names no node: one host
    address: str  # tls://IP:PORT of its broker now
    rate: float | None = None  # containers/s its engine makes, as its broker last measured; None: not yet
    room: int | None = None  # bytes of disk it may still promise; None: it keeps no disks


def this_node() -> str:
    """The broker's own node, for its ping ("" outside a swarm)."""
    return os.environ.get(NODE_ENV, "").strip()


_lock = threading.Lock()  # one placement at a time: two agents never both take the same "fewest"
_seen: dict[str, tuple[float, tuple[Node, ...]]] = {}


def discover(address: str) -> tuple[Node, ...]:
    """The brokers answering behind `address` now (kept DISCOVER_KEEP_S), by name."""
    with _lock:
        kept = _seen.get(address)
        if kept and time.monotonic() - kept[0] < DISCOVER_KEEP_S:
            return kept[1]
    host, port = tls.host_port(address)
    try:
        ips = sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
    except OSError:
        ips = []
    targets = [f"{tls.SCHEME}[{ip}]:{port}" if ":" in ip else f"{tls.SCHEME}{ip}:{port}" for ip in ips]
    with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
        answers = list(pool.map(_ask_node, targets))
    nodes = tuple(sorted((n for n in answers if n is not None), key=lambda n: n.name))
    with _lock:
        _seen[address] = (time.monotonic(), nodes)
    return nodes


def _ask_node(target: str) -> Node | None:
    try:
        standing = ops.ask(target, ops.Ping(), replies.Standing, PING_TIMEOUT_S, connect_wait_s=PING_TIMEOUT_S)
    except SandboxError:
        return None
    return Node(standing.node, target, standing.rate or None, standing.room)


def brokers(address: str) -> tuple[str, ...]:
    """Every broker behind `address`: each node's on a swarm, else `address` itself."""
    if not address.startswith(tls.SCHEME):
        return (address,)
    named = tuple(n.address for n in discover(address) if n.name)
    return named or (address,)


def address_for(agent_dir: Path, address: str, disk_bytes: int = 0) -> str:
    """The broker address for the agent in `agent_dir`: its node's, placing it first if it has
    none (on a node with room for `disk_bytes`, its sandbox.disk). A unix socket, or brokers that
    name no node: `address` itself. NodeUnavailable otherwise."""
    if not address.startswith(tls.SCHEME):
        return address
    nodes = discover(address)
    if nodes and not any(n.name for n in nodes):
        return address  # one broker, no swarm
    state_dir = agent_dir / "state"
    with _lock:
        node = placement.read_node(state_dir)
        if node is None:
            node = _place(agent_dir, state_dir, nodes, address, disk_bytes)
    for n in nodes:
        if n.name == node:
            return n.address
    raise NodeUnavailable(f"its node {node} does not answer (no broker of {address} on it): skipped until it returns")


def check_node(agent_dir: Path, address: str, disk_bytes: int = 0) -> None:
    """At a wake's start: the agent's node answers now (a fresh ping, not the kept discovery,
    which may be DISCOVER_KEEP_S old), placing the agent first if it has none; else NodeUnavailable."""
    target = address_for(agent_dir, address, disk_bytes)
    if target == address:
        return
    try:
        ops.ask(target, ops.Ping(), replies.Standing, PING_TIMEOUT_S, connect_wait_s=PING_TIMEOUT_S)
    except SandboxError:
        with _lock:
            _seen.pop(address, None)
        address_for(agent_dir, address, disk_bytes)  # found again (its task restarted elsewhere) or NodeUnavailable


def _place(agent_dir: Path, state_dir: Path, nodes: tuple[Node, ...], address: str, disk_bytes: int) -> str:
    named = [n for n in nodes if n.name]
    if not named:
        raise NodeUnavailable(f"no broker answers at {address}: not placed yet, skipped until one does")
    chosen = choose(named, placement.placed(agent_dir.parent), disk_bytes)
    if chosen is None:
        rooms = ", ".join(f"{n.name} {n.room:,}" for n in named if n.room is not None)
        raise NodeUnavailable(
            f"no node of {address} can promise its sandbox.disk of {disk_bytes:,} bytes (room: {rooms}): "
            "not placed yet, skipped until one can"
        )
    state_dir.mkdir(mode=0o700, exist_ok=True)
    placement.write_node(state_dir, chosen.name)
    return chosen.name


def choose(named: list[Node], counts: dict[str, int], disk_bytes: int) -> Node | None:
    """The node for one more agent: of those with room for its disk, the one with the fewest
    agents per container/s once it has this one (then the most room, then the name)."""
    fits = [n for n in named if n.room is None or n.room >= disk_bytes]
    rates = [n.rate for n in named if n.rate]
    usual = sum(rates) / len(rates) if rates else 1.0  # not measured yet: as the others
    return min(
        fits,
        key=lambda n: ((counts.get(n.name, 0) + 1) / (n.rate or usual), -(n.room or 0), n.name),
        default=None,
    )


def answering(address: str) -> dict[str, Node]:
    """The brokers behind `address` that name their node, by name, as they answer now (not the
    kept discovery): for a command a person runs, once."""
    with _lock:
        _seen.pop(address, None)
    return {n.name: n for n in discover(address) if n.name}


def pick(found: dict[str, Node], name: str, address: str) -> Node:
    """Node `name` of `found` (answering's), else NodeUnavailable naming those that answer."""
    if name not in found:
        raise NodeUnavailable(f"no broker of node {name!r} answers at {address} (nodes: {', '.join(found) or 'none'})")
    return found[name]


def move(agent_dir: Path, address: str, to: str, disk_bytes: int, say: Callable[[str], None] = print) -> str | None:
    """Place the agent on node `to`, which must answer now; the caller holds its wake lock, so no
    wake of it runs meanwhile, and its next wake's calls go there. An agent with a disk placed on
    another node takes it along (disk_move.py): both nodes must answer. Returns the node it leaves."""
    found = answering(address)
    dest = pick(found, to, address)
    state_dir = agent_dir / "state"
    left = placement.read_node(state_dir)
    if disk_bytes and left not in (None, to):  # never placed: it has no disk on any node yet
        if left not in found:
            raise NodeUnavailable(
                f"its disk is on node {left}, which does not answer: a disk moves only between two live "
                f"nodes (nodes: {', '.join(found) or 'none'}); it wakes again when {left} returns"
            )
        moved = disk_move.move(agent_dir, found[left].address, dest.address, to, say)
        say(
            f"{agent_dir.name}: its disk moved from {left} to {to}: {moved.entries} entries, "
            f"{moved.bytes:,} bytes streamed, sha256 and tree digest {moved.digest[:12]} agreed at both ends"
        )
        say(
            f"{agent_dir.name}: deleted its old disk on {left}"
            if not moved.problem
            else f"{agent_dir.name}: its old disk stays on {left}: {moved.problem}"
        )
        return left
    with _lock:
        placement.write_node(state_dir, to)
    if left in found and left != to:  # its old node's pool makes nothing more for it (a hint)
        try:
            ops.ask(
                found[left].address, ops.WindDown(agent_dir.name), replies.WoundDown, PING_TIMEOUT_S, PING_TIMEOUT_S
            )
        except SandboxError:
            pass
    return left
