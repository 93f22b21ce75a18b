"""`wakeloop policy explain`: what an agent's policy gives the model and the box.

The tools come from the real registry (tools.build_registry) and the container
settings from the real `DockerSandbox.container_spec`, translated into
`docker run` flags; nothing here restates a setting, so the explanation cannot
drift from what runs. Not here: validation (policy/load.py), running anything.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.policy.editor_paths import EDITOR, EDITOR_TYPE, MEMORY, MEMORY_TYPE
from orchestrator.policy.paths import GIT_DENY, GIT_DENY_NOTE
from orchestrator.policy.schema import Policy
from orchestrator.sandbox.containers.programs import GUARD, WRITE_SCRIPT, command_argv, write_argv

if TYPE_CHECKING:
    from orchestrator.sandbox.containers.engine_shapes import ContainerConfig, HostConfig
    from orchestrator.sandbox.egress.egress_plan import Egress
    from orchestrator.sandbox.engine import DockerSandbox


class Registry(Protocol):
    """What is read here of the tools' registry (wake/tools.py's, which the sandbox may not import)."""

    def names(self) -> list[str]: ...

    def to_anthropic(self) -> list[dict[str, Any]]: ...


# A call's (config, host config): the docker SDK's keyword arguments (engine.py's TypedDicts).
Spec = tuple["ContainerConfig", "HostConfig"]

# How each docker SDK key reads as a `docker run` flag. A key missing here is
# printed as "unmapped", never dropped, so a new setting cannot hide.
_SIMPLE = {
    "user": "--user",
    "working_dir": "--workdir",
    "hostname": "--hostname",
    "network_mode": "--network",
    "pids_limit": "--pids-limit",
    "mem_limit": "--memory",
    "memswap_limit": "--memory-swap",
    "ipc_mode": "--ipc",
    "shm_size": "--shm-size",
    "runtime": "--runtime",
}
_FLAGS = {"read_only": "--read-only", "init": "--init", "stdin_open": "--interactive"}
_LISTS = {"cap_drop": "--cap-drop", "cap_add": "--cap-add", "security_opt": "--security-opt", "dns": "--dns"}
_SKIP = {"image", "command", "detach"}  # the image and argv close the command line


def docker_run_flags(config: Mapping[str, Any], host: Mapping[str, Any]) -> list[str]:
    """`docker run` arguments equivalent to one call's (config, host config)."""
    flags = ["--rm"]  # the harness removes every call's container itself
    for key, value in {**config, **host}.items():
        if key in _SKIP:
            continue
        if key == "use_config_proxy":
            continue  # an SDK-only switch: off, so no proxy variables are copied in
        if key in _SIMPLE:
            flags += [_SIMPLE[key], str(value)]
        elif key in _FLAGS:
            flags += [_FLAGS[key]] if value else []
        elif key in _LISTS:
            for item in value:
                flags += [_LISTS[key], str(item)]
        elif key == "nano_cpus":
            flags += ["--cpus", f"{value / 1e9:g}"]
        elif key == "environment":
            for name, val in value.items():
                flags += ["--env", f"{name}={val}"]
        elif key == "labels":
            for name, val in value.items():
                flags += ["--label", f"{name}={val}"]
        elif key == "tmpfs":
            for path, opts in value.items():
                flags += ["--tmpfs", f"{path}:{opts}"]
        elif key == "mounts":
            for m in value:
                ro = ",readonly" if m.get("ReadOnly") else ""
                flags += ["--mount", f"type={m['Type']},source={m['Source']},target={m['Target']}{ro}"]
        elif key == "ulimits":
            for u in value:
                flags += ["--ulimit", f"{u.name}={u.soft}:{u.hard}"]
        elif key == "log_config":
            flags += ["--log-driver", value.type]
            for name, val in (value.config or {}).items():
                flags += ["--log-opt", f"{name}={val}"]
        else:
            flags += [f"--unmapped-{key}={value!r}"]
    return flags


def _claude_tools(policy: Policy, offered: list[str]) -> list[str]:
    """Claude's own file tools (tools.text_editor, tools.memory), as offered, and the rules they write under."""
    t, w = policy.tools, policy.tools.write_file
    rules = f"writes under write_file's globs, at most {w.max_bytes:,} bytes a file"
    lines = []
    if EDITOR in offered:
        lines.append(
            f"  {EDITOR} ({EDITOR_TYPE}): /workspace; view shows at most "
            f"{t.text_editor.max_characters:,} chars; {rules}; timeout {t.text_editor.timeout_s:g}s"
        )
    if MEMORY in offered:
        lines.append(
            f"  {MEMORY} ({MEMORY_TYPE}): /memories is workspace memory/, nothing else; {rules}; "
            f"timeout {t.memory.timeout_s:g}s"
        )
    return lines


