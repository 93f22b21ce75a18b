"""Surface probes: console. (Each probe's weakened control: tests/escapes/test_surfaces_console.py.)"""

from __future__ import annotations

PROBES: list = []
