"""Text a person reads that another wrote (a held call, the model's words, an agent's messages),
shown so that what reads is what runs: every character that does not show itself is written
out as \\uXXXX. That is controls (C0, C1, DEL), bidi overrides and isolates (U+202A-202E,
U+2066-2069), zero-width and every other format character (Unicode category Cf), line and
paragraph separators, surrogates, private and unassigned code points, every space but the
space, and the letters that draw as blank (Hangul fillers, the braille blank). One function
for the CLI's table and --json, the console and notifications; the confirm page uses it too.

Not here: cleaning a box's output for keeping (sandbox/containers/output.py's clean), an egress record's
fields (egress.py), Slack's own markup (notify/channels.py).
"""

from __future__ import annotations

import json
import unicodedata

HIDDEN = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))  # categories written out
BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800")  # letters and a symbol drawn as nothing


def hidden(c: str) -> bool:
    """Whether the character `c` fails to show itself on a page or a terminal."""
    return c != " " and (unicodedata.category(c) in HIDDEN or c in BLANK)


def shown(text: str, keep: str = "") -> str:
    """`text` with every hidden character written out (\\u202e, \\U000e0041); `keep`: characters
    the caller lays out itself (a newline, a tab)."""
    return "".join(_written(c) if c not in keep and hidden(c) else c for c in text)


def json_shown(data: object) -> str:
    """`data` as indented JSON whose strings have every hidden character as a JSON escape: read
    back, the values are exact; printed, nothing hides."""
    text = json.dumps(data, ensure_ascii=False, indent=2, default=str)
    return "".join(_json_escape(c) if c not in "\n " and hidden(c) else c for c in text)


def _written(c: str) -> str:
    return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"


def _json_escape(c: str) -> str:
    units = c.encode("utf-16-be", "surrogatepass")
    return "".join(f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2))
