"""The last report of each `wakeloop escapes` run, kept per runtime and policy, for the console.

Every run writes its JSON report (report.json_report, plus when it finished)
to `$WAKELOOP_REPORTS`, by default `$XDG_STATE_HOME/wakeloop/escapes`
(~/.local/state/wakeloop/escapes): one file per runtime and policy, replaced
atomically, so the console's Escapes page shows this host's latest report
card for each without running anything.

Here, below both, so that the escape suite (escapes/command.py) writes it and the console
(console/app.py) reads it without either importing the other.

Not here: running the probes (escapes/command.py), rendering (escapes/report.py, console/).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.safeio.atomic import atomic_write

REPORTS_ENV = "WAKELOOP_REPORTS"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def reports_dir(environ: Mapping[str, str] = os.environ) -> Path:
    if environ.get(REPORTS_ENV):
        return Path(environ[REPORTS_ENV])
    state = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "wakeloop" / "escapes"


def save(report: dict[str, Any], environ: Mapping[str, str] = os.environ) -> Path:
    """Keep `report` as the latest for its runtime and policy; returns where."""
    folder = reports_dir(environ)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = _UNSAFE.sub("_", f"{report.get('runtime')}--{report.get('policy')}")[:200] + ".json"
    path = folder / name
    atomic_write(path, json.dumps(report, indent=2))
    return path


def latest(environ: Mapping[str, str] = os.environ) -> list[dict[str, Any]]:
    """Every kept report, newest first; an unreadable file is skipped."""
    found: list[dict[str, Any]] = []
    folder = reports_dir(environ)
    for path in folder.glob("*.json") if folder.is_dir() else ():
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(report, dict):
            found.append(report)
    return sorted(found, key=lambda r: str(r.get("finished_at", "")), reverse=True)
