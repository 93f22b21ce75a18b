"""The broker's ceiling: the most any agent's policy may ask of the host.

Under compose the orchestrator mounts agents/ read-write (it writes state/),
so an orchestrator that is itself taken over can edit any agent.yaml, and
the broker loads the policy from there. The ceiling is read once, at the
broker's start, from a file the orchestrator cannot write (compose mounts
policies/ read-only into it), and every request whose agent's policy asks
for more is refused before any container is made: a policy cannot then buy
a bigger box, another runtime or image, or a network the user did not allow.

    runtimes: [runc, runsc]            # sandbox.runtime must be one of these
    images: [wakeloop-sandbox:latest]  # sandbox.image must be one of these
    networks: [none, allowlist]        # sandbox.network must be one of these
    users: {min: 1000, max: 60000}     # sandbox.user's uid and gid ("auto" as resolved)
    env_names: [LANG, "LC_*"]          # names sandbox.env may set (fnmatch patterns)
    hosts: [pypi.org, "*.pythonhosted.org"]  # what sandbox.allow_hosts may name
    max: {memory: 2g, cpus: 2, pids: 1024, timeout_s: 600, ...,
          max_wake_bytes: 16m, max_agent_bytes: 1g, retention_days: 90,   # transcript.*
          rotate_size: 64m, keep_size: 1g, keep_days: 3650,  # state.*: state/'s disk
          keep_undo_days: 365,                 # workspace.*: how long a wake stays undoable
          max_output_chars: 1000000, max_chars: 100000, ...,  # tools.*, budget.*
          calls: 16, calls_per_agent: 4, agents: 32,   # the broker's own capacity
          fleet_usd_per_day: 500, fleet_usd_per_month: 5000,   # ROOT/budget.yaml's caps
          disk_overcommit: 10}                 # the disks' sizes: at most 10x their filesystem
    notify_env: [PAGER_TOKEN, "OPS_*"] # more ${VAR}s notify targets may read (never a secret)
    credential_env: [GITHUB_TOKEN]     # ${VAR}s sandbox.credentials may name; absent or []: none
    notify_commands: false             # may an agent.yaml name a `command:` channel

The notify keys are read by whoever loads agents (the orchestrator finds
this file through WAKELOOP_CEILING; notify/config.py applies them): an
agent.yaml is not the operator's, so what its notify entries may do is
said here or in ROOT/notify.yaml, never in agent.yaml.

`max` bounds every number a policy can ask for, by its key's last name:
NUMBERS is found by walking the policy's dataclasses (every int and float
field; schema.py), so a number added to the schema is a key here at once,
and tests/test_ceiling.py fails until policies/ceiling.yaml bounds it.
Every key is optional; one left out is not limited, except the broker's
capacity (max.calls, max.calls_per_agent, max.agents, max.disk_overcommit),
which has defaults (server.py; sandbox/disks/disk.py's OVERCOMMIT). With max.disk
set, `sandbox.disk: none` (no limit) is over it; with max.max_usd_per_wake,
max_usd_per_day or max_usd_per_month set, 0 (no cap) is over it.
max.fleet_usd_per_day and fleet_usd_per_month bound ROOT/budget.yaml (all
agents together; policy/fleetbudget.py reads it), and are the fleet's caps
where there is no such file.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from orchestrator.notify.config import expand_refusal
from orchestrator.policy.load import parse_host, parse_size
from orchestrator.policy.schema import NETWORKS, SIZE_FIELDS, Policy, PolicyError
from orchestrator.safeio.yamlfile import KeyPath, line_of

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

NOT_A_LIMIT = ("version",)  # numbers of the schema that ask the host for nothing


def numbers(policy: DataclassInstance, prefix: str = "") -> dict[str, float]:
    """Every number a policy asks for, by dotted key (`tools.bash.max_output_chars`):
    each int or float field of its dataclasses, walked, bools and NOT_A_LIMIT left out."""
    found: dict[str, float] = {}
    for f in fields(policy):
        value = getattr(policy, f.name)
        if is_dataclass(value) and not isinstance(value, type):
            found |= numbers(value, f"{prefix}{f.name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and f.name not in NOT_A_LIMIT:
            found[prefix + f.name] = value
    return found


# The keys of `max`: a policy number's last name (timeout_s bounds both tools'), and the
# broker's own capacity. Sizes are read as sizes (64m); the rest as plain numbers.
NUMBERS = tuple(
    dict.fromkeys(
        path.rsplit(".", 1)[1]
        for path in sorted(  # the box's first, as people look for them
            numbers(Policy()), key=lambda p: not p.startswith("sandbox.")
        )
    )
)
SIZES = tuple(name for name in NUMBERS if name in SIZE_FIELDS)
ZERO_IS_NO_LIMIT = (
    "disk",
    "max_usd_per_wake",
    "max_usd_per_day",
    "max_usd_per_month",
    "max_egress_bytes_per_wake",
)  # 0 there: "no limit"
LISTS = ("runtimes", "images", "networks")
CAPACITY = ("calls", "calls_per_agent", "agents", "disk_overcommit")  # the broker's, not a policy's:
# server.py and disk.py enforce them
FLEET = ("fleet_usd_per_day", "fleet_usd_per_month")  # ROOT/budget.yaml's, all agents together (fleetbudget.py)
NOTIFY = ("notify_env", "notify_commands")  # notify/config.py's, not the broker's
KEYS = (*LISTS, "users", "env_names", "hosts", "max", *NOTIFY, "credential_env")
_ENV_PATTERN = re.compile(r"^[A-Za-z_*?][A-Za-z0-9_*?]*$")
_UID_GID = re.compile(r"^(\d+):(\d+)$")


@dataclass(frozen=True)
class Ceiling:
    runtimes: tuple[str, ...] | None = None  # None: any
    images: tuple[str, ...] | None = None
    networks: tuple[str, ...] | None = None
    max: dict[str, float] = field(default_factory=dict)
    users: tuple[int, int | None] | None = None  # (min, max) uid and gid; never 0 whatever it says
    env_names: tuple[str, ...] | None = None  # fnmatch patterns a sandbox.env name must match
    hosts: tuple[str, ...] | None = None  # allow_hosts entries a policy may name
    notify_env: tuple[str, ...] = ()  # ${VAR} patterns notify targets may read beyond the defaults
    notify_commands: bool = False  # an agent.yaml may name a `command:` channel
    credential_env: tuple[str, ...] = ()  # variables sandbox.credentials may name (fnmatch patterns)
    source: str = "<none>"

    def refusal(self, policy: Policy, user: str | None = None) -> str | None:
        """Why the broker will not serve this policy, one line naming the policy's
        file, line and key, or None. `user` is sandbox.user as resolved for the
        workspace ("auto" is its owner); without it only an explicit UID:GID is bounded."""
        box = policy.sandbox
        over = (
            self._user_refusal(policy, user)
            or self._env_refusal(policy)
            or self._host_refusal(policy)
            or self._credential_refusal(policy)
        )
        if over:
            return over
        for key, chosen in (("runtimes", box.runtime), ("images", box.image), ("networks", box.network)):
            allowed = getattr(self, key)
            if allowed is not None and chosen not in allowed:
                return self._say(
                    policy, f"sandbox.{key[:-1]}", f"{chosen} is not one the broker allows: {', '.join(allowed)}"
                )
        for path, value in numbers(policy).items():
            name = path.rsplit(".", 1)[1]
            limit = self.max.get(name)
            if limit is None:
                continue
            unit = " bytes" if name in SIZES else ""
            if name in ZERO_IS_NO_LIMIT and value == 0:
                what = "none (a folder with no limit)" if name == "disk" else "0 (no cap)"
                return self._say(policy, path, f"{what} is over the broker's ceiling of {limit:,}{unit}")
            if value > limit:
                return self._say(policy, path, f"{value:,}{unit} is over the broker's ceiling of {limit:,}{unit}")
        return None

    def _user_refusal(self, policy: Policy, user: str | None) -> str | None:
        setting = policy.sandbox.user
        resolved = str(user if user is not None else setting)
        match = _UID_GID.match(resolved) or (re.match(r"^(\d+)()$", resolved))
        if match is None:
            return (
                None
                if resolved == "auto"
                else self._say(policy, "sandbox.user", f"{resolved!r} is not UID:GID, so the ceiling cannot bound it")
            )
        ids = [int(v) for v in match.groups() if v]
        low, high = self.users or (1, None)
        for n in ids:
            if n == 0 or n < low or (high is not None and n > high):
                auto = f" (auto: the workspace owner is {resolved})" if setting == "auto" else ""
                return self._say(
                    policy,
                    "sandbox.user",
                    f"{setting}{auto} is outside the uids and gids "
                    f"the broker allows: {low} to {high if high is not None else 'any'}",
                )
        return None

    def _env_refusal(self, policy: Policy) -> str | None:
        if self.env_names is None:
            return None
        for name, _ in policy.sandbox.env:
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in self.env_names):
                return self._say(
                    policy,
                    f"sandbox.env.{name}",
                    f"{name} is not a name the broker lets a policy set: {', '.join(self.env_names)}",
                )
        return None

    def _host_refusal(self, policy: Policy) -> str | None:
        if self.hosts is None:
            return None
        for entry in policy.sandbox.allow_hosts:
            if not any(host_covers(allowed, entry) for allowed in self.hosts):
                return self._say(
                    policy,
                    "sandbox.allow_hosts",
                    f"{entry} is not a host the broker allows: {', '.join(self.hosts) or 'none'}",
                )
        return None

    def _credential_refusal(self, policy: Policy) -> str | None:
        for i, cred in enumerate(policy.sandbox.credentials):
            if not any(fnmatch.fnmatchcase(cred.var, pattern) for pattern in self.credential_env):
                return self._say(
                    policy,
                    f"sandbox.credentials[{i}].value",
                    f"{cred.var} is not a variable the broker lets a policy name: "
                    f"{', '.join(self.credential_env) or 'none (credential_env)'}",
                )
        return None

    def _say(self, policy: Policy, path: str, what: str) -> str:
        return f"{policy.where(path)}: {path}: {what} (ceiling {self.source})"


def host_covers(allowed: str, entry: str) -> bool:
    """Whether the ceiling's `allowed` admits a policy's allow_hosts `entry`:
    the same entry, or `*.d` for a host under d (not d itself, nor `*.d`
    unless the ceiling says `*.d`). The port, if any, must be the same."""
    try:
        wild_a, host_a, port_a = parse_host(allowed)
        wild_e, host_e, port_e = parse_host(entry)
    except ValueError:
        return False
    if port_a != port_e:
        return False
    if not wild_a:
        return not wild_e and host_a == host_e
    return host_e.endswith("." + host_a) or (wild_e and host_e == host_a)


Fail = Callable[[KeyPath, str], PolicyError]  # a key's one-line error: file:line: key: reason


def load_ceiling(path: str | Path) -> Ceiling:
    """Read and check a ceiling file; PolicyError names the file, the line and the key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text) or {}
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read the broker's ceiling: {exc.strerror}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PolicyError(f"{path}: not YAML text: {getattr(exc, 'problem', None) or exc}") from None

    def fail(keys: KeyPath, message: str) -> PolicyError:
        line = line_of(node, keys)
        where = ".".join(k for k in keys if isinstance(k, str)) or "(top level)"
        return PolicyError(f"{path}{f':{line}' if line else ''}: {where}: {message}")

    if not isinstance(data, dict):
        raise fail((), f"a ceiling is a mapping of {', '.join(KEYS)}")
    for key, value in data.items():
        if key not in KEYS:
            raise fail((key,), f"unknown key; a ceiling has {', '.join(KEYS)}")
        if key in LISTS and (
            not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value)
        ):
            raise fail((key,), f"expected a non-empty list of names, got {value!r}")
        if key in ("env_names", "hosts", "credential_env") and (
            not isinstance(value, list) or not all(isinstance(v, str) for v in value)
        ):
            raise fail((key,), f"expected a list (empty: none allowed), got {value!r}")
    for i, pattern in enumerate([*(data.get("env_names") or ()), *(data.get("credential_env") or ())]):
        if not _ENV_PATTERN.match(pattern):
            raise fail(("env_names", i), f"{pattern!r} is not a variable name or a pattern such as LC_*")
    notify_env = data.get("notify_env") or []
    if not isinstance(notify_env, list) or not all(isinstance(v, str) for v in notify_env):
        raise fail(("notify_env",), f"expected a list of variable names or patterns, got {notify_env!r}")
    for i, pattern in enumerate(notify_env):
        if why := expand_refusal(pattern):
            raise fail(("notify_env", i), why)
    if not isinstance(data.get("notify_commands", False), bool):
        raise fail(("notify_commands",), f"expected true or false, got {data['notify_commands']!r}")
    for i, entry in enumerate(data.get("hosts") or ()):
        try:
            parse_host(entry)
        except ValueError as exc:
            raise fail(("hosts", i), str(exc)) from None
    users = _users(data.get("users"), fail)
    bad = set(data.get("networks", ())) - set(NETWORKS)
    if bad:
        raise fail(("networks",), f"{sorted(bad)[0]} is not one of {', '.join(NETWORKS)}")
    limits = _limits(data.get("max") or {}, fail)
    return Ceiling(
        **{key: tuple(data[key]) for key in LISTS + ("env_names", "hosts") if key in data},
        users=users,
        max=limits,
        notify_env=tuple(notify_env),
        notify_commands=data.get("notify_commands", False),
        credential_env=tuple(data.get("credential_env") or ()),
        source=str(path),
    )


