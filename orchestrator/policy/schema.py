"""The policy: which tools exist and how tight the box is.

Read once, validated into frozen dataclasses, passed down. Nothing deeper
re-reads YAML or the environment. Defaults are the safe box: no network, modest
limits (docs/security.md, "What one tool call gets").
"""

from __future__ import annotations

import difflib
import os
import stat
import fnmatch
import posixpath
import re
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import ConfigError
from orchestrator.records.folder import Folder, Place, Refused, TooBig
from orchestrator.records.retention import FILE_CAP, MAX_ROTATE_SIZE, Retention


class PolicyError(ConfigError):
    """One line for the human: file, key path and, where known, the line."""


@dataclass(frozen=True)
class Budget:
    max_steps: int = 40                 # model round-trips per wake, hard stop
    max_tokens_per_wake: int = 200_000  # input + output + cache tokens per wake
    max_output_tokens: int = 4096       # per model call
    max_usd_per_wake: float = 1.00      # USD, worst case checked before each call; 0 = no cap
    max_usd_per_day: float = 10.00      # USD per UTC day, all wakes; 0 = no cap (ledger.py)
    max_usd_per_month: float = 300.00   # USD per UTC month, all wakes (a month of the day cap); 0 = no cap
    allow_unpriced: bool = False        # a live wake on a model with no known price: refused unless true
    max_wake_s: float = 1800.0          # wall clock of one wake: checked at each step, caps each tool call


@dataclass(frozen=True)
class BashTool:
    enabled: bool = True                # offer the model `bash` (a shell command in a fresh box)
    timeout_s: float = 120              # wall clock per call, enforced from the host
    max_output_chars: int = 20_000      # what the model sees; the rest is counted, not kept


# Git runs code from its own directory on the host of whoever later uses the
# repository: hooks, config (core.fsmonitor, core.sshCommand, filter and diff
# drivers), config.worktree, a submodule's .git/modules/*/{hooks,config}, a
# linked worktree's commondir. A `.git` FILE ("gitdir: elsewhere") moves all of
# it to a directory of the writer's choosing. So unless a policy sets
# `protect_git: false`, write_file writes nothing named .git and nothing under
# one, in any spelling a filesystem takes for .git (is_dotgit); `deny` adds to
# this. A bare repository planted elsewhere (HEAD, objects/, refs/ in one
# directory) has no .git segment to see: the write script refuses its config,
# config.worktree, commondir and hooks/ in the box (programs.WRITE_SCRIPT).
GIT_DENY = ("**/.git", "**/.git/**")
GIT_DENY_NOTE = ("the .git globs match any case, .git. and git~1 too; the box also refuses "
                 "an embedded bare repository's config, config.worktree, commondir and hooks/")

# Code points HFS+ ignores in names (git's is_hfs_dotgit), so ".g\u200cit" is .git on macOS.
_HFS_IGNORED = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F),
                              *range(0x206A, 0x2070), 0xFEFF])


def is_dotgit(segment: str) -> bool:
    """Whether a filesystem may take this one path segment for `.git`: any case
    (macOS and Windows fold it), HFS+'s ignored code points, NTFS's trailing dots
    and spaces, and NTFS's 8.3 short name GIT~1."""
    name = segment.translate(_HFS_IGNORED).lower().rstrip(". ")
    return name in (".git", "git~1")


