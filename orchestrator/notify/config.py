"""The `notify:` list of agent.yaml and ROOT/notify.yaml, read once into frozen Channels.

    notify:
      - webhook: https://hooks.example.com/T000/B000    # POST, JSON body
        on: [dead_letter, blocked, budget_stop, failing, message]
      - slack: ${SLACK_WEBHOOK_URL}                     # Slack incoming-webhook payload
      - email: ops@example.com                          # via WAKELOOP_SMTP_URL
      - command: ["/usr/local/bin/page-me"]             # JSON on stdin
        timeout_s: 30

Each entry names one channel and, optionally, `on` (the events it gets;
default: all but daily) and `give_up_after` (how long the sender keeps
retrying one notification, default 24h). ROOT/notify.yaml holds the same
list (bare, or under `notify:`) and adds to every agent under ROOT.

`${VAR}` is kept as written and read from the environment at send time
(channels.py), so a token can live in the environment, and nothing here,
in the queue or in any log holds more of a target than `label` shows:
`webhook hooks.example.com/…`, never the path or the query.

Not here: sending (channels.py), the queue (queue.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from orchestrator.errors import ConfigError
from orchestrator.policy.schema import line_of
from orchestrator.records.folder import Folder

EVENTS = ("dead_letter", "blocked", "budget_stop", "message", "failing", "recovered", "paused", "daily")
DEFAULT_ON = tuple(e for e in EVENTS if e != "daily")   # a digest a day is asked for, not assumed
KINDS = ("webhook", "slack", "email", "command")
GIVE_UP_AFTER_S = 24 * 3600         # one notification is retried this long, then given up (and shown)
COMMAND_TIMEOUT_S = 30.0            # a command hook's wall clock
ROOT_FILE = "notify.yaml"
NOTIFY_CAP = 1 * 2**20              # bytes of ROOT/notify.yaml read; real ones are a few KiB
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")


class NotifyError(ConfigError):
    """A bad notify entry: `file:line: notify[i].key: reason`."""


@dataclass(frozen=True)
class Channel:
    kind: str                       # webhook | slack | email | command
    target: str | tuple[str, ...]   # as written: ${VAR} not yet read; a command's argv
    on: frozenset[str]
    give_up_after_s: float = GIVE_UP_AFTER_S
    timeout_s: float = COMMAND_TIMEOUT_S
    source: str = ""                # file:line, for messages

    @property
    def key(self) -> str:
        """Stable while the entry is unchanged: queued items name their channel by it, never by URL."""
        raw = json.dumps([self.kind, self.target], ensure_ascii=False)
        return hashlib.sha256(raw.encode()).hexdigest()[:12]

    @property
    def label(self) -> str:
        """What a person may see anywhere: the host of a URL, an address, a program's name."""
        if self.kind == "command":
            return f"command {Path(self.target[0]).name}"
        if self.kind == "email":
            return f"email {self.target}"
        host = urlsplit(str(self.target)).hostname if "://" in str(self.target) else None
        named = ",".join("$" + name for name in _VAR.findall(str(self.target)))
        return f"{self.kind} {host}/…" if host else f"{self.kind} {named or '(a URL)'}"


def parse_notify(value: Any, source: Path, node: yaml.Node | None, path: tuple = ("notify",)) -> tuple[Channel, ...]:
    """The notify list at `path` in a parsed file; NotifyError names the file, line and key."""
    def fail(keys: tuple, message: str) -> NotifyError:
        line = line_of(node, path + keys)
        dotted = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys)
        where = f"{source}:{line}" if line else str(source)
        return NotifyError(f"{where}: {'.'.join(map(str, path)) or 'notify'}{dotted}: {message}")

    if value is None:
        return ()
    if not isinstance(value, list):
        raise fail((), "expected a list of channels, e.g. - webhook: https://…")
    return tuple(_channel(i, entry, fail, f"{source}:{line_of(node, path + (i,)) or '?'}")
                 for i, entry in enumerate(value))


