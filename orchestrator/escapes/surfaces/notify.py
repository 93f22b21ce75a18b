"""Surface probes: notify. (Each probe's weakened control: tests/escapes/test_surfaces_notify.py.)"""

from __future__ import annotations

PROBES: list = []