@dataclass(frozen=True)
class WriteFileTool:
    """The write_file tool's limits. The globs bind this tool only: bash, when
    enabled, can write anywhere in /workspace.

    Glob semantics (over the normalised path relative to /workspace, '/' separated,
    case-sensitive, anchored at the workspace root like a path, not like .gitignore):
      `**`   as a whole segment: zero or more directories (so `**/x` matches `x`
             and `a/b/x`; `docs/**` matches everything under docs/)
      `*`    any characters within one segment, dotfiles included (`*.md` is top
             level only; `**/*.md` is any depth)
      `?`    one character within a segment; `[abc]` one of those characters
    A path is allowed when it matches some `allow` glob and no `deny` glob
    (deny wins), and is normalised first: `./a//b` is `a/b`.
    """

    enabled: bool = True                # offer the model `write_file` (a file written in a fresh box)
    max_bytes: int = 1_048_576          # per write
    allow: tuple[str, ...] = ("**",)    # globs a path must match (semantics above)
    deny: tuple[str, ...] = ()          # globs no path may match; deny wins over allow
    protect_git: bool = True            # also deny GIT_DENY (by is_dotgit) and embedded bare repos' config
    timeout_s: float = 30               # wall clock per call, enforced from the host

    @property
    def effective_deny(self) -> tuple[str, ...]:
        return (GIT_DENY if self.protect_git else ()) + self.deny

    def refusal(self, path: str, size: int) -> str | None:
        """Why a write_file of `size` bytes to workspace-relative `path` is not
        allowed, as a sentence for the model, or None when it is."""
        if not self.enabled:
            return "the write_file tool is disabled by this agent's policy"
        rel = normalise(path)
        if rel is None:
            return (f"{path!r} is not a path inside /workspace: give it relative to "
                    "/workspace, without '..'")
        if size > self.max_bytes:
            return (f"the content is {size:,} bytes; this policy allows at most "
                    f"{self.max_bytes:,} bytes per write_file call")
        dotgit = next((s for s in rel.split("/") if is_dotgit(s)), None) if self.protect_git else None
        if dotgit is not None:
            return (f"writing {rel} is denied by this agent's policy (protect_git): {dotgit!r} "
                    "is git's own directory, or a `gitdir:` pointer to one, whose hooks and "
                    "config make git run code for whoever uses the repository later; "
                    "this is deliberate, do not try another way round it")
        denied = next((g for g in self.deny if glob_match(g, rel)), None)
        if denied:
            return (f"writing {rel} is denied by this agent's policy (deny glob {denied!r}); "
                    "this is deliberate, do not try another way round it")
        if not any(glob_match(g, rel) for g in self.allow):
            return (f"writing {rel} is not allowed by this agent's policy; it allows only "
                    f"{', '.join(self.allow) or 'nothing'}")
        return None


def normalise(path: str) -> str | None:
    """`./a//b/` -> `a/b`; None for an absolute path, one escaping with `..`,
    the workspace itself, or one with NUL/control characters."""
    if not path or path.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in path):
        return None
    rel = posixpath.normpath(path)
    if rel in (".", "..") or rel.startswith("../"):
        return None
    return rel


def glob_match(pattern: str, rel: str) -> bool:
    """Whether normalised `rel` matches `pattern` (semantics: WriteFileTool)."""
    return _match_parts(tuple(p for p in pattern.split("/") if p), tuple(rel.split("/")))


