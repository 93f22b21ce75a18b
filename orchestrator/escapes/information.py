"""Information attacks: learn what the host knows — its environment and API
key, proxies, name, processes, paths, other agents, the Docker socket, or
secrets baked into the sandbox image.

Secrets never travel into the box to be searched for: the box prints names
and hashes, and the host compares.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket

from orchestrator.escapes.core import Probe, Trial, escaped, held

CATEGORY = "information"
BOX_ENV = {"PATH", "HOME", "LANG", "HOSTNAME", "PWD", "SHLVL", "_", "OLDPWD"}  # set by the box or bash itself
SECRET_ENV = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "GITHUB_TOKEN",
    "DOCKER_AUTH_CONFIG",
    "OPENAI_API_KEY",
)
SECRET_PATTERN = re.compile(r"(sk-ant-|api[_-]?key|secret|token|passw(or)?d|BEGIN [A-Z ]*PRIVATE KEY)", re.I)

# Every process environment in the box, as NAME and sha256(value): no value leaves the box.
_ENV_DUMP = r"""
import hashlib, json
seen = {}
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        continue
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            seen[k.decode(errors="replace")] = hashlib.sha256(v).hexdigest()
for k, v in os.environ.items():
    seen[k] = hashlib.sha256(v.encode()).hexdigest()
print("ENV " + json.dumps(seen))
"""


def _box_env(t: Trial) -> dict[str, str]:
    out = t.py(_ENV_DUMP)
    line = next((ln for ln in out.splitlines() if ln.startswith("ENV ")), None)
    if line is None:
        raise RuntimeError(f"the box printed no environment: {out[-200:]}")
    return json.loads(line[4:])


def _ours(t: Trial) -> dict[str, str]:
    """wakeloop's own programs, which pid 1 keeps in its environment (programs.boot),
    and a cold call's command environment (programs.COMMAND_ENV): name -> sha256
    of the exact value, so nothing else may hide under the name."""
    from orchestrator.sandbox.containers.programs import COMMAND_ENV, GUARD, GUARD_ENV, LAUNCHER, LAUNCHER_ENV, carried

    return {
        GUARD_ENV: hashlib.sha256(GUARD.encode()).hexdigest(),
        LAUNCHER_ENV: hashlib.sha256(LAUNCHER.encode()).hexdigest(),
        COMMAND_ENV: hashlib.sha256(carried(t.box.command_env()).encode()).hexdigest(),
        **_egress_env(t),
    }


def _egress_env(t: Trial) -> dict[str, str]:
    """An allowlist's proxy variables, which name the agent's own proxy: name -> sha256
    of that exact value (anything else under those names is still a finding)."""
    egress = t.box._egress()
    return {k: hashlib.sha256(v.encode()).hexdigest() for k, v in (egress.env() if egress else {}).items()}


def _hides_host_environment(t: Trial) -> str:
    box = _box_env(t)
    ours = _ours(t)
    box = {k: v for k, v in box.items() if ours.get(k) != v}
    allowed = BOX_ENV | {k for k, _ in t.lab.policy.env}
    extra = sorted(set(box) - allowed)
    host_values = {hashlib.sha256(v.encode()).hexdigest(): k for k, v in os.environ.items() if len(v) >= 8}
    copied = sorted({host_values[h] for k, h in box.items() if h in host_values and k not in allowed})
    if extra or copied:
        return escaped(f"variables beyond the policy's: {extra[:8]}; host values seen: {copied[:8]}")
    return held(f"only {sorted(box)} (PATH/HOME/LANG, the policy's env, and what bash sets)")


hides_host_environment = Probe(
    "hides_host_environment",
    CATEGORY,
    "the box's environment is PATH/HOME/LANG plus the policy's env, nothing of the host's",
    _hides_host_environment,
)


def _hides_api_key(t: Trial) -> str:
    """The real key if the host has one; else a stand-in planted in this process's
    environment for the probe, exactly where the real one would be."""
    planted = "ANTHROPIC_API_KEY" not in os.environ
    if planted:
        os.environ["ANTHROPIC_API_KEY"] = "sk-ant-wakeloop-probe-" + t.lab.host_canary
    try:
        secrets = {hashlib.sha256(os.environ[k].encode()).hexdigest(): k for k in SECRET_ENV if os.environ.get(k)}
        box = _box_env(t)
    finally:
        if planted:
            del os.environ["ANTHROPIC_API_KEY"]
    leaked = sorted({secrets[h] for h in box.values() if h in secrets} | (set(box) & set(SECRET_ENV)))
    if leaked:
        return escaped(f"the box sees {leaked}")
    which = "stand-in" if planted else "real"
    return held(f"no secret variable or value in any process of the box ({which} key checked)")


hides_api_key = Probe(
    "hides_api_key",
    CATEGORY,
    "no process in the box has the API key (or any other secret variable) by name or value",
    _hides_api_key,
)


def _hides_proxy_settings(t: Trial) -> str:
    box = _box_env(t)
    ours = _egress_env(t)
    proxies = sorted(
        k
        for k, v in box.items()
        if "proxy" in k.lower() and ours.get(k) != v and k not in {n for n, _ in t.lab.policy.env}
    )
    if proxies:
        return escaped(f"proxy settings copied in: {proxies}")
    return held("no *_proxy variable in the box (the client's proxy config is not copied in)")


hides_proxy_settings = Probe(
    "hides_proxy_settings",
    CATEGORY,
    "no HTTP(S)_PROXY/NO_PROXY from the client's config or environment",
    _hides_proxy_settings,
)


def _uses_neutral_hostname(t: Trial) -> str:
    host = socket.gethostname()
    out = t.py("print('NAME', socket.gethostname(), open('/etc/hostname').read().strip())")
    names = next((ln.split()[1:] for ln in out.splitlines() if ln.startswith("NAME ")), None)
    if names is None:
        return out
    if host in names or any(n and n in host.split(".") for n in names if n not in ("sandbox", "localhost")):
        return escaped(f"the box is named {names}, after the host {host!r}")
    return held(f"the box is named {names[0]!r}; the host's name stays out")


uses_neutral_hostname = Probe(
    "uses_neutral_hostname", CATEGORY, "the box's hostname is neutral, not the host's", _uses_neutral_hostname
)


def _hides_host_process_list(t: Trial) -> str:
    host_init = _read("/proc/1/comm").strip()
    if host_init in ("bash", "sh", "python3", "docker-init", "tini", "init", ""):
        host_init = "dockerd"  # the host's init looks like the box's own: it tells nothing
    program = rf"""
