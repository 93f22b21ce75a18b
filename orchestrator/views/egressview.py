"""The egress record read by a person: one line per decision (`wakeloop log AGENT --egress`).

    2026-12-02T01:02:03.456Z  3f2a9c1e  DENY   POST api.github.com:443 /repos/x/pulls  <- allow GET /repos/**
    2026-12-02T01:02:04.001Z  3f2a9c1e  allow  CONNECT pypi.org:443  <- allow_hosts: pypi.org  ↑1.2 kB ↓88.0 kB

A denial is in capitals, so it stands out in a column of allows. The host,
path and rule came from a request the box made, or from a planted line:
records/egress.py has already cut them and dropped control characters, and
`clean` runs again here before anything reaches a terminal. A line that is
not a decision is shown as one, never skipped silently.

Not here: the record and its checks (records/egress.py), the console's
rendering (console/templates/wake.html), the counters (metrics.py).
"""

from __future__ import annotations

from orchestrator.records.egress import Foreign, Line
from orchestrator.records.receipt import EgressSum
from orchestrator.sandbox.containers.output import clean


def format_decision(line: Line) -> str:
    """One decision (or a line that is not one) as one readable line."""
    if isinstance(line, Foreign):
        run = f", run {line.run_id[:8]}" if line.run_id else ""
        return f"(a line that is not an egress decision{run}: {clean(line.excerpt)})"
    verdict = "allow" if line.allowed else "DENY "
    where = f"{line.host}:{line.port}" if line.port else line.host
    path = f" {line.path}" if line.path else ""
    extra = []
    if line.intercepted:
        extra.append("intercepted")
    if line.credential:
        extra.append(f"credential {line.credential}")
    if line.bytes_up or line.bytes_down or line.bytes_up is None or line.bytes_down is None:
        extra.append(f"↑{size(line.bytes_up)} ↓{size(line.bytes_down)}")
    text = f"{line.time}  {line.run_id[:8]:<8}  {verdict}  {line.method} {where}{path}  <- {line.rule or '?'}"
    return clean(" ".join([text, *extra]) if extra else text).replace("\n", " ").replace("\t", " ")


def size(count: int | None) -> str:
    """Bytes as a person reads them: 812 B, 1.2 kB, 88.0 MB; `?` for a count the file did not say."""
    if count is None:
        return "?"
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def summary(total: EgressSum) -> str:
    """A receipt's egress in a few words ("" when the wake made no connection through a proxy)."""
    if not total.decisions:
        return ""
    return f"{total.allowed} allowed, {total.denied} denied, ↑{size(total.bytes_up)} ↓{size(total.bytes_down)}"