def _match_parts(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_parts(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _match_parts(rest, parts[1:])


@dataclass(frozen=True)
class SendMessageTool:
    enabled: bool = True                # offer the model `send_message` (to the outbox and notify channels)
    max_per_wake: int = 5               # messages one wake may send; more are refused to the model
    max_chars: int = 4000               # characters of one message; a longer one is cut, and the model told


@dataclass(frozen=True)
class CompleteTaskTool:
    enabled: bool = True                # host-side: closes this wake's task in state/tasks.json


@dataclass(frozen=True)
class Tools:
    bash: BashTool = field(default_factory=BashTool)                            # `bash`: a command in the box
    write_file: WriteFileTool = field(default_factory=WriteFileTool)            # `write_file`: a file in the box
    send_message: SendMessageTool = field(default_factory=SendMessageTool)      # `send_message`: words to you
    complete_task: CompleteTaskTool = field(default_factory=CompleteTaskTool)   # `complete_task`: close a task


@dataclass(frozen=True)
class SandboxPolicy:
    image: str = "wakeloop-sandbox:latest"  # the image every call's container is made from
    runtime: str = "runc"               # runc | runsc (gVisor: scripts/setup-runsc.sh)
    user: str = "auto"                  # "auto" = the workspace owner, never root
    memory: int = 512 * 2**20           # bytes; memory and memory+swap
    cpus: float = 1.0                   # CPU time the box may use, in CPUs (a quota, not a pinning)
    pids: int = 256                     # processes and threads in the box
    tmp_size: int = 64 * 2**20          # bytes, tmpfs /tmp
    shm_size: int = 16 * 2**20          # bytes, private /dev/shm
    nofile: int = 1024                  # open files per process
    max_file_size: int = 1 * 2**30      # bytes, RLIMIT_FSIZE: one file, in /workspace too
    disk: int = 2 * 2**30               # bytes: the workspace is a filesystem of this size (disk.py);
                                        # 0 ("none"): a plain host folder, with no limit
    files: int = 100_000                # files and folders (inodes) that filesystem holds
    pool: int = 2                       # containers started ahead of calls; 0 = every call cold
    network: str = "none"               # none | allowlist | bridge
    allow_hosts: tuple[str, ...] = ()   # with allowlist: the hosts (host or host:port, *.domain) the proxy passes
    env: tuple[tuple[str, str], ...] = ()   # variables for the command (a mapping); loader variables refused


@dataclass(frozen=True)
class TranscriptPolicy:
    """state/transcripts/ (records/transcript.py): what one wake and one agent may keep."""
    max_wake_bytes: int = 8 * 2**20     # bytes of one wake's transcript; past it lines are counted, not kept
    max_agent_bytes: int = 256 * 2**20  # bytes of all of an agent's transcripts; the oldest go first
    retention_days: int = 30            # days a transcript is kept (by its last write)


# A tool call that waits for a person (records/approvals.py keeps it; wake/approval_gate.py asks).
APPROVE_TOOLS = ("bash", "write_file")
MAX_APPROVE_RULES = 64              # rules in one approve: section; each is tried on every call
MIN_EXPIRES_S = 60.0                # seconds: a shorter wait reaches nobody before it lapses


@dataclass(frozen=True)
class ApproveRule:
    """One rule of `approve.rules`. bash: `match` globs (fnmatch, case-sensitive) over the whole
    command, leading and trailing whitespace stripped. write_file: `paths` globs over the
    normalised path, with write_file's own glob semantics (WriteFileTool). A tripwire for the
    calls a person wants to see, not a boundary: bash can spell any command another way."""
    tool: str                           # bash | write_file
    match: tuple[str, ...] = ()         # bash: fnmatch globs over the whole command
    paths: tuple[str, ...] = ()         # write_file: globs over the path

    def asks(self, tool: str, args: dict) -> str | None:
        """Which glob of this rule the call matches (to name it to the model and the person), or None."""
        if tool != self.tool:
            return None
        if tool == "bash":
            command = str(args.get("command", "")).strip()
            return next((g for g in self.match if fnmatch.fnmatchcase(command, g)), None)
        rel = normalise(str(args.get("path", "")))
        return None if rel is None else next((g for g in self.paths if glob_match(g, rel)), None)


@dataclass(frozen=True)
class Approve:
    """`approve:`: which calls wait for a person, and how long they wait before they count as denied."""
    rules: tuple[ApproveRule, ...] = ()  # a call matching any rule waits for a person
    expires: float = 86400.0            # seconds an approval waits unanswered, then it is denied ("24h")

    def asks(self, tool: str, args: dict) -> str | None:
        """`tool: bash, match 'git push*'`: the rule and glob this call matches, or None."""
        for rule in self.rules:
            glob = rule.asks(tool, args)
            if glob is not None:
                return f"tool: {tool}, {'match' if tool == 'bash' else 'paths'} {glob!r}"
        return None


@dataclass(frozen=True)
class Policy:
    version: int = 1                    # of this format; 1 is the only one
    budget: Budget = field(default_factory=Budget)        # what one wake, a day and a month may spend
    tools: Tools = field(default_factory=Tools)           # which tools the model is offered, and their limits
    sandbox: SandboxPolicy = field(default_factory=SandboxPolicy)   # the box every call runs in
    transcript: TranscriptPolicy = field(default_factory=TranscriptPolicy)
    state: Retention = field(default_factory=Retention)   # how much of state/ is kept (retention.py)
    approve: Approve = field(default_factory=Approve)     # calls that wait for a person
    source: str = "<defaults>"          # where it was read from, for messages
    # (key path, line) of every key read, so a check made later against the
    # engine (image, runtime) can still name the line.
    lines: tuple[tuple[str, int], ...] = field(default=(), compare=False, repr=False)

    def where(self, key_path: str) -> str:
        """`file:line` of a key, for messages, or just the file."""
        line = dict(self.lines).get(key_path)
        return f"{self.source}:{line}" if line else self.source


DEFAULT = Policy()

# -- sizes ---------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*$", re.IGNORECASE)
_UNITS = {None: 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE_FIELDS = {"memory", "tmp_size", "shm_size", "max_file_size", "max_bytes", "max_wake_bytes",
                "max_agent_bytes", "rotate_size", "keep_size"}
SIZE_FIELDS = frozenset(_SIZE_FIELDS | {"disk"})   # every field read as a size (disk: or none)
# Under gVisor the pids limit counts the Sentry's host threads too: below ~56 a
# box cannot start, below 128 a few background jobs kill it (measured, runsc 2022-12).
RUNSC_MIN_PIDS = 128
MIN_MEMORY = 6 * 2**20                  # bytes; the engine refuses a smaller memory limit
MIN_DISK = 16 * 2**20                   # bytes; ext4's journal and metadata need a few MiB
MIN_FILES = 64                          # inodes; the filesystem's own take eleven


def parse_size(value: Any) -> int:
    """'64m', '1g', '1GiB', '512MB', '100b' or plain bytes -> bytes. Units are binary
    (k = 1024) whether or not an `i` is written, as Docker's are."""
    if isinstance(value, bool) or isinstance(value, float):
        raise ValueError(f"expected a size like 64m or 1GiB, got {value!r}")
    if isinstance(value, int):
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"expected a size like 64m, 1g, 1GiB or plain bytes, got {value!r}")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower() if unit else None])


