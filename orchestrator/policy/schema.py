"""The policy: which tools exist and how tight the box is, as frozen dataclasses.

Read once, validated into these dataclasses, passed down. Nothing deeper
re-reads YAML or the environment. Defaults are the safe box: no network, modest
limits (docs/security.md, "What one tool call gets"). Each field's comment gives its unit
and why it is that size; the field names are the policy file's keys.

Not here: reading a policy file into these (load.py: `load_policy`,
`parse_policy`, `policy_from_mapping`, each key's check), the path rules that
WriteFileTool and ApproveRule apply (paths.py), the YAML reader with line
numbers (safeio/yamlfile.py), whether the engine can give what a policy asks
(sandbox/policy_check.py).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.policy.editor_paths import EDITOR, MEMORY, written
from orchestrator.policy.paths import GIT_DENY, glob_match, is_dotgit, normalise
from orchestrator.records.retention import Retention
from orchestrator.safeio.yamlfile import ConfigFileError

# One class for a policy's errors and its file's read errors (safeio/yamlfile.py),
# so a caller catches both as one: file, key path and, where known, the line.
PolicyError = ConfigFileError

NETWORKS = ("none", "allowlist", "bridge")  # sandbox.network's values
# Every field read as a size ('64m', '1GiB' or bytes; load.py's parse_size); disk also takes `none`.
SIZE_FIELDS = frozenset(
    {
        "memory",
        "tmp_size",
        "shm_size",
        "max_file_size",
        "max_bytes",
        "max_wake_bytes",
        "max_agent_bytes",
        "rotate_size",
        "keep_size",
        "disk",
        "max_egress_bytes_per_wake",
    }
)


@dataclass(frozen=True)
class Budget:
    max_steps: int = 40  # model round-trips per wake, hard stop
    max_tokens_per_wake: int = 200_000  # input + output + cache tokens per wake
    max_output_tokens: int = 4096  # per model call
    max_usd_per_wake: float = 1.00  # USD, worst case checked before each call; 0 = no cap
    max_usd_per_day: float = 10.00  # USD per UTC day, all wakes; 0 = no cap (ledger.py)
    max_usd_per_month: float = 300.00  # USD per UTC month, all wakes (a month of the day cap); 0 = no cap
    allow_unpriced: bool = False  # a live wake on a model with no known price: refused unless true
    max_wake_s: float = 1800.0  # wall clock of one wake: checked at each step, caps each tool call


@dataclass(frozen=True)
class BashTool:
    enabled: bool = True  # offer the model `bash` (a shell command in a fresh box)
    timeout_s: float = 120  # wall clock per call, enforced from the host
    max_output_chars: int = 20_000  # what the model sees; the rest is counted, not kept


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

    enabled: bool = True  # offer the model `write_file` (a file written in a fresh box)
    max_bytes: int = 1_048_576  # per write
    allow: tuple[str, ...] = ("**",)  # globs a path must match (semantics above)
    deny: tuple[str, ...] = ()  # globs no path may match; deny wins over allow
    protect_git: bool = True  # also deny GIT_DENY (by is_dotgit) and embedded bare repos' config
    timeout_s: float = 30  # wall clock per call, enforced from the host

    @property
    def effective_deny(self) -> tuple[str, ...]:
        return (GIT_DENY if self.protect_git else ()) + self.deny

    def refusal(self, path: str, size: int, offered: bool = True) -> str | None:
        """Why a write_file of `size` bytes to workspace-relative `path` is not
        allowed, as a sentence for the model, or None when it is. `offered=False`: the rules
        alone, for Claude's file tools (editor_paths.py), whether write_file is on or not."""
        if offered and not self.enabled:
            return "the write_file tool is disabled by this agent's policy"
        rel = normalise(path)
        if rel is None:
            return f"{path!r} is not a path inside /workspace: give it relative to /workspace, without '..'"
        if size > self.max_bytes:
            return (
                f"the content is {size:,} bytes; this policy allows at most "
                f"{self.max_bytes:,} bytes per write_file call"
            )
        dotgit = next((s for s in rel.split("/") if is_dotgit(s)), None) if self.protect_git else None
        if dotgit is not None:
            return (
                f"writing {rel} is denied by this agent's policy (protect_git): {dotgit!r} "
                "is git's own directory, or a `gitdir:` pointer to one, whose hooks and "
                "config make git run code for whoever uses the repository later; "
                "this is deliberate, do not try another way round it"
            )
        denied = next((g for g in self.deny if glob_match(g, rel)), None)
        if denied:
            return (
                f"writing {rel} is denied by this agent's policy (deny glob {denied!r}); "
                "this is deliberate, do not try another way round it"
            )
        if not any(glob_match(g, rel) for g in self.allow):
            return (
                f"writing {rel} is not allowed by this agent's policy; it allows only "
                f"{', '.join(self.allow) or 'nothing'}"
            )
        return None