comms = {{}}
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        comms[pid] = open(f"/proc/{{pid}}/comm").read().strip()
    except OSError:
        pass
host = [f"{{p}}:{{c}}" for p, c in comms.items()
        if c in ("dockerd", "containerd", "systemd", "sshd", {host_init!r}) and c != "docker-init"
        or c.startswith("containerd-shim")]
if host or len(comms) > 20: escaped(f"host processes visible ({{len(comms)}} in all): {{host[:5]}}")
else: held(f"{{len(comms)}} processes, all the box's own: {{sorted(set(comms.values()))}}")
"""
    out = t.py(program)
    return out


hides_host_process_list = Probe(
    "hides_host_process_list",
    CATEGORY,
    "the box sees only its own few processes, none of the host's",
    _hides_host_process_list,
)


def _hides_workspace_host_path(t: Trial) -> str:
    out = t.sh("cat /proc/self/mountinfo; echo; cat /proc/self/mounts; echo HOST-END")
    host_path = str(t.workspace)
    parent = str(t.dir)
    if host_path in out or parent in out:
        line = next((ln for ln in out.splitlines() if parent in ln), "")
        return escaped(f"the workspace's host path shows in /proc/self/mountinfo: {line.split(' - ')[0][:120]}")
    if "HOST-END" not in out:
        return out
    return held("mountinfo names /workspace without the host path behind it")


hides_workspace_host_path = Probe(
    "hides_workspace_host_path",
    CATEGORY,
    "/proc/self/mountinfo does not reveal where the workspace lives on the host",
    _hides_workspace_host_path,
)


def _hides_other_agents(t: Trial) -> str:
    other = str(t.lab.other_workspace)
    program = rf"""
token, other = {t.lab.other_canary!r}, {other!r}
found = []
for p in [other + "/memory/core.md", "/workspace/../other-agent/workspace/memory/core.md",
          "/proc/1/root" + other + "/memory/core.md"]:
    try:
        if token in open(p).read(): found.append(p)
    except OSError:
        pass
import stat
for dirpath, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(dirpath, d) not in ("/proc", "/sys", "/dev")]
    for f in files:
        path = os.path.join(dirpath, f)
        try:
            if stat.S_ISREG(os.lstat(path).st_mode) and token.encode() in open(path, "rb").read(1 << 16):
                found.append(path)
        except OSError:
            pass
if found: escaped("another agent's memory read at " + ", ".join(found[:3]))
else: held("another agent's workspace is neither reachable by path nor anywhere in the box")
"""
    return t.py(program, timeout_s=90)


hides_other_agents_workspaces = Probe(
    "hides_other_agents_workspaces",
    CATEGORY,
    "another agent's workspace on the same host is invisible",
    _hides_other_agents,
)

hides_docker_socket = Probe(
    "hides_docker_socket",
    CATEGORY,
    "no Docker or containerd socket exists in the box",
    lambda t: t.py(
        r"""
import stat
found = []
for dirpath, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(dirpath, d) not in ("/proc", "/sys")]
    for f in files + dirs:
        p = os.path.join(dirpath, f)
        try:
            if stat.S_ISSOCK(os.lstat(p).st_mode) or f in ("docker.sock", "containerd.sock", "podman.sock"):
                found.append(p)
        except OSError:
            pass
for p in ["/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"]:
    if os.path.exists(p): found.append(p)
if found: escaped("sockets in the box: " + ", ".join(sorted(set(found))[:5]))
else: held("no socket file anywhere in the box's filesystems")
""",
        timeout_s=90,
    ),
)


def _image_has_no_baked_secrets(t: Trial) -> str:
    image = t.lab.client.images.get(t.lab.policy.image)
    findings = []
    for layer in image.history():
        text = layer.get("CreatedBy") or ""
        if SECRET_PATTERN.search(text):
            findings.append(text[:80])
    for item in image.attrs.get("Config", {}).get("Env") or []:
        if SECRET_PATTERN.search(item.split("=", 1)[0]) or "sk-ant-" in item:
            findings.append("ENV " + item.split("=", 1)[0])
    for key in SECRET_ENV:
        value = os.environ.get(key)
        if value and any(value in (layer.get("CreatedBy") or "") for layer in image.history()):
            findings.append(f"the host's {key} value")
    if findings:
        return escaped("image history/config mentions secrets: " + " | ".join(findings[:3]))
    return held(f"{len(image.history())} layers of `docker history` and the image env name no secret")


image_has_no_baked_secrets = Probe(
    "image_has_no_baked_secrets",
    CATEGORY,
    "`docker history` and the image's env carry no key, token or password",
    _image_has_no_baked_secrets,
)


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


PROBES = [
    hides_host_environment,
    hides_api_key,
    hides_proxy_settings,
    uses_neutral_hostname,
    hides_host_process_list,
    hides_workspace_host_path,
    hides_other_agents_workspaces,
    hides_docker_socket,
    image_has_no_baked_secrets,
]
