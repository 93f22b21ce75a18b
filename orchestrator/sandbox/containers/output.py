"""Untrusted output from the sandbox, made safe to keep, show and log.

Everything here treats its input as hostile: it may be gigabytes long,
binary, invalid UTF-8, full of NUL bytes or terminal escape sequences that
would repaint a person's terminal or forge lines in a log. Memory stays
bounded by the cap whatever the input size.
"""

from __future__ import annotations

import re

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), other two-byte ESC
# sequences, and C0/C1 controls except newline and tab.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]"
)


def clean(text: str) -> str:
    """Strip escape sequences and control characters; keep newlines and tabs."""
    return _ESCAPES.sub("", text.replace("\r\n", "\n"))


def decode(data: bytes) -> str:
    return clean(data.decode("utf-8", errors="replace"))


class Capture:
    """Keeps the first and last `cap // 2` bytes of a stream and counts the rest.

    The model needs the start (what ran) and the end (how it failed); the
    middle of a gigabyte of output is only counted, never held.
    """

    def __init__(self, cap: int):
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.half:  # trim in batches, not per chunk
                del self.tail[: len(self.tail) - self.half]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + min(len(self.tail), self.half)

    def text(self) -> str:
        tail = bytes(self.tail[-self.half :]) if self.tail else b""
        if not self.truncated:
            return decode(bytes(self.head) + tail)
        cut = self.total - len(self.head) - len(tail)
        note = (
            f"\n[... output truncated: {cut:,} of {self.total:,} bytes cut; "
            f"the first {len(self.head):,} and last {len(tail):,} are shown ...]\n"
        )
        return decode(bytes(self.head)) + note + decode(tail)