@dataclass(frozen=True)
class SendMessageTool:
    enabled: bool = True  # offer the model `send_message` (to the outbox and notify channels)
    max_per_wake: int = 5  # messages one wake may send; more are refused to the model
    max_chars: int = 4000  # characters of one message; a longer one is cut, and the model told


@dataclass(frozen=True)
class CompleteTaskTool:
    enabled: bool = True  # host-side: closes this wake's task in state/tasks.json


@dataclass(frozen=True)
class TextEditorTool:
    """Claude's own text editor (`str_replace_based_edit_tool`, type text_editor_20250728): view,
    str_replace, create, insert, each in a fresh box. Its writes obey write_file's globs, max_bytes
    and protect_git (policy/editor_paths.py), whether or not write_file itself is offered."""

    enabled: bool = True  # offer the model `str_replace_based_edit_tool` (edits in a fresh box)
    max_characters: int = 20_000  # what one `view` shows at most; sent to the API as max_characters
    timeout_s: float = 30  # wall clock per call, enforced from the host


@dataclass(frozen=True)
class MemoryTool:
    """Claude's memory tool (`memory`, type memory_20250818): /memories is the workspace's memory/
    (core.md and the journal included), confined there; view, create, str_replace, insert, delete,
    rename, each in a fresh box, under write_file's globs, max_bytes and protect_git."""

    enabled: bool = False  # offer the model `memory` (its memory/ folder as /memories)
    max_characters: int = 20_000  # what one `view` shows at most
    timeout_s: float = 30  # wall clock per call, enforced from the host


@dataclass(frozen=True)
class Tools:
    bash: BashTool = field(default_factory=BashTool)  # `bash`: a command in the box
    write_file: WriteFileTool = field(default_factory=WriteFileTool)  # `write_file`: a file in the box
    send_message: SendMessageTool = field(default_factory=SendMessageTool)  # `send_message`: words to you
    complete_task: CompleteTaskTool = field(default_factory=CompleteTaskTool)  # `complete_task`: close a task
    text_editor: TextEditorTool = field(default_factory=TextEditorTool)  # Claude's text editor, in the box
    memory: MemoryTool = field(default_factory=MemoryTool)  # Claude's memory tool: /memories is memory/


@dataclass(frozen=True)
class Credential:
    """One `sandbox.credentials` entry: a header the egress proxy adds for one host. The value's
    ${VAR} is expanded on the proxy's side, from the environment of the process that makes the
    proxies (the broker under compose), never in the box; the ceiling's `credential_env` lists
    the names a policy may use. The box sees at most a placeholder (`placeholder_env`)."""

    host: str  # the one host (exact name, in allow_hosts) whose HTTPS requests get the header
    header: str = "Authorization"  # the header's name
    value: str = ""  # the header's value, naming exactly one variable: "Bearer ${GITHUB_TOKEN}"
    placeholder_env: str = ""  # optional: a variable the box gets, holding a placeholder the proxy swaps in

    @property
    def var(self) -> str:
        """The variable `value` names (load.py checks there is exactly one)."""
        return str(CREDENTIAL_VAR.findall(self.value)[0])