# -- loading -------------------------------------------------------------------

MAX_CONFIG_BYTES = 1 * 2**20   # agent.yaml or a policy file; real ones are a few KiB


class NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases (`*name`): a policy never needs one, and
    nested aliases expand exponentially (the "billion laughs" alias bomb)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed here",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)


def read_config(path: str | Path | Place, what: str = "policy") -> str:
    """A config file's text, read as untrusted input (under the broker an
    orchestrator taken over can plant any file): a regular file only, never
    opened if it is a FIFO or device (the first open is O_PATH), at most
    MAX_CONFIG_BYTES, UTF-8. PolicyError otherwise, naming the file.
    A `Place` (a file of an agent folder: agent.yaml, a policy inside it) is
    read through records/folder.py: no link followed on the way or at the end."""
    if isinstance(path, Place):
        return _read_inside(path, what)
    path = Path(path)
    try:
        probe = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        st = os.fstat(probe)
        if not stat.S_ISREG(st.st_mode):
            raise PolicyError(f"{path}: not a regular file; a {what} is a YAML file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise PolicyError(f"{path}: {st.st_size:,} bytes; a {what} is at most {MAX_CONFIG_BYTES:,}")
        # Reopened through the O_PATH descriptor: the very file just checked.
        fd = os.open(f"/proc/self/fd/{probe}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read {what}: {exc.strerror}") from None
    finally:
        os.close(probe)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)   # a file that grew since the fstat is cut here
    if len(data) > MAX_CONFIG_BYTES:
        raise PolicyError(f"{path}: over {MAX_CONFIG_BYTES:,} bytes; a {what} is at most that")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not UTF-8 text") from None


def _read_inside(path: Place, what: str) -> str:
    try:
        data = Folder(path.folder).read_bytes(path.rel, MAX_CONFIG_BYTES)
    except TooBig as exc:
        raise PolicyError(f"{path}: {exc.size:,} bytes; a {what} is at most {MAX_CONFIG_BYTES:,}") from None
    except Refused as exc:
        raise PolicyError(f"{path}: {exc.strerror}; a {what} is a regular YAML file in the agent folder, "
                          "read without following links") from None
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not UTF-8 text") from None


def parse_yaml(text: str) -> tuple[Any, yaml.Node | None]:
    """(data, node tree) of untrusted YAML text: no aliases, no tags beyond SafeLoader's.
    yaml.YAMLError or RecursionError (nesting thousands deep) for the caller to word."""
    node = yaml.compose(text, Loader=NoAliasLoader)
    data = yaml.load(text, Loader=NoAliasLoader) if node is not None else None
    return data, node


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
    _check_duplicates(node, (), source)
    return policy_from_mapping(data, source, node)


