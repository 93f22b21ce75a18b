"""A config file read as untrusted YAML, with the line of every key.

Every YAML file wakeloop reads (a policy, agent.yaml, the ceiling,
ROOT/budget.yaml, ROOT/notify.yaml) comes through here: a regular file only,
capped, UTF-8 (`read_config`); no aliases, no tags beyond SafeLoader's
(`parse_yaml`); and the node tree kept, so an error can name `file:line`
(`line_of`) and two equal keys are refused (`check_duplicates`). Under the
broker an orchestrator taken over can plant any file, so nothing here trusts
the file's type, size or shape.

At the bottom (records/) so that policy/ and notify/ both stand on it.

Not here: what the keys mean (policy/load.py for a policy, policy/agent.py,
policy/ceiling.py, notify/config.py), the walk of an agent folder
(folder.py).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import ConfigError
from orchestrator.safeio.folder import Folder, Place, Refused, TooBig

MAX_CONFIG_BYTES = 1 * 2**20  # agent.yaml or a policy file; real ones are a few KiB

# A key path into the YAML: mapping keys and list indexes, from the top.
KeyPath = tuple[str | int, ...]


class ConfigFileError(ConfigError):
    """One line for the human: file, key path and, where known, the line."""


# libyaml's parser and composer (in PyYAML's wheels) where present: 20-50x faster than the
# pure-Python ones (a 2 KiB policy: 1 ms against 20 ms on a loaded 2-core host), which the broker
# pays on every request, as it reads each agent's policy afresh; libyaml caps nesting at 1000 levels.
_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


def read_config(path: str | Path | Place, what: str = "policy") -> str:
    """A config file's text, read as untrusted input (under the broker an
    orchestrator taken over can plant any file): a regular file only, never
    opened if it is a FIFO or device (the first open is O_PATH), at most
    MAX_CONFIG_BYTES, UTF-8. ConfigFileError otherwise, naming the file.
    A `Place` (a file of an agent folder: agent.yaml, a policy inside it) is
    read through safeio/folder.py: no link followed on the way or at the end."""
    if isinstance(path, Place):
        return _read_inside(path, what)
    path = Path(path)
    try:
        probe = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        st = os.fstat(probe)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigFileError(f"{path}: not a regular file; a {what} is a YAML file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigFileError(f"{path}: {st.st_size:,} bytes; a {what} is at most {MAX_CONFIG_BYTES:,}")
        # Reopened through the O_PATH descriptor: the very file just checked.
        fd = os.open(f"/proc/self/fd/{probe}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read {what}: {exc.strerror}") from None
    finally:
        os.close(probe)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)  # a file that grew since the fstat is cut here
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigFileError(f"{path}: over {MAX_CONFIG_BYTES:,} bytes; a {what} is at most that")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigFileError(f"{path}: not UTF-8 text") from None


def _read_inside(path: Place, what: str) -> str:
    try:
        data = Folder(path.folder).read_bytes(path.rel, MAX_CONFIG_BYTES)
    except TooBig as exc:
        raise ConfigFileError(f"{path}: {exc.size:,} bytes; a {what} is at most {MAX_CONFIG_BYTES:,}") from None
    except Refused as exc:
        raise ConfigFileError(
            f"{path}: {exc.strerror}; a {what} is a regular YAML file in the agent folder, read without following links"
        ) from None
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigFileError(f"{path}: not UTF-8 text") from None


def parse_yaml(text: str) -> tuple[Any, yaml.Node | None]:
    """(data, node tree) of untrusted YAML text: no aliases, no tags beyond SafeLoader's. Scanned
    for aliases, then composed once and the data made from that node tree (not parsed again to
    load it). yaml.YAMLError or RecursionError (nesting thousands deep) for the caller to word."""
    refuse_aliases(text)
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        return (loader.construct_document(node) if node is not None else None), node
    finally:
        loader.dispose()


def refuse_aliases(text: str) -> None:
    """A config never needs an alias (`*name`), and nested ones expand exponentially (the
    "billion laughs" alias bomb): refused from the parser's events, before any node is made."""
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.AliasEvent):
            mark = event.start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed here", mark)  # type: ignore[arg-type]


# -- the node tree: lines and duplicate keys --------------------------------------


def line_of(node: yaml.Node | None, path: KeyPath) -> int | None:
    """The 1-based line of the key (or list item) at `path`, if known."""
    line = None
    for key in path:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == str(key):
                    line, node = key_node.start_mark.line + 1, value_node
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def all_lines(node: yaml.Node | None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    """(dotted key path, line) of every mapping key under `node`, depth first."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key_path = path + (str(key_node.value),)
            yield ".".join(key_path), key_node.start_mark.line + 1
            yield from all_lines(value_node, key_path)


def check_duplicates(node: yaml.Node | None, path: KeyPath, source: str) -> None:
    """YAML keeps the last of two equal keys without a word; a config file must not."""
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[str, int] = {}
    for key_node, value_node in node.value:
        key = key_node.value
        if key in seen:
            raise ConfigFileError(
                f"{source}:{key_node.start_mark.line + 1}: {dotted(path + (key,))}: "
                f"duplicate key (first on line {seen[key]})"
            )
        seen[key] = key_node.start_mark.line + 1
        check_duplicates(value_node, path + (key,), source)


def dotted(path: KeyPath) -> str:
    """('sandbox', 'allow_hosts', 0) -> 'sandbox.allow_hosts[0]'."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "(top level)"
