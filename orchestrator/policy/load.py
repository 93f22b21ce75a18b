"""Reading a policy: YAML text or a mapping into schema.py's frozen Policy.

Every key is checked by its field's declared type or by its own check below
(sizes, durations, hosts, globs, env names, approve rules), and every error
is one line, `file:line: key.path: reason`, with a hint for a misspelt key.
Pure: needs no engine (sandbox/policy_check.py asks the engine the rest).

Not here: the dataclasses and their defaults (schema.py), reading the file
and the line of each key (safeio/yamlfile.py), the path rules a glob is
matched with (paths.py).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from orchestrator.policy.schema import (
    APPROVE_TOOLS,
    CREDENTIAL_VAR,
    MAX_APPROVE_RULES,
    MIN_EXPIRES_S,
    NETWORKS,
    NOT_KEYS,
    SIZE_FIELDS,
    ApproveRule,
    Credential,
    HttpRule,
    Policy,
    PolicyError,
)
from orchestrator.records.retention import FILE_CAP, MAX_ROTATE_SIZE
from orchestrator.safeio.folder import Place
from orchestrator.safeio.secrets import is_wakeloop_own, note_credentials
from orchestrator.safeio.yamlfile import KeyPath, all_lines, check_duplicates, dotted, line_of, parse_yaml, read_config

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
Node = yaml.Node | None  # the parsed file's node tree, for the line of a key; None inline or unknown
# One key's check: (value, key path, source, node) -> the field's value; ValueError for a plain
# reason at that key, or a PolicyError already naming a deeper key (a list item, an env name).
Check = Callable[[Any, KeyPath, str, Node], Any]

# -- sizes ---------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*$", re.IGNORECASE)
_UNITS = {None: 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
MIN_MEMORY = 6 * 2**20  # bytes; the engine refuses a smaller memory limit
MIN_DISK = 16 * 2**20  # bytes; ext4's journal and metadata need a few MiB
MIN_FILES = 64  # inodes; the filesystem's own take eleven


def parse_size(value: Any) -> int:
    """'64m', '1g', '1GiB', '512MB', '100b' or plain bytes -> bytes. Units are binary
    (k = 1024) whether or not an `i` is written, as Docker's are."""
    if isinstance(value, (bool, float)):
        raise ValueError(f"expected a size like 64m or 1GiB, got {value!r}")
    if isinstance(value, int):
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"expected a size like 64m, 1g, 1GiB or plain bytes, got {value!r}")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower() if unit else None])


def load_policy(path: str | Path | Place) -> Policy:
    """A policy file; a `Place` in an agent folder is read with no link followed."""
    return parse_policy(read_config(path), str(path))


def parse_policy(text: str, source: str) -> Policy:
    try:
        data, node = parse_yaml(text)
        data = {} if node is None else data
    except RecursionError:
        raise PolicyError(f"{source}: not valid YAML: nested too deep") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise PolicyError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    check_duplicates(node, (), source)
    return policy_from_mapping(data, source, node)


def policy_from_mapping(data: Any, source: str, node: yaml.Node | None = None) -> Policy:
    """Validate a mapping (from a file or inline in agent.yaml) into a Policy.
    Pure: needs no engine. sandbox/policy_check.py does the rest before any container."""
    if data is None:
        data = {}
    policy = _build(Policy, data, (), source, node)
    _check_combinations(policy, source, node)
    sandbox = replace(policy.sandbox, ask_hosts=policy.approve.hosts)  # the proxy's, and the broker's
    return replace(policy, sandbox=sandbox, source=source, lines=tuple(all_lines(node)))


def _fail(source: str, node: Node, path: KeyPath, message: str) -> PolicyError:
    line = line_of(node, path)
    where = f"{source}:{line}" if line else source
    return PolicyError(f"{where}: {dotted(path)}: {message}")


# -- building the dataclasses ----------------------------------------------------


