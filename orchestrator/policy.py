"""The policy: which tools exist and how tight the box is.

Read once, validated into frozen dataclasses, passed down. Nothing deeper
re-reads YAML or the environment. Defaults are DESIGN.md §4: the safe box.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import yaml


class PolicyError(ValueError):
    """One line for the human: file, key path and, where known, the line."""


@dataclass(frozen=True)
class Budget:
    max_steps: int = 40                 # model round-trips per wake, hard stop
    max_tokens_per_wake: int = 200_000  # input + output + cache tokens per wake
    max_output_tokens: int = 4096       # per model call


@dataclass(frozen=True)
class BashTool:
    enabled: bool = True
    timeout_s: float = 120              # wall clock per call, enforced from the host
    max_output_chars: int = 20_000      # what the model sees; the rest is counted, not kept


@dataclass(frozen=True)
class WriteFileTool:
    enabled: bool = True
    max_bytes: int = 1_048_576          # per write
    allow: tuple[str, ...] = ("**",)
    # Code placed in .git/hooks or .git/config runs on the host of whoever
    # later uses the repository, so those are denied unless a policy says otherwise.
    deny: tuple[str, ...] = (".git/hooks/**", ".git/config")
    timeout_s: float = 30


@dataclass(frozen=True)
class SendMessageTool:
    enabled: bool = True
    max_per_wake: int = 5


@dataclass(frozen=True)
class Tools:
    bash: BashTool = field(default_factory=BashTool)
    write_file: WriteFileTool = field(default_factory=WriteFileTool)
    send_message: SendMessageTool = field(default_factory=SendMessageTool)


@dataclass(frozen=True)
class SandboxPolicy:
    image: str = "wakeloop-sandbox:latest"
    runtime: str = "runc"
    user: str = "auto"                  # "auto" = the workspace owner, never root
    memory: int = 512 * 2**20           # bytes; memory and memory+swap
    cpus: float = 1.0
    pids: int = 256
    tmp_size: int = 64 * 2**20          # bytes, tmpfs /tmp
    shm_size: int = 16 * 2**20          # bytes, private /dev/shm
    nofile: int = 1024                  # open files per process
    max_file_size: int = 1 * 2**30      # bytes, RLIMIT_FSIZE: one file, in /workspace too
    network: str = "none"               # none | allowlist | bridge
    allow_hosts: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Policy:
    version: int = 1
    budget: Budget = field(default_factory=Budget)
    tools: Tools = field(default_factory=Tools)
    sandbox: SandboxPolicy = field(default_factory=SandboxPolicy)
    source: str = "<defaults>"          # where it was read from, for messages


DEFAULT = Policy()

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE_FIELDS = {"memory", "tmp_size", "shm_size", "max_file_size", "max_bytes"}


def parse_size(value: Any) -> int:
    """'64m', '1g', '1GiB', '512MB' or plain bytes -> bytes (binary units)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 64m or 1GiB, got {value!r}")
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"expected a size like 64m or 1GiB, got {value!r}")
    number, unit, _ = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def load_policy(path: str | Path) -> Policy:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read policy: {exc.strerror}") from None
    return parse_policy(text, str(path))


def parse_policy(text: str, source: str) -> Policy:
    try:
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise PolicyError(f"{source}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    data = yaml.safe_load(text) if node is not None else {}
    return policy_from_mapping(data, source, node)


def policy_from_mapping(data: Any, source: str, node: yaml.Node | None = None) -> Policy:
    """Validate a mapping (from a file or inline in agent.yaml) into a Policy."""
    if data is None:
        data = {}
    policy = _build(Policy, data, (), source, node)
    return replace(policy, source=source)


def _line_of(node: yaml.Node | None, path: tuple[str, ...]) -> int | None:
    """The 1-based line of the key at `path` in the YAML node tree, if known."""
    line = None
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return line
        for key_node, value_node in node.value:
            if key_node.value == key:
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            return line
    return line


def _fail(source: str, node, path: tuple[str, ...], message: str) -> PolicyError:
    line = _line_of(node, path)
    where = f"{source}:{line}" if line else source
    key = ".".join(path) or "(top level)"
    return PolicyError(f"{where}: {key}: {message}")


def _build(cls, data: Any, path: tuple[str, ...], source: str, node):
    if not isinstance(data, dict):
        raise _fail(source, node, path, f"expected a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls) if f.name != "source"}
    values = {}
    for key, value in data.items():
        key_path = path + (str(key),)
        if key not in known:
            raise _fail(source, node, key_path, f"unknown key (known: {', '.join(sorted(known))})")
        default = getattr(cls(), key)
        values[key] = _convert(key, value, default, key_path, source, node)
    return cls(**values)


def _convert(key: str, value: Any, default: Any, path, source, node):
    if is_dataclass(default):
        return _build(type(default), value, path, source, node)
    try:
        if key in _SIZE_FIELDS:
            result = parse_size(value)
        elif key == "env":
            if not isinstance(value, dict):
                raise ValueError("expected a mapping of NAME: value")
            result = tuple(sorted((str(k), str(v)) for k, v in value.items()))
        elif isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError("expected a list of strings")
            result = tuple(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, got {value!r}")
            result = value
        elif isinstance(default, (int, float)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"expected a number, got {value!r}")
            if isinstance(default, int) and not isinstance(value, int):
                raise ValueError(f"expected a whole number, got {value!r}")
            result = value
        else:
            if not isinstance(value, str) or not value:
                raise ValueError(f"expected a non-empty string, got {value!r}")
            result = value
        if isinstance(result, (int, float)) and not isinstance(result, bool) and result <= 0 \
                and key != "version":
            raise ValueError(f"must be greater than zero, got {value!r}")
    except ValueError as exc:
        raise _fail(source, node, path, str(exc)) from None
    return result
