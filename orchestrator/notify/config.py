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
list (bare, or under `notify:` beside `expand:`) and adds to every agent
under ROOT.

`${VAR}` is kept as written and read from the environment at send time
(channels.py), so a token can live in the environment, and nothing here,
in the queue or in any log holds more of a target than `label` shows:
`webhook hooks.example.com/…`, never the path or the query.

Who may ask for what (whoever writes one agent folder is not the operator):

- `${VAR}` reads only names the operator allowed: by default those starting
  SLACK_ or WAKELOOP_NOTIFY_, more through ROOT/notify.yaml's
  `expand: [PAGER_TOKEN, "OPS_*"]` or the ceiling's `notify_env:`. A secret
  (safeio/secrets.py: ANTHROPIC_*, the console token, the SMTP URL) never:
  an entry naming one, or an `expand:` pattern that admits one, is refused
  at load with `file:line: key: reason`; channels.py checks again at send.
- `command:` runs a program as the orchestrator: only ROOT/notify.yaml may
  name one, or agent.yaml when the ceiling says `notify_commands: true`.

ROOT/notify.yaml is read like every config file (safeio/yamlfile.py's
read_config: a regular file, capped, no aliases).

Not here: sending (channels.py), the queue (queue.py), the ceiling's keys
(policy/ceiling.py), the list of secrets (safeio/secrets.py).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from orchestrator.errors import ConfigError
from orchestrator.safeio.folder import Folder
from orchestrator.safeio.secrets import is_secret, pattern_reaches_secret
from orchestrator.safeio.yamlfile import ConfigFileError, KeyPath, line_of, parse_yaml

EVENTS = (
    "dead_letter",
    "blocked",
    "budget_stop",
    "not_committed",
    "message",
    "failing",
    "recovered",
    "paused",
    "no_room",
    "unavailable",
    "daily",
    "approval",
    "model_warning",
)
DEFAULT_ON = tuple(e for e in EVENTS if e != "daily")  # a digest a day is asked for, not assumed
KINDS = ("webhook", "slack", "email", "command")
GIVE_UP_AFTER_S = 24 * 3600  # one notification is retried this long, then given up (and shown)
COMMAND_TIMEOUT_S = 30.0  # a command hook's wall clock
MAX_GIVE_UP_AFTER_S = 7 * 86400  # past a week a notification is history, and its queue file would stay
MAX_TIMEOUT_S = 600.0  # a command hook that needs longer is not a notification
MAX_CHANNELS = 16  # entries in one notify list: each message goes to every one
ROOT_FILE = "notify.yaml"
NOTIFY_CAP = 1 * 2**20  # bytes of ROOT/notify.yaml read; real ones are a few KiB
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# An address as people write them, and nothing a header parser reads as more
# (no commas, quotes, brackets, spaces or controls: one recipient, no display name).
EMAIL = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")
DEFAULT_EXPAND = ("SLACK_*", "WAKELOOP_NOTIFY_*")  # the ${VAR}s any target may read without asking
_NAME_PATTERN = re.compile(r"^[A-Za-z_*?][A-Za-z0-9_*?]*$")


class NotifyError(ConfigError):
    """A bad notify entry: `file:line: notify[i].key: reason`."""


@dataclass(frozen=True)
class Allowed:
    """What the operator lets notify entries do: the ${VAR}s they may read (fnmatch
    patterns), and whether an agent's own agent.yaml may name a command."""

    expand: tuple[str, ...] = DEFAULT_EXPAND
    agent_commands: bool = False

    def refusal(self, name: str) -> str | None:
        """Why ${name} may not be read, or None."""
        if is_secret(name):
            return f"${{{name}}} is a secret wakeloop keeps (safeio/secrets.py); a notification target never carries it"
        if not any(fnmatch.fnmatchcase(name, p) for p in self.expand):
            return (
                f"${{{name}}} is not a variable notifications may read ({', '.join(self.expand)}); "
                f"the operator allows more in ROOT/notify.yaml (expand: [{name}]) or the ceiling "
                "(notify_env)"
            )
        return None


@dataclass(frozen=True)
class Channel:
    kind: str  # webhook | slack | email | command
    target: str | tuple[str, ...]  # as written: ${VAR} not yet read; a command's argv
    on: frozenset[str]
    give_up_after_s: float = GIVE_UP_AFTER_S
    timeout_s: float = COMMAND_TIMEOUT_S
    source: str = ""  # file:line, for messages
    expand: tuple[str, ...] = DEFAULT_EXPAND  # Allowed.expand at load: channels.py checks again at send

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


