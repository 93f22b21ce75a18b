"""An agent on disk (docs/architecture.md §4): agent.yaml, mandate.md, workspace/, state/.

agent.yaml and mandate.md are the human's (never mounted into a box), but
under a shared ROOT whoever may write one agent folder is not the operator:
every file of the folder is read through safeio/folder.py (no link followed,
`state` itself included; never a FIFO or device; capped). A policy path in
agent.yaml inside the folder is read the same way; one outside it (a shared
policy of the operator's) with safeio/yamlfile.py's read_config checks.
workspace/ is the agent's and untrusted; state/ is the host's alone.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.assets import SHIPPED_POLICIES, shipped_policy
from orchestrator.errors import ConfigError
from orchestrator.notify.config import Channel, NotifyError, load_root_notify, parse_notify
from orchestrator.policy.ceiling import load_ceiling
from orchestrator.policy.load import load_policy, policy_from_mapping
from orchestrator.policy.schedule_line import DEFAULT_TZ, ScheduleError, parse_schedule
from orchestrator.policy.schema import Policy, PolicyError
from orchestrator.records.models import Thinking, check_choice
from orchestrator.safeio.folder import Folder, Place
from orchestrator.safeio.yamlfile import line_of, parse_yaml, read_config

DEFAULT_MODEL = "claude-sonnet-5-5"  # what `wakeloop init` writes: the current Sonnet
# An agent.yaml with no `model:` always ran on this one, and keeps it: a model is never switched
# silently (thinking blocks are bound to the model that wrote them); `status` warns it is legacy.
MODEL_WHEN_UNSET = "claude-sonnet-4-6"
DEFAULT_SCHEDULE = "*/30 * * * *"
SANDBOX_UID = 1000  # the sandbox image's unprivileged user
PAUSE_AFTER_FAILURES = 5  # consecutive failed wakes before serve pauses an agent
CEILING_ENV = "WAKELOOP_CEILING"  # the broker's ceiling file, for the processes that load agents
# (compose sets it: /policies/ceiling.yaml, read-only to them)


class AgentError(ConfigError):
    """A bad agent directory or agent.yaml: one line for the human."""


@dataclass(frozen=True)
class Agent:
    dir: Path
    name: str
    model: str
    schedule: str
    policy: Policy
    dry_run: bool
    timezone: str = "UTC"  # IANA zone of a cron schedule (policy/schedule_line.py checks it)
    notify: tuple[Channel, ...] = ()  # agent.yaml's, then ROOT/notify.yaml's
    pause_after_failures: int = PAUSE_AFTER_FAILURES  # failed wakes in a row before serve pauses it
    effort: str | None = None  # output_config.effort; None: the model's default
    thinking: Thinking = Thinking()  # the thinking form asked for; the default: adaptive where accepted

    @property
    def workspace(self) -> Path:
        return self.dir / "workspace"

    @property
    def state_dir(self) -> Path:
        return self.dir / "state"

    @property
    def mandate_path(self) -> Path:
        return self.dir / "mandate.md"


_KEYS = {
    "name",
    "model",
    "schedule",
    "policy",
    "dry_run",
    "every",
    "timezone",
    "notify",
    "pause_after_failures",
    "effort",
    "thinking",
}


def load_agent(agent_dir: str | Path) -> Agent:
    agent_dir = Path(agent_dir).resolve()
    config = agent_dir / "agent.yaml"
    if not os.path.lexists(config):
        raise AgentError(f"{config} not found; create an agent with `wakeloop init {agent_dir}`")
    _check_folders(agent_dir)
    try:
        text = read_config(Place(agent_dir, "agent.yaml"), "agent.yaml")  # no link, capped; never a FIFO
        data, node = parse_yaml(text)
        data = data or {}
    except PolicyError as exc:
        raise AgentError(str(exc)) from None
    except RecursionError:
        raise AgentError(f"{config}: not valid YAML: nested too deep") from None
    except yaml.YAMLError as exc:
        raise AgentError(f"{config}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise AgentError(f"{config}: expected a mapping of keys")
    unknown = sorted(set(map(str, data)) - _KEYS)
    if unknown:
        raise AgentError(f"{_at(config, node, unknown[0])}: unknown key (known: {', '.join(sorted(_KEYS))})")
    schedule, timezone = _schedule(data, config, node)
    model = os.environ.get("WAKELOOP_MODEL") or str(data.get("model") or MODEL_WHEN_UNSET)
    effort, thinking = _effort_thinking(model, data, config, node)
    policy = _policy(data.get("policy"), config, _value_node(node, "policy"))
    if thinking.type == "enabled" and thinking.budget_tokens >= policy.budget.max_output_tokens:
        raise AgentError(
            f"{_at(config, node, 'thinking')}: budget_tokens ({thinking.budget_tokens:,}) must be below the "
            f"policy's budget.max_output_tokens ({policy.budget.max_output_tokens:,}): thinking counts toward it"
        )
    return Agent(
        dir=agent_dir,
        name=str(data.get("name") or agent_dir.name),
        model=model,
        effort=effort,
        thinking=thinking,
        schedule=schedule,
        policy=policy,
        dry_run=_dry_run(data.get("dry_run", True), _at(config, node, "dry_run")),
        timezone=timezone,
        notify=_notify(data.get("notify"), config, node),
        pause_after_failures=_count(
            data.get("pause_after_failures", PAUSE_AFTER_FAILURES), _at(config, node, "pause_after_failures")
        ),
    )


def _schedule(data: dict[str, Any], config: Path, node: yaml.Node | None) -> tuple[str, str]:
    """(schedule, timezone), read as serve reads them (policy/schedule_line.py): a line serve would
    refuse is refused here, by every command that loads the agent, in the same words."""
    key = "every" if data.get("every") else "schedule"
    text, zone = str(data.get(key) or DEFAULT_SCHEDULE), str(data.get("timezone") or DEFAULT_TZ)
    try:
        parse_schedule(text, zone)
    except ScheduleError as exc:
        bad_zone = zone != DEFAULT_TZ and str(exc).startswith("timezone")
        raise AgentError(f"{_at(config, node, 'timezone' if bad_zone else key)}: {exc}") from None
    return text, zone


def _effort_thinking(
    model: str, data: dict[str, Any], config: Path, node: yaml.Node | None
) -> tuple[str | None, Thinking]:
    """agent.yaml's `effort:` and `thinking:` (a type, or {type, display, budget_tokens}), checked
    against what the model accepts (records/models.py)."""
    effort = data.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise AgentError(f"{_at(config, node, 'effort')}: expected low, medium, high, xhigh or max, got {effort!r}")
    raw = data.get("thinking")
    if raw is None:
        thinking = Thinking()
    elif isinstance(raw, str):
        thinking = Thinking(type=raw)
    elif isinstance(raw, dict) and set(map(str, raw)) <= {"type", "display", "budget_tokens"}:
        budget = raw.get("budget_tokens", 0)
        thinking = Thinking(
            str(raw.get("type") or ""), str(raw.get("display") or ""), budget if isinstance(budget, int) else -1
        )
    else:
        raise AgentError(
            f"{_at(config, node, 'thinking')}: expected a type (adaptive, between_tools, disabled, enabled) "
            "or {type: ..., display: summarized|omitted, budget_tokens: N}"
        )
    problem = check_choice(model, effort, thinking)
    if problem:
        key, why = problem.split(": ", 1)
        raise AgentError(f"{_at(config, node, key)}: {why} (`wakeloop models` lists what each model accepts)")
    return effort, thinking


def _check_folders(agent_dir: Path) -> None:
    """state/ and workspace/ are folders of this agent's own: one planted as a link (to
    another agent's, to a folder elsewhere) or as anything but a folder is refused
    before anything reads, writes or mounts it."""
    for name, fix in (
        ("state", "the next wake makes a new one"),
        ("workspace", "make it a folder again (`mkdir`), or run `wakeloop init` on a new folder"),
    ):
        st = Folder(agent_dir).lstat(name)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a folder"
            raise AgentError(
                f"{agent_dir / name} is {what}; wakeloop never follows a link out of an agent "
                f"folder: remove it (`rm {agent_dir / name}`); {fix}"
            )


def _notify(value: Any, config: Path, node: yaml.Node | None) -> tuple[Channel, ...]:
    """agent.yaml's notify list, then ROOT/notify.yaml's (ROOT: the folder holding the agent).
    agent.yaml is not the operator's: what its entries may do comes from ROOT/notify.yaml and the ceiling."""
    try:
        operators, allowed = load_root_notify(config.parent.parent, *notify_ceiling())
        return parse_notify(value, config, node, allowed=allowed) + operators
    except (NotifyError, PolicyError) as exc:  # PolicyError: the ceiling's own
        raise AgentError(str(exc)) from None