def policy_from_mapping(data: Any, source: str, node: yaml.Node | None = None) -> Policy:
    """Validate a mapping (from a file or inline in agent.yaml) into a Policy.
    Pure: needs no engine. `check_against_engine` does the rest before any container."""
    if data is None:
        data = {}
    policy = _build(Policy, data, (), source, node)
    _check_combinations(policy, source, node)
    return replace(policy, source=source, lines=tuple(_all_lines(node, ())))


def check_against_engine(policy: Policy, client) -> None:
    """Raise PolicyError if the live engine lacks the policy's image or runtime,
    cannot give its cpus, or has a runtime that cannot give its network.
    Call before any container starts."""
    box = policy.sandbox
    try:
        info = client.info()
        client.images.get(box.image)
        has_image = True
    except Exception as exc:  # docker.errors.ImageNotFound, or an engine error
        if type(exc).__name__ != "ImageNotFound":
            raise PolicyError(f"{policy.source}: cannot ask the Docker engine: {exc}") from None
        has_image = False
    if not has_image:
        raise PolicyError(f"{policy.where('sandbox.image')}: sandbox.image: {box.image} is not on this "
                          "engine; build it with `wakeloop image build` or name an image it has")
    runtimes = info.get("Runtimes") or {}
    if box.runtime not in runtimes:
        hint = " (run scripts/setup-runsc.sh to install gVisor)" if box.runtime == "runsc" else ""
        raise PolicyError(f"{policy.where('sandbox.runtime')}: sandbox.runtime: the engine has no runtime "
                          f"{box.runtime!r} (it has: {', '.join(sorted(runtimes))}){hint}")
    args = (runtimes[box.runtime] or {}).get("runtimeArgs") or []
    if box.network != "none" and "--network=none" in args:
        raise PolicyError(f"{policy.where('sandbox.network')}: sandbox.network: runtime {box.runtime} is "
                          f"registered with --network=none, so network: {box.network} cannot work under "
                          "it; use runtime runc, or network: none")
    if "runsc" in str((runtimes[box.runtime] or {}).get("path", "")) and box.pids < RUNSC_MIN_PIDS:
        raise PolicyError(f"{policy.where('sandbox.pids')}: sandbox.pids: {box.pids} is too few under "
                          f"gVisor, whose own threads count against the limit; use at least "
                          f"{RUNSC_MIN_PIDS}")
    ncpu = info.get("NCPU") or 0
    if ncpu and box.cpus > ncpu:
        raise PolicyError(f"{policy.where('sandbox.cpus')}: sandbox.cpus: {box.cpus} is more than the "
                          f"{ncpu} CPUs this engine has")


# -- the YAML node tree: lines and duplicate keys --------------------------------

def line_of(node: yaml.Node | None, path: tuple) -> int | None:
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


def _all_lines(node, path: tuple):
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key_path = path + (str(key_node.value),)
            yield ".".join(key_path), key_node.start_mark.line + 1
            yield from _all_lines(value_node, key_path)


def _check_duplicates(node, path: tuple, source: str) -> None:
    """YAML keeps the last of two equal keys without a word; a policy must not."""
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict = {}
    for key_node, value_node in node.value:
        key = key_node.value
        if key in seen:
            raise PolicyError(f"{source}:{key_node.start_mark.line + 1}: {_dotted(path + (key,))}: "
                              f"duplicate key (first on line {seen[key]})")
        seen[key] = key_node.start_mark.line + 1
        _check_duplicates(value_node, path + (key,), source)


def _dotted(path: tuple) -> str:
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "(top level)"


def _fail(source: str, node, path: tuple, message: str) -> PolicyError:
    line = line_of(node, path)
    where = f"{source}:{line}" if line else source
    return PolicyError(f"{where}: {_dotted(path)}: {message}")


# -- building the dataclasses ----------------------------------------------------

