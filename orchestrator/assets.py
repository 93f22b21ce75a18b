"""The files that travel with wakeloop: image sources and the shipped policies.

In a checkout (and in the orchestrator image) they sit beside the package:
sandbox-image/, proxy-image/, policies/. Installed from the wheel, they are
under sys.prefix/share/wakeloop/ (pyproject's data-files put them there).
WAKELOOP_ASSETS names another folder laid out the same way.

Not here: building images (sandbox/containers/images.py, sandbox/egress/network.py), reading a
policy (policy/schema.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ASSETS_ENV = "WAKELOOP_ASSETS"
SHIPPED_POLICIES = ("default", "strict", "networked")  # `policy: strict` in agent.yaml names one


def _roots() -> list[Path]:
    roots = [Path(os.environ[ASSETS_ENV])] if os.environ.get(ASSETS_ENV) else []
    return roots + [Path(__file__).resolve().parents[1], Path(sys.prefix) / "share" / "wakeloop"]


def asset_dir(name: str) -> Path | None:
    """The folder `name` (sandbox-image, proxy-image, policies) of the first root that has it."""
    for root in _roots():
        if (root / name).is_dir():
            return root / name
    return None


def shipped_policy(name: str) -> Path | None:
    """policies/NAME.yaml as shipped, for a bare name such as `strict`; else None."""
    if name not in SHIPPED_POLICIES:
        return None
    folder = asset_dir("policies")
    return folder / f"{name}.yaml" if folder and (folder / f"{name}.yaml").is_file() else None
