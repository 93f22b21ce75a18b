"""ROOT/budget.yaml: what all agents under ROOT may spend together.

    # ROOT/budget.yaml: yours, for every agent under ROOT
    max_usd_per_day: 50          # USD per UTC day, every agent's ledger summed; 0 = no cap
    max_usd_per_month: 1000      # USD per UTC month, likewise; 0 = no cap

Checked before every model call of every live wake, beside the agent's own
caps (records/ledger.py Meter); a wake it stops ends `budget_stop`, its
reason naming `fleet.max_usd_per_day` or `fleet.max_usd_per_month` and this
file. The ceiling (WAKELOOP_CEILING: max.fleet_usd_per_day and
max.fleet_usd_per_month) bounds both: a number over it, or 0 (no cap) under
a bound, is refused with `file:line: key: reason`; with no budget.yaml, the
ceiling's numbers are the fleet's caps. Read fresh at each wake's start, as
untrusted as any config (safeio/yamlfile.py's read_config): a regular file, capped.

Not here: adding up what was spent (ledger.py FleetBooks), the agent's own
caps (schema.py Budget).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from orchestrator.policy.agent import CEILING_ENV
from orchestrator.policy.ceiling import load_ceiling
from orchestrator.policy.schema import PolicyError
from orchestrator.records.ledger import FleetCaps
from orchestrator.safeio.yamlfile import line_of, parse_yaml, read_config

BUDGET_FILE = "budget.yaml"  # in ROOT
KEYS = ("max_usd_per_day", "max_usd_per_month")
CEILING_KEYS = {"max_usd_per_day": "fleet_usd_per_day", "max_usd_per_month": "fleet_usd_per_month"}


def load_fleet_budget(root: Path, environ: Mapping[str, str] = os.environ) -> FleetCaps:
    """The fleet's caps for ROOT: budget.yaml's, within the ceiling's; PolicyError naming file:line: key."""
    root = Path(root)
    bounds, ceiling_source = _bounds(environ)
    path = root / BUDGET_FILE
    if not os.path.lexists(path):
        return FleetCaps(root, **bounds, source=f"the ceiling {ceiling_source}" if bounds else "")
    text = read_config(path, "budget file")
    try:
        data, node = parse_yaml(text)
    except RecursionError:
        raise PolicyError(f"{path}: not valid YAML: nested too deep") from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"{path}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: a budget file is a mapping of {', '.join(KEYS)}")
    caps = {}
    for key, value in data.items():
        at = f"{path}{f':{line}' if (line := line_of(node, (key,))) else ''}: {key}"
        if key not in KEYS:
            raise PolicyError(f"{at}: unknown key; a budget file has {', '.join(KEYS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise PolicyError(f"{at}: expected USD as a number of at least 0 (0: no cap), got {value!r}")
        limit = bounds.get(key)
        if limit is not None and (value == 0 or value > limit):
            what = "0 (no cap)" if value == 0 else f"${value:,.2f}"
            raise PolicyError(
                f"{at}: {what} is over the ceiling's max.{CEILING_KEYS[key]} of ${limit:,.2f} "
                f"({ceiling_source}); lower it, or raise the ceiling"
            )
        caps[key] = float(value)
    return FleetCaps(root, **{**bounds, **caps}, source=str(path))


def _bounds(environ: Mapping[str, str]) -> tuple[dict[str, float], str]:
    """The ceiling's fleet bounds, by budget.yaml's key; ({}, "") without a ceiling."""
    source = environ.get(CEILING_ENV, "").strip()
    if not source:
        return {}, ""
    ceiling = load_ceiling(source)
    return {key: float(ceiling.max[c]) for key, c in CEILING_KEYS.items() if c in ceiling.max}, source