def explain(policy: Policy, box: DockerSandbox, registry: Registry) -> str:
    """The text `policy explain` prints: tools offered, then each call's docker run."""
    lines = [f"policy: {policy.source}", "", "tools offered to the model:"]
    offered = registry.names()
    t = policy.tools
    for name in ("bash", "write_file", "send_message", EDITOR, MEMORY):
        if name not in offered:
            lines.append(f"  {name}: NOT OFFERED (disabled); a call to it anyway is refused")
    if "bash" in offered:
        lines.append(f"  bash: timeout {t.bash.timeout_s:g}s, output to the model {t.bash.max_output_chars:,} chars")
    if "write_file" in offered:
        w = t.write_file
        lines.append(f"  write_file: at most {w.max_bytes:,} bytes per write, timeout {w.timeout_s:g}s")
        lines.append(f"    allow: {', '.join(w.allow) or '(nothing)'}")
        lines.append(f"    deny (wins): {', '.join(w.effective_deny) or '(nothing)'}")
        if w.protect_git:
            lines.append(f"    protect_git: {GIT_DENY_NOTE}")
        else:
            lines.append(
                f"    WARNING: protect_git is false: {', '.join(GIT_DENY)} and embedded bare "
                "repositories' config and hooks are writable"
            )
        if "bash" in offered:
            lines.append("    note: the globs bind write_file only; bash can write anywhere in /workspace")
    if "send_message" in offered:
        lines.append(f"  send_message: at most {t.send_message.max_per_wake} per wake")
    lines += _claude_tools(policy, offered)
    s = policy.sandbox
    lines += [
        "",
        f"network: {s.network}" + (f" (through the proxy, only: {', '.join(s.allow_hosts)})" if s.allow_hosts else ""),
    ]
    if s.network == "allowlist":
        from orchestrator.sandbox.egress import egress_plan, network

        egress = egress_plan.plan_for(box.workspace, s)
        lines += [
            f"  the box joins the network namespace of {egress.holder} (internal network "
            f"{egress.internal_network}, no default route, no IPv6); the only way out is the",
            f"  proxy {egress.proxy} at {egress.proxy_url}, which also sits on {network.EGRESS_NETWORK}",
            "  and refuses any listed name that resolves to an address that is not public "
            "internet (private, loopback, link-local, its own Docker networks)",
            *_egress_lines(egress, s.max_egress_bytes_per_wake),
        ]
    elif s.network == "bridge":
        lines.append("  Docker's default bridge: the open preset, anything the host can reach")
    lines += ["", _workspace_line(box)]
    if s.pool:
        lines += [
            "",
            f"warm pool: {s.pool} container(s) made ahead with exactly the flags below, each",
            "  idling in programs.LAUNCHER (in place of the command; its source in WAKELOOP_LAUNCHER)",
            "  until handed one call's command on stdin; used once, then removed",
        ]
    image = policy.sandbox.image
    if "bash" in offered:
        config, host = _specs(box)["bash"]
        lines += [
            "",
            "each bash call runs in a new container, as (SECCOMP_GUARD is programs.GUARD, popped",
            "from the environment by the one-line boot: it stacks a seccomp filter that answers",
            "io_uring_* and openat2 with ENOSYS and a set-uid/set-gid mode (chmod, open, creat,",
            "mknod and kin, on every syscall ABI) with EPERM, joins stderr to stdout, then runs",
            "the rest by absolute path with exactly the environment in WAKELOOP_COMMAND_ENV: the",
            "policy's env reaches the command alone, never the harness's programs; when it exits,",
            "the guard kills what it left, as the pool's launcher does; the command's stdin is",
            "/dev/null, the guard's is held open until the host has read the box's count of OOM kills):",
            _command(config, host, image),
        ]
    if "write_file" in offered:
        config, host = _specs(box)["write_file"]
        lines += [
            "",
            "each write_file call runs in a new container, as (content on stdin;",
            f"WRITE_SCRIPT is programs.WRITE_SCRIPT, {len(WRITE_SCRIPT.splitlines())} lines "
            "of Python that refuses symlinks and",
            "non-regular files; it runs under the harness's environment, never the policy's env):",
            _command(config, host, image),
        ]
    return "\n".join(lines) + "\n"


