"""JSON read back from an agent folder: untrusted text, parsed as data or refused.

Whoever may write an agent folder (docs/security.md's actor D) can put anything in a
state/ file, and a JSON text nested a hundred thousand deep makes Python's
parser raise RecursionError, which no reader expected: a wake, `status`,
the console or the notification sender would crash on it. `loads` turns that
into the ValueError every reader already treats as a corrupt file.

Not here: reading the bytes (folder.py, capped), what a record holds (records/state.py, ...).
"""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deep to be one of ours") from None
