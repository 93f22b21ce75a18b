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
    max: {memory: 2g, cpus: 2, pids: 1024, timeout_s: 600, ...}

Every key is optional; one left out is not limited.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.policy.schema import NETWORKS, Policy, PolicyError, line_of, parse_size

# The sandbox settings a ceiling bounds from above, and how to read their limit.
SIZES = ("memory", "tmp_size", "shm_size", "max_file_size")
COUNTS = ("cpus", "pids", "nofile", "pool", "timeout_s")
TIMED_TOOLS = ("bash", "write_file")          # whose timeout_s the broker takes from the policy
LISTS = ("runtimes", "images", "networks")


@dataclass(frozen=True)
class Ceiling:
    runtimes: tuple[str, ...] | None = None     # None: any
    images: tuple[str, ...] | None = None
    networks: tuple[str, ...] | None = None
    max: dict[str, float] = field(default_factory=dict)
    source: str = "<none>"

    def refusal(self, policy: Policy) -> str | None:
        """Why the broker will not serve this policy, one line naming the policy's
        file, line and key, or None."""
        box = policy.sandbox
        for key, value in (("runtimes", box.runtime), ("images", box.image), ("networks", box.network)):
            allowed = getattr(self, key)
            if allowed is not None and value not in allowed:
                return self._say(policy, f"sandbox.{key[:-1]}",
                                 f"{value} is not one the broker allows: {', '.join(allowed)}")
        asked = {f"sandbox.{name}": getattr(box, name) for name in SIZES + COUNTS if name != "timeout_s"}
        asked |= {f"tools.{tool}.timeout_s": getattr(policy.tools, tool).timeout_s for tool in TIMED_TOOLS}
        for path, value in asked.items():
            name = path.rsplit(".", 1)[1]
            limit = self.max.get(name)
            if limit is not None and value > limit:
                unit = " bytes" if name in SIZES else ""
                return self._say(policy, path, f"{value:,}{unit} is over the broker's ceiling of {limit:,}{unit}")
        return None

    def _say(self, policy: Policy, path: str, what: str) -> str:
        return f"{policy.where(path)}: {path}: {what} (ceiling {self.source})"


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

    def fail(keys: tuple, message: str) -> PolicyError:
        line = line_of(node, keys)
        return PolicyError(f"{path}{f':{line}' if line else ''}: {'.'.join(keys) or '(top level)'}: {message}")

    if not isinstance(data, dict):
        raise fail((), f"a ceiling is a mapping of {', '.join(LISTS)} and max")
    for key, value in data.items():
        if key not in (*LISTS, "max"):
            raise fail((key,), f"unknown key; a ceiling has {', '.join(LISTS)} and max")
        if key in LISTS and (not isinstance(value, list) or not value
                             or not all(isinstance(v, str) and v for v in value)):
            raise fail((key,), f"expected a non-empty list of names, got {value!r}")
    bad = set(data.get("networks", ())) - set(NETWORKS)
    if bad:
        raise fail(("networks",), f"{sorted(bad)[0]} is not one of {', '.join(NETWORKS)}")
    maxima = data.get("max") or {}
    if not isinstance(maxima, dict):
        raise fail(("max",), "expected a mapping such as {memory: 2g, pids: 1024}")
    limits = {}
    for name, limit in maxima.items():
        if name not in SIZES + COUNTS:
            raise fail(("max", name), f"unknown key; max bounds {', '.join(SIZES + COUNTS)}")
        try:
            limits[name] = parse_size(limit) if name in SIZES else _number(limit)
        except ValueError as exc:
            raise fail(("max", name), str(exc)) from None
    return Ceiling(**{key: tuple(data[key]) for key in LISTS if key in data},
                   max=limits, source=str(path))


def is_ceiling(path: str | Path) -> bool:
    """Whether a file reads as a ceiling rather than a policy (for `policy check`)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False   # the policy loader says why
    return isinstance(data, dict) and bool(data) and set(data) <= {*LISTS, "max"}


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"expected a number of at least 0, got {value!r}")
    return value
