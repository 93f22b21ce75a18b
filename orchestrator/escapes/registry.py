"""Every probe, in the order the report shows them, grouped by category."""

from __future__ import annotations

from . import filesystem, harness, information, network, persistence, privileges, resources, workspace

CATEGORIES = ("filesystem", "workspace", "privileges", "network", "information", "persistence",
              "resources", "harness")

ALL_PROBES = (filesystem.PROBES + workspace.PROBES + privileges.PROBES + network.PROBES
              + information.PROBES + persistence.PROBES + resources.PROBES + harness.PROBES)


def by_name(name: str):
    for probe in ALL_PROBES:
        if probe.name == name:
            return probe
    raise KeyError(name)
