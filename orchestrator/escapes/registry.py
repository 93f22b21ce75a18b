"""Every probe, in the order the report shows them, grouped by category."""

from __future__ import annotations

from orchestrator.escapes import allowlist
from orchestrator.escapes import credentials
from orchestrator.escapes import engine_mount_probes
from orchestrator.escapes import filesystem
from orchestrator.escapes import harness
from orchestrator.escapes import information
from orchestrator.escapes import network_probes
from orchestrator.escapes import orchestrator
from orchestrator.escapes import persistence
from orchestrator.escapes import privileges
from orchestrator.escapes import resources
from orchestrator.escapes import surfaces
from orchestrator.escapes import transaction_probes
from orchestrator.escapes import workspace_probes

CATEGORIES = (
    "filesystem",
    "workspace",
    "privileges",
    "network",
    "allowlist",
    "information",
    "persistence",
    "resources",
    "harness",
    "orchestrator",
    "surfaces",
)

ALL_PROBES = (
    filesystem.PROBES
    + workspace_probes.PROBES
    + transaction_probes.PROBES
    + engine_mount_probes.PROBES
    + privileges.PROBES
    + network_probes.PROBES
    + allowlist.PROBES
    + credentials.PROBES
    + information.PROBES
    + persistence.PROBES
    + resources.PROBES
    + harness.PROBES
    + orchestrator.PROBES
    + surfaces.PROBES
)


def by_name(name: str):
    for probe in ALL_PROBES:
        if probe.name == name:
            return probe
    raise KeyError(name)