def parse_notify(
    value: Any,
    source: Path,
    node: yaml.Node | None,
    path: KeyPath = ("notify",),
    *,
    allowed: Allowed = Allowed(),
    operator: bool = False,
) -> tuple[Channel, ...]:
    """The notify list at `path` in a parsed file; NotifyError names the file, line and key.
    `operator`: the file is ROOT/notify.yaml (may name a command), not an agent's agent.yaml."""

    def fail(keys: KeyPath, message: str) -> NotifyError:
        line = line_of(node, path + keys)
        dotted = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys)
        where = f"{source}:{line}" if line else str(source)
        return NotifyError(f"{where}: {'.'.join(map(str, path)) or 'notify'}{dotted}: {message}")

    if value is None:
        return ()
    if not isinstance(value, list):
        raise fail((), "expected a list of channels, e.g. - webhook: https://…")
    if len(value) > MAX_CHANNELS:
        raise fail((MAX_CHANNELS,), f"{len(value)} channels; at most {MAX_CHANNELS} (each message goes to every one)")
    return tuple(
        _channel(i, entry, fail, f"{source}:{line_of(node, path + (i,)) or '?'}", allowed, operator)
        for i, entry in enumerate(value)
    )


def _channel(
    i: int, entry: Any, fail: Callable[[KeyPath, str], NotifyError], where: str, allowed: Allowed, operator: bool
) -> Channel:
    if not isinstance(entry, dict):
        raise fail((i,), f"expected a mapping with one of {', '.join(KINDS)}")
    entry = {("on" if k is True else k): v for k, v in entry.items()}  # YAML 1.1 reads a bare `on:` as true
    kinds = [k for k in KINDS if k in entry]
    if len(kinds) != 1:
        raise fail((i,), f"name exactly one channel ({', '.join(KINDS)}), got {', '.join(kinds) or 'none'}")
    kind = kinds[0]
    if kind == "command" and not command_allowed(operator, allowed):
        raise fail(
            (i, kind),
            "a command runs a program as the orchestrator: only ROOT/notify.yaml (the "
            "operator's) may name one, or the ceiling with notify_commands: true",
        )
    unknown = sorted(set(map(str, entry)) - {kind, "on", "give_up_after", "timeout_s"})
    if unknown:
        raise fail((i, unknown[0]), "unknown key (known: on, give_up_after, timeout_s)")
    target = _target(kind, entry[kind], lambda m: fail((i, kind), m))
    if why := target_refusal(target, allowed) or (None if operator else _placement_refusal(kind, target)):
        raise fail((i, kind), why)
    on = entry.get("on", list(DEFAULT_ON))
    if not isinstance(on, list) or not all(isinstance(e, str) for e in on):
        raise fail((i, "on"), f"expected a list of events: {', '.join(EVENTS)}")
    bad = [e for e in on if e not in EVENTS]
    if bad:
        raise fail((i, "on"), f"{bad[0]!r} is not an event; known: {', '.join(EVENTS)}")
    try:
        give_up = _seconds(entry.get("give_up_after", GIVE_UP_AFTER_S), MAX_GIVE_UP_AFTER_S)
        timeout = _seconds(entry.get("timeout_s", COMMAND_TIMEOUT_S), MAX_TIMEOUT_S)
    except ValueError as exc:
        raise fail((i, "give_up_after" if "give_up_after" in entry else "timeout_s"), str(exc)) from None
    return Channel(kind, target, frozenset(on), give_up, timeout, where, allowed.expand)


def target_refusal(target: str | tuple[str, ...], allowed: Allowed) -> str | None:
    """Why a target's ${VAR}s may not be read (the first that may not), or None."""
    for name in _VAR.findall(" ".join(target) if isinstance(target, tuple) else target):
        if why := allowed.refusal(name):
            return why
    return None


def _placement_refusal(kind: str, target: str | tuple[str, ...]) -> str | None:
    """From agent.yaml, one ${VAR} may only start the target, and what follows it cannot name
    another host: one written inside a URL the author chose (`https://their.host/${SLACK_WEBHOOK_URL}`),
    or followed by `@their.host` or `.their.host`, would send its value to their host. So a
    webhook's is followed by nothing or by a path or query (`/…`, `?…`), an email's by nothing."""
    names = _VAR.findall(" ".join(target) if isinstance(target, tuple) else target)
    if not names:
        return None
    if len(names) == 1 and isinstance(target, str) and target.startswith(f"${{{names[0]}}}"):
        rest = target[len(names[0]) + 3 :]
        if not rest or (kind != "email" and rest[0] in "/?"):
            return None
    return (
        f"in agent.yaml one ${{VAR}} may start the {kind} target (${{SLACK_WEBHOOK_URL}}"
        + ("" if kind == "email" else ", ${SLACK_HOST}/path")
        + ") and nothing after it may name "
        "another host; ROOT/notify.yaml may"
    )


def command_allowed(operator: bool, allowed: Allowed) -> bool:
    """A command runs as the orchestrator: the operator's file may name one; an agent.yaml only
    when the ceiling says notify_commands: true."""
    return operator or allowed.agent_commands