def root_channels(root: Path) -> tuple[Channel, ...]:
    """ROOT/notify.yaml's channels alone (for an agent whose agent.yaml does not load)."""
    return load_root_notify(root, *notify_ceiling())[0]


def notify_ceiling() -> tuple[tuple[str, ...], bool]:
    """The ceiling's say on notifications (notify_env, notify_commands), read from the file
    WAKELOOP_CEILING names; without one, the defaults (notify/config.py)."""
    path = os.environ.get(CEILING_ENV, "").strip()
    if not path:
        return (), False
    ceiling = load_ceiling(path)
    return ceiling.notify_env, ceiling.notify_commands


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AgentError(f"{where}: expected a whole number of at least 1, got {value!r}")
    return value


def _at(config: Path, node: yaml.Node | None, key: str) -> str:
    """`file:line: key`, as every config error reads (schema.py's policies, the ceiling)."""
    line = line_of(node, (key,))
    return f"{config}{f':{line}' if line else ''}: {key}"


def _value_node(node: yaml.Node | None, key: str) -> yaml.Node | None:
    """The YAML node under `key`, so an inline policy's errors name agent.yaml's lines."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if key_node.value == key:
                found: yaml.Node = value_node
                return found
    return None


def _policy(value: Any, config: Path, node: yaml.Node | None) -> Policy:
    if value is None:
        return Policy(source=f"{config} (defaults)")
    if isinstance(value, dict):
        return policy_from_mapping(value, str(config), node)
    if isinstance(value, str):
        shipped = shipped_policy(value.strip())  # `policy: strict`: the shipped one, wherever installed
        if shipped:
            return load_policy(shipped)
        # Not resolve(): that would follow a planted link before read_config could refuse it.
        path = Path(os.path.normpath(config.parent / value))
        if path.is_relative_to(config.parent):
            return load_policy(Place(config.parent, str(path.relative_to(config.parent))))
        return _outside_policy(path, config, node)
    line = f":{node.start_mark.line + 1}" if node is not None else ""
    raise PolicyError(f"{config}{line}: policy: expected a file path or a mapping")


def _outside_policy(path: Path, config: Path, node: yaml.Node | None) -> Policy:
    """A policy file outside the agent folder: a shared one of the operator's. Whoever
    writes agent.yaml chooses the path, so a file that is not a policy is refused
    without quoting a word of it (its keys and values would otherwise reach the
    agent's events, which that writer can read): `wakeloop policy check` says why."""
    try:
        return load_policy(path)
    except PolicyError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        raise AgentError(
            f"{config}{line}: policy: {path} is outside the agent folder and not a policy "
            f"wakeloop can use (nothing of it is quoted here); see why with "
            f"`wakeloop policy check {path}`"
        ) from None


def _dry_run(value: Any, where: str) -> bool:
    env = os.environ.get("WAKELOOP_DRY_RUN")
    if env is not None and env.strip():
        if env.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise AgentError(f"WAKELOOP_DRY_RUN={env!r}: expected true or false")
        return env.strip().lower() in ("true", "1", "yes")
    if not isinstance(value, bool):
        raise AgentError(f"{where}: expected true or false, got {value!r}")
    return value


_NAME = re.compile(r"[^A-Za-z0-9_.-]+")

AGENT_YAML = """\
# wakeloop agent: see README.md. This file is trusted and never mounted into the sandbox.
name: {name}
model: {model}
schedule: "{schedule}"      # cron, used by `wakeloop serve`; or `every: 30s` (s, m, h, d)
timezone: UTC               # the zone the cron line is read in (an IANA name such as Europe/Berlin)
policy: {policy}
dry_run: true               # no API calls until you set this false (or pass --live)
# effort: high              # low, medium, high, xhigh or max, as the model accepts (`wakeloop models`)
# thinking: adaptive        # the default; between_tools (Sonnet 5.5) or disabled turn it off
"""

MANDATE = """\
# Mandate

You are {name}, an autonomous agent. Describe here the standing goal and the
rules you want this agent to follow. The agent reads this at every wake
through its system prompt; it cannot change it.
"""


def init_agent(agent_dir: str | Path, policy: str | None = None) -> Path:
    """Create agent.yaml, mandate.md, workspace/ and state/; never overwrite. `policy` (a
    shipped policy's name, or a path relative to the folder) is read as the first wake will
    read it, before anything is made: a mistyped one fails here, not at that wake."""
    agent_dir = Path(agent_dir).resolve()
    if (agent_dir / "agent.yaml").exists():
        raise AgentError(f"{agent_dir / 'agent.yaml'} already exists; nothing changed")
    if policy is not None:
        try:
            _policy(policy, agent_dir / "agent.yaml", None)
        except ConfigError as exc:
            raise AgentError(
                f"--policy {policy}: neither a shipped policy ({', '.join(SHIPPED_POLICIES)}) "
                f"nor a policy file ({exc}); nothing was created"
            ) from None
    name = _NAME.sub("-", agent_dir.name).strip("-") or "agent"
    for sub in ("workspace/memory/journal", "state"):
        (agent_dir / sub).mkdir(parents=True, exist_ok=True)
    (agent_dir / "agent.yaml").write_text(
        AGENT_YAML.format(
            name=name,
            model=DEFAULT_MODEL,
            schedule=DEFAULT_SCHEDULE,
            policy=policy or "{}            # inline; a shipped one (default, strict, networked); or a path",
        )
    )
    (agent_dir / "mandate.md").write_text(MANDATE.format(name=name))
    core = agent_dir / "workspace/memory/core.md"
    if not core.exists():
        core.write_text("# Core memory\n\n(empty: this is the first wake)\n")
    os.chmod(agent_dir / "state", 0o700)
    if os.geteuid() == 0:
        # Run as root, the workspace would belong to root and the sandbox's
        # unprivileged user could not write it: hand it to that user.
        for root, dirs, files in os.walk(agent_dir / "workspace"):
            for entry in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.lchown(entry, SANDBOX_UID, SANDBOX_UID)
    return agent_dir