def _channel(i: int, entry: Any, fail, where: str) -> Channel:
    if not isinstance(entry, dict):
        raise fail((i,), f"expected a mapping with one of {', '.join(KINDS)}")
    entry = {("on" if k is True else k): v for k, v in entry.items()}   # YAML 1.1 reads a bare `on:` as true
    kinds = [k for k in KINDS if k in entry]
    if len(kinds) != 1:
        raise fail((i,), f"name exactly one channel ({', '.join(KINDS)}), got {', '.join(kinds) or 'none'}")
    kind = kinds[0]
    unknown = sorted(set(map(str, entry)) - {kind, "on", "give_up_after", "timeout_s"})
    if unknown:
        raise fail((i, unknown[0]), "unknown key (known: on, give_up_after, timeout_s)")
    target = _target(kind, entry[kind], lambda m: fail((i, kind), m))
    on = entry.get("on", list(DEFAULT_ON))
    if not isinstance(on, list) or not all(isinstance(e, str) for e in on):
        raise fail((i, "on"), f"expected a list of events: {', '.join(EVENTS)}")
    bad = [e for e in on if e not in EVENTS]
    if bad:
        raise fail((i, "on"), f"{bad[0]!r} is not an event; known: {', '.join(EVENTS)}")
    try:
        give_up = _seconds(entry.get("give_up_after", GIVE_UP_AFTER_S))
        timeout = _seconds(entry.get("timeout_s", COMMAND_TIMEOUT_S))
    except ValueError as exc:
        raise fail((i, "give_up_after" if "give_up_after" in entry else "timeout_s"), str(exc)) from None
    return Channel(kind, target, frozenset(on), give_up, timeout, where)


def _target(kind: str, value: Any, fail) -> str | tuple[str, ...]:
    if kind == "command":
        if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
            raise fail('expected the program and its arguments as a list, e.g. ["/usr/local/bin/page-me"]')
        return tuple(value)
    if not isinstance(value, str) or not value.strip():
        raise fail("expected a string")
    value = value.strip()
    if kind == "email" and not (_EMAIL.match(value) or _VAR.fullmatch(value)):
        raise fail(f"{value!r} is not an email address")
    if kind in ("webhook", "slack") and not (_VAR.search(value) or value.startswith(("http://", "https://"))):
        raise fail("expected an http(s) URL or ${VAR} naming one")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    match = _DURATION.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"expected a duration like 30s, 10m, 24h or 2d, got {value!r}")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def load_root_notify(root: Path) -> tuple[Channel, ...]:
    """ROOT/notify.yaml's channels (none if the file is absent)."""
    path = Path(root) / ROOT_FILE
    if not os.path.lexists(path):
        return ()
    try:   # records/folder.py: no link followed, never a FIFO or device, capped
        text = Folder(Path(root)).read_bytes(ROOT_FILE, NOTIFY_CAP).decode("utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise NotifyError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if isinstance(data, dict):
        unknown = sorted(set(map(str, data)) - {"notify"})
        if unknown:
            raise NotifyError(f"{path}: {unknown[0]}: unknown key (a notify.yaml holds `notify:` and its list)")
        return parse_notify(data.get("notify"), path, node)
    return parse_notify(data, path, node, path=())


def expand(text: str, environ) -> str:
    """${VAR} from the environment at send time; a missing variable is a delivery error."""
    def one(match: re.Match) -> str:
        name = match.group(1)
        if not environ.get(name):
            raise LookupError(f"${{{name}}} is not set in the sender's environment")
        return environ[name]
    return _VAR.sub(one, text)


def referenced(text: str, environ) -> tuple[str, ...]:
    """The values of the ${VAR}s in `text`: each a secret to scrub wherever an error might echo it."""
    return tuple(v for name in _VAR.findall(text) if len(v := environ.get(name, "")) >= 4)