def _build(cls: type[T], data: Any, path: KeyPath, source: str, node: Node) -> T:
    if not isinstance(data, dict):
        raise _fail(source, node, path, f"expected a mapping of keys, got {_kind(data)}")
    known = {f.name: f for f in fields(cls) if f.name not in NOT_KEYS}
    values = {}
    for key, value in data.items():
        key_path = path + (str(key),)
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise _fail(source, node, key_path, f"unknown key ({hint}known here: {', '.join(sorted(known))})")
        default = getattr(cls(), key)
        values[key] = _convert(key, value, default, str(known[key].type), key_path, source, node)  # (a str: __future__)
    return cls(**values)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "true/false", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )


def _convert(key: str, value: Any, default: Any, type_name: str, path: KeyPath, source: str, node: Node) -> Any:
    if is_dataclass(default) and not isinstance(default, type):  # a section: its own dataclass
        return _build(type(default), value, path, source, node)
    try:
        check = _CHECKS.get(key)
        if check:
            return check(value, path, source, node)
        return _plain(value, default, type_name)
    except PolicyError:
        raise  # already names a deeper key (a list item, an env name)
    except ValueError as exc:
        raise _fail(source, node, path, str(exc)) from None


def _plain(value: Any, default: Any, type_name: str) -> Any:
    """bool, int, float and str fields, by their declared type."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {_kind(value)} {value!r}")
        if type_name == "int" and not isinstance(value, int):
            raise ValueError(f"expected a whole number, got {value!r}")
        if default == 0 and value < 0:  # a default of 0 means "off", so 0 is fine
            raise ValueError(f"must be zero (off) or more, got {value!r}")
        if default != 0 and value <= 0:
            raise ValueError(f"must be greater than zero, got {value!r}")
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {_kind(value)} {value!r}")
    return value


def _size(value: Any, path: KeyPath, source: str, node: Node) -> int:
    size = parse_size(value)
    if size <= 0:
        raise ValueError(f"must be greater than zero, got {value!r}")
    if path[-1] == "memory" and size < MIN_MEMORY:
        raise ValueError(f"{value!r} is below the engine's minimum of 6m")
    return size


def _rotate_size(value: Any, path: KeyPath, source: str, node: Node) -> int:
    size = _size(value, path, source, node)
    if size > MAX_ROTATE_SIZE:
        raise ValueError(
            f"{value!r} is over {MAX_ROTATE_SIZE // 2**20}m: retention reads no log past "
            f"{FILE_CAP // 2**20}m (a bigger file in state/ is taken for a planted one)"
        )
    return size


def _disk(value: Any, path: KeyPath, source: str, node: Node) -> int:
    if value == "none":
        return 0
    size = parse_size(value)
    if size < MIN_DISK:
        raise ValueError(f"{value!r} is below the minimum of 16m (or none: no disk of its own, no limit)")
    return size


def _files(value: Any, path: KeyPath, source: str, node: Node) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_FILES:
        raise ValueError(f"expected a whole number of files, at least {MIN_FILES}, got {value!r}")
    return value


def _positive(value: Any, path: KeyPath, source: str, node: Node) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"expected a number of seconds greater than zero, got {value!r}")
    return float(value)


def _usd_cap(value: Any, path: KeyPath, source: str, node: Node) -> float:
    """budget.max_usd_per_*: 0 is no cap, as the ledger reads it (and the ceiling refuses it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"expected USD as a number of at least 0 (0: no cap), got {value!r}")
    return float(value)


def _days(value: Any, path: KeyPath, source: str, node: Node) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected a whole number of days, at least 1, got {value!r}")
    return value


def _version(value: Any, path: KeyPath, source: str, node: Node) -> int:
    if value != 1 or isinstance(value, bool):
        raise ValueError(f"this wakeloop reads policy version 1, got {value!r}")
    return 1


_USER = re.compile(r"^(\d+):(\d+)$")