def _target(kind: str, value: object, fail: Callable[[str], NotifyError]) -> str | tuple[str, ...]:
    if kind == "command":
        if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
            raise fail('expected the program and its arguments as a list, e.g. ["/usr/local/bin/page-me"]')
        return tuple(value)
    if not isinstance(value, str) or not value.strip():
        raise fail("expected a string")
    value = value.strip()
    if any(c.isspace() or not c.isprintable() for c in value):
        raise fail("a target has no spaces, line breaks or control characters")
    if kind == "email" and not (EMAIL.match(value) or _VAR.fullmatch(value)):
        raise fail(f"{value!r} is not an email address")
    if kind in ("webhook", "slack") and not (_VAR.search(value) or value.startswith(("http://", "https://"))):
        raise fail("expected an http(s) URL or ${VAR} naming one")
    if kind in ("webhook", "slack") and "://" in value and urlsplit(value).username is not None:
        raise fail(
            "a URL with user:password@ is not sent (its host would be read as the name); put the "
            "token in the path through ${VAR}"
        )
    if kind in ("webhook", "slack") and "://" in value and not urlsplit(value).hostname:
        raise fail("the URL names no host")
    return value


def _seconds(value: Any, most: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        seconds = float(value)
    else:
        match = _DURATION.match(value) if isinstance(value, str) else None
        if not match:
            raise ValueError(f"expected a duration like 30s, 10m, 24h or 2d, got {value!r}")
        seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    if seconds > most:
        raise ValueError(f"{value!r} is over the most allowed, {most:g}s")
    return seconds


def load_root_notify(
    root: Path, ceiling_expand: tuple[str, ...] = (), agent_commands: bool = False
) -> tuple[tuple[Channel, ...], Allowed]:
    """ROOT/notify.yaml's channels (none if the file is absent), and what agent.yaml's may do:
    the default ${VAR}s, the ceiling's `notify_env` (checked where it is read), and the file's `expand:`."""
    path = Path(root) / ROOT_FILE
    allowed = Allowed(DEFAULT_EXPAND + tuple(ceiling_expand), agent_commands)
    if not os.path.lexists(path):
        return (), allowed
    try:
        # safeio/folder.py: no link followed, never a FIFO or device, capped; parse_yaml: no aliases
        data, node = parse_yaml(Folder(Path(root)).read_bytes(ROOT_FILE, NOTIFY_CAP).decode("utf-8"))
    except ConfigFileError as exc:
        raise NotifyError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise NotifyError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except RecursionError:
        raise NotifyError(f"{path}: not valid YAML: nested too deep") from None
    except yaml.YAMLError as exc:
        raise NotifyError(f"{path}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        return parse_notify(data, path, node, path=(), allowed=allowed, operator=True), allowed
    unknown = sorted(set(map(str, data)) - {"notify", "expand"})
    if unknown:
        raise NotifyError(
            f"{_where(path, node, (unknown[0],))}: {unknown[0]}: unknown key (a notify.yaml "
            "holds `notify:` and its list, and `expand:`)"
        )
    allowed = Allowed(allowed.expand + _expand_list(data.get("expand"), path, node), agent_commands)
    return parse_notify(data.get("notify"), path, node, allowed=allowed, operator=True), allowed


def _expand_list(value: Any, path: Path, node: yaml.Node | None) -> tuple[str, ...]:
    """notify.yaml's `expand:`: names or patterns, none of which may admit a secret."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NotifyError(
            f"{_where(path, node, ('expand',))}: expand: expected a list of variable names "
            'or patterns, e.g. [PAGER_TOKEN, "OPS_*"]'
        )
    for i, pattern in enumerate(value):
        if why := expand_refusal(pattern):
            raise NotifyError(f"{_where(path, node, ('expand', i))}: expand[{i}]: {why}")
    return tuple(value)


def expand_refusal(pattern: str) -> str | None:
    """Why an operator's allow-entry (notify.yaml's expand, the ceiling's notify_env) will not do."""
    if not _NAME_PATTERN.match(pattern):
        return f"{pattern!r} is not a variable name or a pattern such as OPS_*"
    if pattern_reaches_secret(pattern):
        return (
            f"{pattern!r} admits a secret wakeloop keeps (ANTHROPIC_*, WAKELOOP_CONSOLE_TOKEN, "
            "WAKELOOP_SMTP_URL: safeio/secrets.py); name the variables the targets need"
        )
    return None


def _where(path: Path, node: yaml.Node | None, keys: KeyPath) -> str:
    line = line_of(node, keys)
    return f"{path}:{line}" if line else str(path)


def expand(text: str, environ: Mapping[str, str], allowed: tuple[str, ...] = DEFAULT_EXPAND) -> str:
    """${VAR} from the environment at send time; a missing or no longer allowed variable is a
    delivery error (the load already refused it: this is the second lock on the same door)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if why := Allowed(allowed).refusal(name):
            raise LookupError(why)
        if not environ.get(name):
            raise LookupError(f"${{{name}}} is not set in the sender's environment")
        return environ[name]

    return _VAR.sub(one, text)


def referenced(text: str, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values of the ${VAR}s in `text`: each a secret to scrub wherever an error might echo it."""
    return tuple(v for name in _VAR.findall(text) if len(v := environ.get(name, "")) >= 4)