CREDENTIAL_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # ${NAME} in a credential's value


@dataclass(frozen=True)
class HttpRule:
    """One `sandbox.http` entry: the requests an intercepted host may get. A request no rule
    admits is refused with a reason the model reads (the host, the rules, this file and line)."""

    host: str  # the host (exact name, in allow_hosts); its HTTPS is intercepted to see method and path
    allow: tuple[str, ...] = ()  # "METHOD /path/glob": `*` one path segment, `**` any; METHOD may be *
    source: str = field(default="", compare=False)  # file:line of this entry, set when read (not a key)


@dataclass(frozen=True)
class SandboxPolicy:
    image: str = "wakeloop-sandbox:latest"  # the image every call's container is made from
    runtime: str = "runc"  # runc | runsc (gVisor: scripts/setup-runsc.sh)
    user: str = "auto"  # "auto" = the workspace owner, never root
    memory: int = 512 * 2**20  # bytes; memory and memory+swap
    cpus: float = 1.0  # CPU time the box may use, in CPUs (a quota, not a pinning)
    pids: int = 256  # processes and threads in the box
    tmp_size: int = 64 * 2**20  # bytes, tmpfs /tmp
    shm_size: int = 16 * 2**20  # bytes, private /dev/shm
    nofile: int = 1024  # open files per process
    max_file_size: int = 1 * 2**30  # bytes, RLIMIT_FSIZE: one file, in /workspace too
    disk: int = 2 * 2**30  # bytes: the workspace, a filesystem of this size (disk.py); 0 ("none"): a plain folder
    files: int = 100_000  # files and folders (inodes) that filesystem holds
    pool: int = 2  # containers started ahead of calls; 0 = every call cold
    network: str = "none"  # none | allowlist | bridge
    allow_hosts: tuple[str, ...] = ()  # with allowlist: the hosts (host or host:port, *.domain) the proxy passes
    env: tuple[tuple[str, str], ...] = ()  # variables for the command (a mapping); loader variables refused
    credentials: tuple[Credential, ...] = ()  # headers the proxy adds per host; the box never holds their values
    http: tuple[HttpRule, ...] = ()  # method and path rules per intercepted host
    max_egress_bytes_per_wake: int = 2**30  # bytes through the allowlist's proxy, both ways, per wake; 0 = no cap
    ask_hosts: tuple[str, ...] = ()  # not a key: approve.rules' network_host globs, for the proxy (load.py)


@dataclass(frozen=True)
class TranscriptPolicy:
    """state/transcripts/ (records/transcript.py): what one wake and one agent may keep."""

    max_wake_bytes: int = 8 * 2**20  # bytes of one wake's transcript; past it lines are counted, not kept
    max_agent_bytes: int = 256 * 2**20  # bytes of all of an agent's transcripts; the oldest go first
    retention_days: int = 30  # days a transcript is kept (by its last write)


@dataclass(frozen=True)
class WorkspacePolicy:
    """`workspace:`: what a wake may change in the agent's files, by any tool (sandbox/wakes/wake_layer.py).
    A wake's calls see its own changes; the files on the disk change only when the wake ends,
    whatever its receipt: then every change is checked, what passes lands whole, the rest is
    dropped and named in the event log and the next wake's context. Besides `protect` and
    protect_git, a set-id file and a hard link to a file outside the wake are refused. A call
    outside any wake (`wakeloop sandbox exec`) is a wake of its own. Needs `sandbox.disk`."""

    protect: tuple[str, ...] = ()  # globs (write_file's syntax) of paths no wake may change, by any tool
    keep_undo_days: int = 30  # days a wake's commit stays undoable (`wakeloop undo`), then pruned


def host_glob(globs: tuple[str, ...], host: str) -> str | None:
    """The network_host glob that covers `host` (a name, lower-case, no port), or None."""
    return next((g for g in globs if fnmatch.fnmatchcase(host, g)), None)


