"""Every surface probe of escapes/surfaces/notify.py can fail: each reports ESCAPED
against wakeloop with one of its checks switched off (monkeypatch) or an
older design put back. COVERED names the probes shown able to fail here."""

from __future__ import annotations

COVERED: set[str] = set()