def _user(value: Any, path: KeyPath, source: str, node: Node) -> str:
    if value == "auto":
        return "auto"
    match = _USER.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f'expected "auto" or "UID:GID" such as "1000:1000", got {value!r}')
    if int(match.group(1)) == 0 or int(match.group(2)) == 0:
        raise ValueError(f"{value!r} is root; the sandbox never runs as uid or gid 0")
    return match.group(0)


def _network(value: Any, path: KeyPath, source: str, node: Node) -> str:
    if not isinstance(value, str) or value not in NETWORKS:
        raise ValueError(f"expected one of {', '.join(NETWORKS)}, got {value!r}")
    return value


_RUNTIME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _runtime(value: Any, path: KeyPath, source: str, node: Node) -> str:
    if not isinstance(value, str) or not _RUNTIME.match(value):
        raise ValueError(f"expected a runtime name such as runc or runsc, got {value!r}")
    return value


_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_HOST = re.compile(rf"^(\*\.)?({_LABEL}(?:\.{_LABEL})*)(?::(\d{{1,5}}))?$")
_IPV4 = re.compile(r"^[\d.]+$")


def parse_host(entry: str) -> tuple[bool, str, int | None]:
    """'*.example.org:8443' -> (subdomains_only, 'example.org', 8443); ValueError if malformed."""
    match = _HOST.match(entry.lower()) if isinstance(entry, str) else None
    if not match or len(match.group(2)) > 253:
        raise ValueError(f"expected host, host:port or *.domain, got {entry!r}")
    wildcard, host, port = match.groups()
    if _IPV4.match(host):
        raise ValueError(
            f"{entry!r} is an IP address; name the host (addresses are never allowed "
            "by the proxy, so neither is 169.254.169.254)"
        )
    if wildcard and "." not in host:
        raise ValueError(f"{entry!r} would allow a whole top-level domain")
    if port is not None and not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port} in {entry!r} is not between 1 and 65535")
    return bool(wildcard), host, int(port) if port else None


def _allow_hosts(value: Any, path: KeyPath, source: str, node: Node) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of hosts, got {_kind(value)}")
    for i, entry in enumerate(value):
        try:
            parse_host(entry)
        except ValueError as exc:
            raise _fail(source, node, path + (i,), str(exc)) from None
    return tuple(entry.lower() for entry in value)


def _globs(value: Any, path: KeyPath, source: str, node: Node) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of globs such as ['**'], got {_kind(value)}")
    for i, glob in enumerate(value):
        problem = None
        if not isinstance(glob, str) or not glob.strip():
            problem = f"expected a non-empty glob string, got {glob!r}"
        elif glob.startswith("/"):
            problem = f"{glob!r} is absolute; globs are relative to /workspace"
        elif ".." in glob.split("/"):
            problem = f"{glob!r} contains '..'; globs match normalised paths, which never do"
        elif any(ord(c) < 32 for c in glob):
            problem = f"{glob!r} contains a control character"
        if problem:
            raise _fail(source, node, path + (i,), problem)
    return tuple(value)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by wakeloop itself (allowlist proxy) or never to be handed to a sandbox.
_ENV_RESERVED = re.compile(r"^(HTTPS?_PROXY|NO_PROXY|ALL_PROXY|ANTHROPIC_.*|WAKELOOP_.*)$", re.IGNORECASE)
# Names that change how a program loads or starts: the dynamic loader and glibc
# (preloads, library paths, iconv modules, tunables, resolver config), shell
# startup and parsing, interpreter startup and module paths. The harness's own
# programs never see the policy's env (programs.py), so these would only ever
# reach the agent's command; refused anyway, so that no policy can make a
# program of the image run code it did not ask for. A command that wants one
# sets it itself (`PYTHONPATH=lib python3 x.py`). TMPDIR, PATH and HOME stay
# allowed: they choose where things are, not what code starts.
_ENV_LOADER = re.compile(
    r"^(LD_.*|GCONV_PATH|GLIBC_TUNABLES|LOCPATH|NLSPATH|HOSTALIASES|LOCALDOMAIN|RES_OPTIONS"
    r"|BASH_ENV|ENV|BASH_FUNC_.*|SHELLOPTS|BASHOPTS|IFS|PS4|PROMPT_COMMAND"
    r"|PYTHON.+|PERL5LIB|PERLLIB|PERL5OPT|PERL5DB|RUBYOPT|RUBYLIB|NODE_OPTIONS|JAVA_TOOL_OPTIONS)$"
)


