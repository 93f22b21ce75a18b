"""Which node an agent was placed on past one host: `state/placement.json`, `{"node": NAME, "at": ISO}`.

Written once, when the agent is first woken on a swarm (broker/nodes.py
chooses the node), and read on every wake after: an agent stays on its node,
whose broker holds its workspace. No file: never placed (one host, or not yet
woken). A file that does not parse reads as no placement, never raises.

Not here: choosing a node, or reaching its broker (broker/nodes.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.safeio.folder import state_folder

PLACEMENT_FILE = "placement.json"
MAX_BYTES = 4096  # a node's name and a time; anything bigger is not ours


def read_node(state_dir: Path) -> str | None:
    """The node the agent is placed on, or None. Read through the state folder (safeio/folder.py): a link
    or a FIFO planted there is not followed or opened, and the read is capped."""
    try:
        data = json.loads(state_folder(state_dir).read_bytes(PLACEMENT_FILE, MAX_BYTES))
    except (OSError, ValueError):  # absent, not a regular file, too big, not JSON
        return None
    node = data.get("node") if isinstance(data, dict) else None
    return node if isinstance(node, str) and node else None


def write_node(state_dir: Path, node: str) -> None:
    """Place the agent on `node` (whole or not at all, no link followed: safeio/folder.py's write_atomic)."""
    record = {"node": node, "at": datetime.now(UTC).isoformat(timespec="seconds")}
    state_folder(state_dir).write_atomic(PLACEMENT_FILE, json.dumps(record))


def placed(root: Path) -> dict[str, int]:
    """How many agents under ROOT are placed on each node."""
    counts: dict[str, int] = {}
    for agent_dir in sorted(root.iterdir()) if root.is_dir() else ():
        node = read_node(agent_dir / "state") if agent_dir.is_dir() else None
        if node:
            counts[node] = counts.get(node, 0) + 1
    return counts