def _users(users: object, fail: Fail) -> tuple[int, int | None] | None:
    """`users: {min, max}`: the uids a box may run as (never root), as (min, max)."""
    if users is None:
        return None
    if (
        not isinstance(users, dict)
        or set(users) - {"min", "max"}
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in users.values())
        or users.get("min", 1) > users.get("max", users.get("min", 1))
    ):
        raise fail(
            ("users",),
            f"expected {{min: 1000, max: 60000}}, whole numbers from 1 (root is "
            f"never allowed), min at most max; got {users!r}",
        )
    return (users.get("min", 1), users.get("max"))


def _limits(maxima: object, fail: Fail) -> dict[str, float]:
    """`max:`: each bound by its name, sizes in bytes."""
    if not isinstance(maxima, dict):
        raise fail(("max",), "expected a mapping such as {memory: 2g, pids: 1024}")
    limits: dict[str, float] = {}
    bounded = NUMBERS + CAPACITY + FLEET
    for name, limit in maxima.items():
        if name not in bounded:
            raise fail(("max", name), f"unknown key; max bounds {', '.join(bounded)}")
        try:
            limits[name] = parse_size(limit) if name in SIZES else _number(limit)
            if name == "disk_overcommit" and limits[name] < 1:  # 1: no overcommit, thick disks
                raise ValueError(f"expected a number of at least 1 (times the filesystem), got {limit!r}")
            elif name in CAPACITY[:3] and (not isinstance(limit, int) or limit < 1):
                raise ValueError(f"expected a whole number of at least 1, got {limit!r}")
        except ValueError as exc:
            raise fail(("max", name), str(exc)) from None
    return limits


def is_ceiling(path: str | Path) -> bool:
    """Whether a file reads as a ceiling rather than a policy (for `policy check`)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # the policy loader says why
    return isinstance(data, dict) and bool(data) and set(data) <= set(KEYS)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"expected a number of at least 0, got {value!r}")
    return value