NOT_KEYS = ("source", "lines", "ask_hosts")  # fields a policy file does not set: where it was read, what is derived

# A tool call that waits for a person (records/approvals.py keeps it; wake/approval_gate.py asks).
APPROVE_TOOLS = ("bash", "write_file")
MAX_APPROVE_RULES = 64  # rules in one approve: section; each is tried on every call
MIN_EXPIRES_S = 60.0  # seconds: a shorter wait reaches nobody before it lapses


@dataclass(frozen=True)
class ApproveRule:
    """One rule of `approve.rules`. bash: `match` globs (fnmatch, case-sensitive) over the whole
    command, leading and trailing whitespace stripped. write_file: `paths` globs over the
    normalised path, with write_file's own glob semantics (WriteFileTool). A tripwire for the
    calls a person wants to see, not a boundary: bash can spell any command another way.
    network_host (needs `network: allowlist`): the proxy answers a request for a host outside
    allow_hosts that matches the glob (fnmatch, over the lower-case name; never an IP address)
    with a 403 that says a person is asked; the bash call that made it is filed, and once
    approved runs again with those hosts allowed, for that one call. Unlike match globs, a
    boundary: the proxy decides, and the broker grants only hosts these globs cover."""

    tool: str = ""  # bash | write_file; left out in a network_host rule
    match: tuple[str, ...] = ()  # bash: fnmatch globs over the whole command
    paths: tuple[str, ...] = ()  # write_file: globs over the path
    network_host: str = ""  # a glob over host names outside sandbox.allow_hosts whose requests ask a person

    def asks(self, tool: str, args: dict[str, Any]) -> str | None:
        """Which glob of this rule the call matches (to name it to the model and the person), or None."""
        if tool in (EDITOR, MEMORY) and self.tool == "write_file":  # Claude's file tools write files too
            return next((g for rel in written(tool, args) for g in self.paths if glob_match(g, rel)), None)
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
    expires: float = 86400.0  # seconds an approval waits unanswered, then it is denied ("24h")

    @property
    def hosts(self) -> tuple[str, ...]:
        """The network_host globs: a host outside allow_hosts that matches one asks, instead of failing."""
        return tuple(rule.network_host for rule in self.rules if rule.network_host)

    def asks(self, tool: str, args: dict[str, Any]) -> str | None:
        """`tool: bash, match 'git push*'`: the rule and glob this call matches, or None."""
        for rule in self.rules:
            glob = rule.asks(tool, args)
            if glob is not None:
                return f"tool: {tool}, {'match' if tool == 'bash' else 'paths'} {glob!r}"
        return None


@dataclass(frozen=True)
class Policy:
    version: int = 1  # of this format; 1 is the only one
    budget: Budget = field(default_factory=Budget)  # what one wake, a day and a month may spend
    tools: Tools = field(default_factory=Tools)  # which tools the model is offered, and their limits
    sandbox: SandboxPolicy = field(default_factory=SandboxPolicy)  # the box every call runs in
    transcript: TranscriptPolicy = field(default_factory=TranscriptPolicy)
    state: Retention = field(default_factory=Retention)  # how much of state/ is kept (retention.py)
    approve: Approve = field(default_factory=Approve)  # calls that wait for a person
    workspace: WorkspacePolicy = field(default_factory=WorkspacePolicy)  # what a wake may change, checked at its end
    source: str = "<defaults>"  # where it was read from, for messages
    # (key path, line) of every key read, so a check made later against the
    # engine (image, runtime) can still name the line.
    lines: tuple[tuple[str, int], ...] = field(default=(), compare=False, repr=False)

    def where(self, key_path: str) -> str:
        """`file:line` of a key, for messages, or just the file."""
        line = dict(self.lines).get(key_path)
        return f"{self.source}:{line}" if line else self.source


DEFAULT = Policy()