def _build(cls, data: Any, path: tuple, source: str, node):
    if not isinstance(data, dict):
        raise _fail(source, node, path, f"expected a mapping of keys, got {_kind(data)}")
    known = {f.name: f for f in fields(cls) if f.name not in ("source", "lines")}
    values = {}
    for key, value in data.items():
        key_path = path + (str(key),)
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise _fail(source, node, key_path,
                        f"unknown key ({hint}known here: {', '.join(sorted(known))})")
        default = getattr(cls(), key)
        values[key] = _convert(key, value, default, str(known[key].type), key_path, source, node)  # (a str: __future__)
    return cls(**values)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "true/false",
            type(None): "nothing"}.get(type(value), type(value).__name__)


def _convert(key: str, value: Any, default: Any, type_name: str, path, source, node):
    if is_dataclass(default):
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


def _plain(value: Any, default: Any, type_name: str):
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


def _size(value, path, source, node) -> int:
    size = parse_size(value)
    if size <= 0:
        raise ValueError(f"must be greater than zero, got {value!r}")
    if path[-1] == "memory" and size < MIN_MEMORY:
        raise ValueError(f"{value!r} is below the engine's minimum of 6m")
    return size


def _rotate_size(value, path, source, node) -> int:
    size = _size(value, path, source, node)
    if size > MAX_ROTATE_SIZE:
        raise ValueError(f"{value!r} is over {MAX_ROTATE_SIZE // 2**20}m: retention reads no log past "
                         f"{FILE_CAP // 2**20}m (a bigger file in state/ is taken for a planted one)")
    return size


def _disk(value, path, source, node) -> int:
    if value == "none":
        return 0
    size = parse_size(value)
    if size < MIN_DISK:
        raise ValueError(f"{value!r} is below the minimum of 16m (or none: no disk of its own, no limit)")
    return size


def _files(value, path, source, node) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_FILES:
        raise ValueError(f"expected a whole number of files, at least {MIN_FILES}, got {value!r}")
    return value


def _positive(value, path, source, node) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"expected a number of seconds greater than zero, got {value!r}")
    return float(value)


def _days(value, path, source, node) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected a whole number of days, at least 1, got {value!r}")
    return value


def _version(value, path, source, node) -> int:
    if value != 1 or isinstance(value, bool):
        raise ValueError(f"this wakeloop reads policy version 1, got {value!r}")
    return 1


_USER = re.compile(r"^(\d+):(\d+)$")


def _user(value, path, source, node) -> str:
    if value == "auto":
        return value
    match = _USER.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f'expected "auto" or "UID:GID" such as "1000:1000", got {value!r}')
    if int(match.group(1)) == 0 or int(match.group(2)) == 0:
        raise ValueError(f"{value!r} is root; the sandbox never runs as uid or gid 0")
    return value


NETWORKS = ("none", "allowlist", "bridge")


def _network(value, path, source, node) -> str:
    if value not in NETWORKS:
        raise ValueError(f"expected one of {', '.join(NETWORKS)}, got {value!r}")
    return value


_RUNTIME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _runtime(value, path, source, node) -> str:
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
        raise ValueError(f"{entry!r} is an IP address; name the host (addresses are never allowed "
                         "by the proxy, so neither is 169.254.169.254)")
    if wildcard and "." not in host:
        raise ValueError(f"{entry!r} would allow a whole top-level domain")
    if port is not None and not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port} in {entry!r} is not between 1 and 65535")
    return bool(wildcard), host, int(port) if port else None


def _allow_hosts(value, path, source, node) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of hosts, got {_kind(value)}")
    for i, entry in enumerate(value):
        try:
            parse_host(entry)
        except ValueError as exc:
            raise _fail(source, node, path + (i,), str(exc)) from None
    return tuple(entry.lower() for entry in value)


def _globs(value, path, source, node) -> tuple[str, ...]:
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
    r"|PYTHON.+|PERL5LIB|PERLLIB|PERL5OPT|PERL5DB|RUBYOPT|RUBYLIB|NODE_OPTIONS|JAVA_TOOL_OPTIONS)$")


