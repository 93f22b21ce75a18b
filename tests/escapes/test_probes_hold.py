"""Every probe of the escape suite holds under the default policy, on runc and runsc.

A probe that finds a hole is never weakened here. Holes found and not yet
fixed are listed in KNOWN_HOLES with what they are: they run, and are marked
xfail(strict=True), so the report says "xfailed", never "passed", and the
day a fix lands the test fails as XPASS until the entry is removed.
"""

from __future__ import annotations

import pytest

from orchestrator.escapes import ALL_PROBES, HELD
from orchestrator.escapes.lab import run_probe

# probe name -> {runtime: why it escapes there}
KNOWN_HOLES: dict[str, dict[str, str]] = {}


# The surfaces around the box (the console, notifications, the files kept) make no box:
# each of their probes runs once, not once per runtime.
BOX_PROBES = [p for p in ALL_PROBES if p.category != "surfaces"]
SURFACE_PROBES = [p for p in ALL_PROBES if p.category == "surfaces"]


@pytest.mark.parametrize("probe", BOX_PROBES, ids=lambda p: p.name)
def test_probe_holds(probe, make_lab, runtime, request):
    hole = KNOWN_HOLES.get(probe.name, {}).get(runtime)
    if hole:
        request.applymarker(pytest.mark.xfail(strict=True, reason=hole))
    outcome = run_probe(make_lab(), probe)
    assert outcome.verdict == HELD, f"{outcome.verdict}: {outcome.observed}"


@pytest.mark.parametrize("probe", SURFACE_PROBES, ids=lambda p: p.name)
def test_surface_probe_holds(probe, surface_lab):
    outcome = run_probe(surface_lab, probe)
    assert outcome.verdict == HELD, f"{outcome.verdict}: {outcome.observed}"


def test_suite_covers_every_category_with_45_probes():
    from orchestrator.escapes import CATEGORIES

    names = [p.name for p in ALL_PROBES]
    assert len(names) == len(set(names)) and len(names) >= 45
    assert {p.category for p in ALL_PROBES} == set(CATEGORIES)
