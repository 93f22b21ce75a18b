"""The event log as a person reads it: one line per event for `wakeloop log`.

Every value is untrusted (a tool's name, the model's words, a planted line):
cleaned of control characters and cut.

Not here: the log itself (records/events.py), transcripts (logview.py),
egress decisions (egressview.py).
"""

from __future__ import annotations

import json

from orchestrator.records.events import Event
from orchestrator.sandbox.containers.output import clean

LOG_VALUE_CAP = 160  # chars of one field on a readable log line


def format_event(event: Event) -> str:
    """One readable line for `wakeloop log`; untrusted text is cleaned and cut."""
    fields = []
    for key, value in event.data.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        text = clean(" ".join(text.split()))
        fields.append(f"{key}={text[:LOG_VALUE_CAP]}{'...' if len(text) > LOG_VALUE_CAP else ''}")
    return f"{event.timestamp}  {event.run_id[:8]}  {event.type:<15} {' '.join(fields)}"