def _workspace_line(box: DockerSandbox) -> str:
    s, d = box.policy, box.disk
    if d is None:
        return (
            f"workspace: the folder {box.workspace}, bind-mounted by its path (sandbox.disk: none): "
            "no limit on its bytes or files"
        )
    where = (
        "the engine's own mount of it (kept by a container; during a wake, the wake's overlay volume)"
        if d.engine_root is not None
        else f"{d.box} (root's, outside every agent folder; during a wake, the wake's overlay)"
    )
    return (
        f"workspace: a disk of its own, {s.disk:,} bytes and {s.files:,} files (ext4, -m 0), image "
        f"{d.image} on a loop device,\n  its files/ bound from {where}: full is ENOSPC in the box"
    )


def _egress_lines(egress: Egress, budget: int) -> list[str]:
    """Credentials as name and host (never a value), the rules, what is intercepted, the budget."""
    lines = [f"  egress budget: {budget:,} bytes per wake" if budget else "  egress budget: none"]
    if egress.intercepted:
        lines.append(
            f"  HTTPS opened (a CA of this agent's proxy) for: {', '.join(egress.intercepted)}; other hosts tunnelled"
        )
    for cred in egress.credentials:
        held = f"; the box sees {cred.placeholder_env}=<placeholder>" if cred.placeholder_env else ""
        lines.append(f"  credential {cred.var} -> {cred.host} ({cred.header} header, set by the proxy{held})")
    for rule in egress.http:
        lines.append(f"  {rule.host}: only {', '.join(rule.allow)}")
    return lines


def explain_data(policy: Policy, box: DockerSandbox, registry: Registry) -> dict[str, Any]:
    """`policy explain --json`: the tools as the model is offered them, and each
    call's container as `docker run` arguments (image and argv last)."""
    calls = {name: spec for name, spec in _specs(box).items() if name in registry.names()}
    names = {GUARD: "SECCOMP_GUARD", WRITE_SCRIPT: "WRITE_SCRIPT"}
    return {
        "policy": policy.source,
        "tools": registry.to_anthropic(),
        "warm_pool": policy.sandbox.pool,
        "network": policy.sandbox.network,
        "allow_hosts": list(policy.sandbox.allow_hosts),
        "credentials": [
            {"name": c.var, "host": c.host, "header": c.header, "placeholder_env": c.placeholder_env}
            for c in policy.sandbox.credentials
        ],
        "disk": (
            {
                "bytes": policy.sandbox.disk,
                "files": policy.sandbox.files,
                "image": str(box.disk.image),
                "mount": box.disk.mount().get("Source"),
            }
            if box.disk
            else None
        ),
        "calls": {
            name: [
                "docker",
                "run",
                *docker_run_flags(
                    {**config, "environment": {k: names.get(v, v) for k, v in config["environment"].items()}}, host
                ),
                policy.sandbox.image,
                *[names.get(w, w) for w in config["command"]],
            ]
            for name, (config, host) in calls.items()
        },
    }


def _specs(box: DockerSandbox) -> dict[str, Spec]:
    """Each call's (config, host config), made as the box makes them."""
    return {
        "bash": box.container_spec(command_argv("COMMAND"), stdin=True, command_env=box.command_env()),
        "write_file": box.container_spec(write_argv("PATH"), stdin=True, workdir="/"),
    }


def _command(config: Mapping[str, Any], host: Mapping[str, Any], image: str) -> str:
    """One flag (with its value) per line, then the image and argv."""
    names = {GUARD: "SECCOMP_GUARD", WRITE_SCRIPT: "WRITE_SCRIPT"}  # long programs, by name
    config = {**config, "environment": {k: names.get(v, v) for k, v in config["environment"].items()}}
    flags, pairs = docker_run_flags(config, host), list[list[str]]()
    for word in flags:
        if word.startswith("--") or not pairs:
            pairs.append([word])
        else:
            pairs[-1].append(word)
    rows = ["  docker run"] + ["    " + " ".join(map(shlex.quote, p)) for p in pairs]
    argv = [names.get(w, w) for w in config["command"]]
    rows.append("    " + " ".join(shlex.quote(w) for w in [image, *argv]))
    return " \\\n".join(rows)
