"""Past one host: every node's broker found by DNS, each agent placed on one node and kept there.

With WAKELOOP_BROKER=tls://NAME:PORT, NAME may resolve to several addresses:
a swarm's `tasks.broker` (compose.swarm.yaml: a global service, dnsrr) names
one task per node. Each address's broker is asked its node (ping's `node`,
the broker's $WAKELOOP_NODE); a broker that names none is one broker on one
host, and the address is used as given. An agent first woken is placed on
the answering node with the fewest agents placed (room by count: every node
here has the same engine; the measured rate and the disks' room are not yet
weighed), recorded in its state (records/placement.py), and every call of it
goes to that node's broker at whatever address its task has now (a task
restarted gets a new one). Its node not answering: NodeUnavailable, which a
wake turns into a skipped wake (status skipped_node, wake/loop.py) until
the node returns. Discovery is kept DISCOVER_KEEP_S, so a fleet's wakes in
one tick ask once.

Not here: the wire (wire.py, tls.py), moving an agent between nodes (not built).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from orchestrator.broker import tls, wire
from orchestrator.records import placement
from orchestrator.sandbox.box import SandboxError

NODE_ENV = "WAKELOOP_NODE"  # the broker's node (a swarm template: {{.Node.Hostname}})
DISCOVER_KEEP_S = 5.0
PING_TIMEOUT_S = 3.0  # a node that is down answers nothing: its ping must not hold a wake long


class NodeUnavailable(SandboxError):
    """The agent's node (or, for an agent not yet placed, every node) does not answer: one line."""


@dataclass(frozen=True)
class Node:
    name: str  # "" from a broker that names no node: one host
    address: str  # tls://IP:PORT of its broker now


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
        reply = wire.request(target, wire.Ping(), PING_TIMEOUT_S, connect_wait_s=PING_TIMEOUT_S)
    except SandboxError:
        return None
    name = reply.get("node")
    return Node(name if isinstance(name, str) else "", target)


def address_for(agent_dir: Path, address: str) -> str:
    """The broker address for the agent in `agent_dir`: its node's, placing it first if it has none.
    A unix socket, or brokers that name no node: `address` itself. NodeUnavailable otherwise."""
    if not address.startswith(tls.SCHEME):
        return address
    nodes = discover(address)
    if nodes and not any(n.name for n in nodes):
        return address  # one broker, no swarm
    state_dir = agent_dir / "state"
    with _lock:
        node = placement.read_node(state_dir)
        if node is None:
            node = _place(agent_dir, state_dir, nodes, address)
    for n in nodes:
        if n.name == node:
            return n.address
    raise NodeUnavailable(f"its node {node} does not answer (no broker of {address} on it): skipped until it returns")


def check_node(agent_dir: Path, address: str) -> None:
    """At a wake's start: the agent's node answers now (a fresh ping, not the kept discovery,
    which may be DISCOVER_KEEP_S old), placing the agent first if it has none; else NodeUnavailable."""
    target = address_for(agent_dir, address)
    if target == address:
        return
    try:
        wire.request(target, wire.Ping(), PING_TIMEOUT_S, connect_wait_s=PING_TIMEOUT_S)
    except SandboxError:
        with _lock:
            _seen.pop(address, None)
        address_for(agent_dir, address)  # found again (its task restarted elsewhere) or NodeUnavailable


def _place(agent_dir: Path, state_dir: Path, nodes: tuple[Node, ...], address: str) -> str:
    named = [n for n in nodes if n.name]
    if not named:
        raise NodeUnavailable(f"no broker answers at {address}: not placed yet, skipped until one does")
    counts = placement.placed(agent_dir.parent)
    chosen = min(named, key=lambda n: (counts.get(n.name, 0), n.name))
    state_dir.mkdir(mode=0o700, exist_ok=True)
    placement.write_node(state_dir, chosen.name)
    return chosen.name
