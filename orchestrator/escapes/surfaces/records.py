"""Surface probes: records. (Each probe's weakened control: tests/escapes/test_surfaces_records.py.)"""

from __future__ import annotations

PROBES: list = []
