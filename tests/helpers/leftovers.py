"""Which sandbox containers a test session made: for the no-leftover checks."""

from __future__ import annotations

from pathlib import Path

from orchestrator.sandbox.engine import LABEL


def our_containers(client, base: Path) -> list:
    """Sandbox containers whose workspace lies under this test session's temp dir."""
    found = client.api.containers(all=True, filters={"label": f"{LABEL}=1"})  # one request, no races
    return [c["Id"][:12] for c in found if (c.get("Labels") or {}).get("wakeloop.workspace", "").startswith(str(base))]
