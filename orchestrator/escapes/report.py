"""The report card: a table of probes, counts per category, host warnings.

Text for a person at a terminal, or one JSON document for a machine.
Observed text came out of a box: it is cleaned again before it is printed.
A probe whose cleanup left something on the host (lab.py's Trial.cleanup)
shows what, and the commands that release it, under the probes that did not hold.

Not here: running the probes (lab.py, command.py), the console's page of it
(console/templates/escapes.html).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict

from orchestrator.escapes.host import WARNING, HostCheck
from orchestrator.escapes.lab import ESCAPED, HELD, INCONCLUSIVE, Outcome
from orchestrator.escapes.registry import CATEGORIES
from orchestrator.sandbox.containers.output import clean

WIDTH = {"probe": 38, "category": 11, "verdict": 12, "expected": 48, "observed": 70}  # columns, in characters


def counts(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    table = {}
    for category in CATEGORIES:
        mine = Counter(o.verdict for o in outcomes if o.category == category)
        if mine:
            table[category] = {HELD: mine[HELD], ESCAPED: mine[ESCAPED], INCONCLUSIVE: mine[INCONCLUSIVE]}
    return table


def failed(outcomes: list[Outcome]) -> bool:
    """Anything that did not hold: an escape, or a probe that proved nothing."""
    return any(o.verdict != HELD for o in outcomes)


def _cell(text: str, width: int) -> str:
    text = clean(text).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def text_report(outcomes: list[Outcome], host: list[HostCheck], header: str) -> str:
    lines = [header, ""]
    cols = list(WIDTH)
    lines.append("  ".join(c.upper().ljust(WIDTH[c]) for c in cols).rstrip())
    for o in outcomes:
        row = {
            "probe": o.probe,
            "category": o.category,
            "verdict": o.verdict,
            "expected": o.expected,
            "observed": o.observed,
        }
        lines.append("  ".join(_cell(row[c], WIDTH[c]).ljust(WIDTH[c]) for c in cols).rstrip())
    lines += ["", f"{'CATEGORY':12} {'HELD':>5} {'ESCAPED':>8} {'INCONCLUSIVE':>13}"]
    total: Counter[str] = Counter()
    for category, c in counts(outcomes).items():
        total.update(c)
        lines.append(f"{category:12} {c[HELD]:>5} {c[ESCAPED]:>8} {c[INCONCLUSIVE]:>13}")
    lines.append(f"{'total':12} {total[HELD]:>5} {total[ESCAPED]:>8} {total[INCONCLUSIVE]:>13}")
    lines += ["", "HOST"]
    for check in host:
        lines.append(f"  {check.status.upper():8} {check.name}: {check.finding}")
        if check.status == WARNING and check.fix:
            lines.append(f"  {'':8} fix: {check.fix}")
    bad = [o for o in outcomes if o.verdict != HELD]
    lines.append("")
    if bad:
        lines.append(
            f"{sum(o.verdict == ESCAPED for o in bad)} escaped, "
            f"{sum(o.verdict == INCONCLUSIVE for o in bad)} inconclusive, of {len(outcomes)} probes:"
        )
        for o in bad:
            lines.append(f"  {o.verdict}: {o.probe}: {clean(o.observed)}")
            if o.left:
                lines.append(f"    left: {clean(o.left)}")
    else:
        lines.append(f"all {len(outcomes)} probes held")
    return "\n".join(lines)


def json_report(outcomes: list[Outcome], host: list[HostCheck], meta: dict) -> str:
    return json.dumps(
        {
            **meta,
            "escaped": failed(outcomes),
            "counts": counts(outcomes),
            "probes": [asdict(o) for o in outcomes],
            "host": [asdict(h) for h in host],
        },
        indent=2,
    )