def _env(value, path, source, node) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of NAME: value, got {_kind(value)}")
    out = []
    for name, val in value.items():
        where = path + (str(name),)
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise _fail(source, node, where, "not a valid environment variable name")
        if _ENV_RESERVED.match(name):
            raise _fail(source, node, where, "reserved: wakeloop sets the proxy variables itself, "
                                             "and ANTHROPIC_*/WAKELOOP_* never enter the sandbox")
        if _ENV_LOADER.match(name):
            raise _fail(source, node, where, "refused: it changes how programs load or start (loader, "
                                             "shell or interpreter startup); set it in the command instead")
        if isinstance(val, (dict, list)) or val is None:
            raise _fail(source, node, where, f"expected a plain value, got {_kind(val)}")
        text = str(val).lower() if isinstance(val, bool) else str(val)
        if "\0" in text:
            raise _fail(source, node, where, "the value contains a NUL byte")
        out.append((name, text))
    return tuple(sorted(out))


def _pool(value, path, source, node) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_POOL:
        raise ValueError(f"expected a whole number from 0 (off) to {MAX_POOL}, got {value!r}")
    return value


MAX_POOL = 8    # idle containers per agent; each holds a few MiB and a pids slot

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


def _expires(value, path, source, node) -> float:
    seconds = parse_duration(value)
    if seconds < MIN_EXPIRES_S:
        raise ValueError(f"{value!r} is under a minute; a person cannot answer in time (use 1h or more)")
    return seconds


def _approve_rules(value, path, source, node) -> tuple[ApproveRule, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of rules such as - tool: bash, match: ['git push*'], got {_kind(value)}")
    if len(value) > MAX_APPROVE_RULES:
        raise _fail(source, node, path + (MAX_APPROVE_RULES,), f"{len(value)} rules; at most {MAX_APPROVE_RULES}")
    return tuple(_approve_rule(rule, path + (i,), source, node) for i, rule in enumerate(value))


def _approve_rule(rule, path, source, node) -> ApproveRule:
    if not isinstance(rule, dict):
        raise _fail(source, node, path,
                    f"expected a mapping such as tool: bash, match: ['git push*'], got {_kind(rule)}")
    if "network_host" in rule:
        raise _fail(source, node, path + ("network_host",),
                    "not built yet: a host outside sandbox.allow_hosts fails; add the host to allow_hosts "
                    "or leave this rule out")
    tool = rule.get("tool")
    if tool not in APPROVE_TOOLS:
        raise _fail(source, node, path + ("tool",) if "tool" in rule else path,
                    f"expected tool: {' or tool: '.join(APPROVE_TOOLS)}, got {tool!r}")
    key = "match" if tool == "bash" else "paths"
    unknown = sorted(set(map(str, rule)) - {"tool", key})
    if unknown:
        raise _fail(source, node, path + (unknown[0],),
                    f"unknown key for tool: {tool} (it takes `{key}`: a list of globs)")
    globs = rule.get(key)
    if not isinstance(globs, list) or not globs:
        raise _fail(source, node, path + (key,) if key in rule else path,
                    f"expected `{key}:` with a list of globs, e.g. {key}: "
                    + ("['git push*']" if tool == "bash" else "['deploy/**']"))
    if tool == "write_file":
        return ApproveRule(tool, paths=_globs(globs, path + (key,), source, node))
    for i, glob in enumerate(globs):
        if not isinstance(glob, str) or not glob.strip() or "\0" in glob:
            raise _fail(source, node, path + (key, i), f"expected a non-empty glob string, got {glob!r}")
    return ApproveRule(tool, match=tuple(globs))

_CHECKS = {
    **{name: _size for name in _SIZE_FIELDS},
    "pool": _pool, "disk": _disk, "files": _files, "rotate_size": _rotate_size,
    "version": _version, "user": _user, "network": _network, "runtime": _runtime,
    "allow_hosts": _allow_hosts, "allow": _globs, "deny": _globs, "env": _env,
    "retention_days": _days, "max_wake_s": _positive, "expires": _expires, "rules": _approve_rules,
}


def _check_combinations(policy: Policy, source: str, node) -> None:
    box = policy.sandbox
    if box.network == "allowlist" and not box.allow_hosts:
        raise _fail(source, node, ("sandbox", "network"),
                    "allowlist needs at least one entry in sandbox.allow_hosts (or use network: none)")
    if box.network != "allowlist" and box.allow_hosts:
        raise _fail(source, node, ("sandbox", "allow_hosts"),
                    f"only used with network: allowlist (network is {box.network})")
