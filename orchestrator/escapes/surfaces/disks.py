"""Surface probes: disks. (Each probe's weakened control: tests/escapes/test_surfaces_disks.py.)"""

from __future__ import annotations

PROBES: list = []