def _env(value: Any, path: KeyPath, source: str, node: Node) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of NAME: value, got {_kind(value)}")
    out = []
    for name, val in value.items():
        where = path + (str(name),)
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise _fail(source, node, where, "not a valid environment variable name")
        if _ENV_RESERVED.match(name):
            raise _fail(
                source,
                node,
                where,
                "reserved: wakeloop sets the proxy variables itself, "
                "and ANTHROPIC_*/WAKELOOP_* never enter the sandbox",
            )
        if _ENV_LOADER.match(name):
            raise _fail(
                source,
                node,
                where,
                "refused: it changes how programs load or start (loader, "
                "shell or interpreter startup); set it in the command instead",
            )
        if isinstance(val, (dict, list)) or val is None:
            raise _fail(source, node, where, f"expected a plain value, got {_kind(val)}")
        text = str(val).lower() if isinstance(val, bool) else str(val)
        if "\0" in text:
            raise _fail(source, node, where, "the value contains a NUL byte")
        out.append((name, text))
    return tuple(sorted(out))


def _pool(value: Any, path: KeyPath, source: str, node: Node) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_POOL:
        raise ValueError(f"expected a whole number from 0 (off) to {MAX_POOL}, got {value!r}")
    return value


MAX_POOL = 8  # idle containers per agent; each holds a few MiB and a pids slot

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: Any) -> float:
    """'24h', '90m', '7d', '30s' or plain seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"expected a duration such as 24h, 90m, 7d or seconds, got {value!r}")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def _expires(value: Any, path: KeyPath, source: str, node: Node) -> float:
    seconds = parse_duration(value)
    if seconds < MIN_EXPIRES_S:
        raise ValueError(f"{value!r} is under a minute; a person cannot answer in time (use 1h or more)")
    return seconds


def _approve_rules(value: Any, path: KeyPath, source: str, node: Node) -> tuple[ApproveRule, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of rules such as - tool: bash, match: ['git push*'], got {_kind(value)}")
    if len(value) > MAX_APPROVE_RULES:
        raise _fail(source, node, path + (MAX_APPROVE_RULES,), f"{len(value)} rules; at most {MAX_APPROVE_RULES}")
    return tuple(_approve_rule(rule, path + (i,), source, node) for i, rule in enumerate(value))


def _approve_rule(rule: Any, path: KeyPath, source: str, node: Node) -> ApproveRule:
    if not isinstance(rule, dict):
        raise _fail(
            source, node, path, f"expected a mapping such as tool: bash, match: ['git push*'], got {_kind(rule)}"
        )
    if "network_host" in rule:
        return _network_rule(rule, path, source, node)
    tool = rule.get("tool")
    if tool not in APPROVE_TOOLS:
        raise _fail(
            source,
            node,
            path + ("tool",) if "tool" in rule else path,
            f"expected tool: {' or tool: '.join(APPROVE_TOOLS)}, got {tool!r}",
        )
    key = "match" if tool == "bash" else "paths"
    unknown = sorted(set(map(str, rule)) - {"tool", key})
    if unknown:
        raise _fail(
            source, node, path + (unknown[0],), f"unknown key for tool: {tool} (it takes `{key}`: a list of globs)"
        )
    globs = rule.get(key)
    if not isinstance(globs, list) or not globs:
        raise _fail(
            source,
            node,
            path + (key,) if key in rule else path,
            f"expected `{key}:` with a list of globs, e.g. {key}: "
            + ("['git push*']" if tool == "bash" else "['deploy/**']"),
        )
    if tool == "write_file":
        return ApproveRule(tool, paths=_globs(globs, path + (key,), source, node))
    for i, glob in enumerate(globs):
        if not isinstance(glob, str) or not glob.strip() or "\0" in glob:
            raise _fail(source, node, path + (key, i), f"expected a non-empty glob string, got {glob!r}")
    return ApproveRule(tool, match=tuple(globs))


_HOST_GLOB = re.compile(r"^[a-z0-9*?.-]+$")  # a host name, lower-case, with fnmatch's * and ?


def _network_rule(rule: dict[str, Any], path: KeyPath, source: str, node: Node) -> ApproveRule:
    unknown = sorted(set(map(str, rule)) - {"network_host"})
    if unknown:
        raise _fail(source, node, path + (unknown[0],), "a network_host rule takes no other key")
    glob = rule["network_host"]
    if not isinstance(glob, str) or not _HOST_GLOB.match(glob):
        raise _fail(
            source,
            node,
            path + ("network_host",),
            f"expected a glob over host names, lower-case, no port (e.g. '*' or '*.github.com'), got {glob!r}",
        )
    return ApproveRule(network_host=glob)


# -- egress: credentials bound to hosts, method and path rules, the byte budget ----------

_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP header name (a token)
_HTTP_RULE = re.compile(r"^(\*|[A-Z]+) (/\S*)$")  # "GET /repos/**"


def _exact_host(value: Any, path: KeyPath, source: str, node: Node) -> str:
    try:
        wildcard, host, port = parse_host(value)
    except ValueError as exc:
        raise _fail(source, node, path, str(exc)) from None
    if wildcard or port:
        raise _fail(source, node, path, f"name one host, without a port or *. ({value!r}): its HTTPS is intercepted")
    return host


def _entries(value: Any, path: KeyPath, source: str, node: Node, keys: set[str], example: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of entries such as {example}, got {_kind(value)}")
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or "host" not in entry:
            raise _fail(source, node, path + (i,), f"expected a mapping such as {example}")
        unknown = sorted(set(map(str, entry)) - keys)
        if unknown:
            raise _fail(source, node, path + (i, unknown[0]), f"unknown key (known here: {', '.join(sorted(keys))})")
    return value


def _credentials(value: Any, path: KeyPath, source: str, node: Node) -> tuple[Credential, ...]:
    keys = {"host", "header", "value", "placeholder_env"}
    out = []
    for i, entry in enumerate(_entries(value, path, source, node, keys, "{host: api.github.com, value: ...}")):
        where = path + (i,)
        host = _exact_host(entry["host"], where + ("host",), source, node)
        header = entry.get("header", "Authorization")
        if not isinstance(header, str) or not _HEADER.match(header):
            raise _fail(source, node, where + ("header",), f"expected an HTTP header name, got {header!r}")
        text = entry.get("value")
        if not isinstance(text, str) or len(CREDENTIAL_VAR.findall(text)) != 1 or "\n" in text or "\r" in text:
            raise _fail(
                source, node, where + ("value",), 'expected one line naming one variable, e.g. "Bearer ${GITHUB_TOKEN}"'
            )
        var = CREDENTIAL_VAR.findall(text)[0]
        if is_wakeloop_own(var):
            raise _fail(source, node, where + ("value",), f"{var} is wakeloop's own secret, never a credential")
        note_credentials((var,))  # its value is scrubbed from what this process writes (safeio/secrets.py)
        placeholder = entry.get("placeholder_env", "")
        if placeholder and (not isinstance(placeholder, str) or not _ENV_NAME.match(placeholder)):
            raise _fail(source, node, where + ("placeholder_env",), "not a valid environment variable name")
        if placeholder and (_ENV_RESERVED.match(placeholder) or _ENV_LOADER.match(placeholder)):
            raise _fail(source, node, where + ("placeholder_env",), "reserved (see sandbox.env)")
        out.append(Credential(host=host, header=header, value=text, placeholder_env=placeholder))
    return tuple(out)


def _http(value: Any, path: KeyPath, source: str, node: Node) -> tuple[HttpRule, ...]:
    out = []
    for i, entry in enumerate(_entries(value, path, source, node, {"host", "allow"}, "{host: h, allow: ['GET /**']}")):
        where = path + (i,)
        host = _exact_host(entry["host"], where + ("host",), source, node)
        rules = entry.get("allow")
        if not isinstance(rules, list) or not rules:
            raise _fail(source, node, where + ("allow",), "expected a list of rules such as ['GET /repos/**']")
        for j, rule in enumerate(rules):
            if not isinstance(rule, str) or not _HTTP_RULE.match(rule):
                raise _fail(
                    source, node, where + ("allow", j), f"expected 'METHOD /path/glob' (e.g. 'GET /**'), got {rule!r}"
                )
        line = line_of(node, where)
        out.append(HttpRule(host=host, allow=tuple(rules), source=f"{source}:{line}" if line else source))
    return tuple(out)


def _egress_budget(value: Any, path: KeyPath, source: str, node: Node) -> int:
    return 0 if value == 0 else _size(value, path, source, node)


_CHECKS: dict[str, Check] = {
    **{name: _size for name in SIZE_FIELDS},  # disk's own check comes after, and wins
    "pool": _pool,
    "disk": _disk,
    "files": _files,
    "rotate_size": _rotate_size,
    "version": _version,
    "user": _user,
    "network": _network,
    "runtime": _runtime,
    "allow_hosts": _allow_hosts,
    "allow": _globs,
    "deny": _globs,
    "env": _env,
    "retention_days": _days,
    "max_wake_s": _positive,
    **{name: _usd_cap for name in ("max_usd_per_wake", "max_usd_per_day", "max_usd_per_month")},
    "expires": _expires,
    "rules": _approve_rules,
    "protect": _globs,
    "keep_undo_days": _days,
    "credentials": _credentials,
    "http": _http,
    "max_egress_bytes_per_wake": _egress_budget,
}


def _check_combinations(policy: Policy, source: str, node: Node) -> None:
    box = policy.sandbox
    if box.network == "allowlist" and not box.allow_hosts:
        raise _fail(
            source,
            node,
            ("sandbox", "network"),
            "allowlist needs at least one entry in sandbox.allow_hosts (or use network: none)",
        )
    hosts: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("credentials", tuple(c.host for c in box.credentials)),
        ("http", tuple(r.host for r in box.http)),
    )
    for key, entries in hosts:
        for i, host in enumerate(entries):
            if box.network != "allowlist":
                raise _fail(
                    source, node, ("sandbox", key), f"only used with network: allowlist (network is {box.network})"
                )
            if host not in box.allow_hosts:
                raise _fail(source, node, ("sandbox", key, i, "host"), f"{host} is not in sandbox.allow_hosts")
    names = [c.placeholder_env for c in box.credentials if c.placeholder_env]
    clash = next((n for n in names if names.count(n) > 1 or n in dict(box.env)), None)
    if clash:
        raise _fail(source, node, ("sandbox", "credentials"), f"{clash} is named twice (placeholder_env, env)")
    for i, rule in enumerate(policy.approve.rules):
        if rule.network_host and box.network != "allowlist":
            raise _fail(
                source,
                node,
                ("approve", "rules", i, "network_host"),
                f"only used with sandbox.network: allowlist (network is {box.network}): "
                "without the proxy no request reaches a host to ask about",
            )
    if box.network != "allowlist" and box.allow_hosts:
        raise _fail(
            source, node, ("sandbox", "allow_hosts"), f"only used with network: allowlist (network is {box.network})"
        )
