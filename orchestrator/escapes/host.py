"""The host itself: what no probe inside a box can see.

The engine's and runc's versions against known escape CVEs, whether the daemon
is rootless or remaps users, and which seccomp profile is in force. A version
is not a verdict (distributions backport fixes: Debian's runc
1.1.5+ds1-1+deb12u1 carries the CVE-2024-21626 fix), so where a probe tests
the behaviour itself, the warning names it and the probe's result decides.
Findings are warnings with the fix, never hidden and never fatal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import docker

OK, WARNING = "ok", "warning"
IO_URING_FILTERED_FROM = (25, 0)  # moby 25.0 dropped io_uring from the default seccomp profile
RUNC_CVE_2024_21626_FIXED = (1, 1, 12)  # leaked fd / working directory escape
RUNC_CVE_2019_5736_FIXED = (1, 0, 0)  # /proc/self/exe overwrite (fixed in 1.0.0-rc6, before 1.0.0)
RUNC_CVE_2025_FIXED = ((1, 2, 8), (1, 3, 3))  # CVE-2025-31133/52565/52881: masked-path and /dev/console races
BACKPORTS_21626 = ("1.1.5+ds1-1+deb12u1",)  # distribution builds known to carry the CVE-2024-21626 fix


@dataclass(frozen=True)
class HostCheck:
    name: str
    status: str  # ok | warning
    finding: str
    fix: str = ""


def version_tuple(text: str) -> tuple[int, ...]:
    numbers = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(n or 0) for n in numbers.groups()) if numbers else ()


def check_host(client: docker.DockerClient, runtime: str, probe_verdicts: dict[str, str]) -> list[HostCheck]:
    info, version = client.info(), client.version()
    return [
        _engine(version, probe_verdicts),
        _runc(version, info, runtime, probe_verdicts),
        _daemon_mode(info),
        _seccomp(info),
        _runtime(info, runtime),
    ]


def _component(version: dict, name: str) -> dict:
    return next((c for c in version.get("Components") or [] if c.get("Name", "").lower() == name), {})


def _engine(version: dict, verdicts: dict[str, str]) -> HostCheck:
    engine = version.get("Version", "?")
    probe = verdicts.get("blocks_io_uring", "not run")
    if version_tuple(engine) and version_tuple(engine) < IO_URING_FILTERED_FROM:
        status = WARNING
        finding = (
            f"Docker engine {engine} predates 25.0, whose default seccomp profile blocks io_uring "
            f"(io_uring calls are not filtered by seccomp); probe blocks_io_uring: {probe}"
        )
        fix = (
            "upgrade the engine to 25.0 or later, or run sandboxes under runsc (`--runtime runsc`), "
            "or set sysctl kernel.io_uring_disabled=2 on the host"
        )
        if probe == "HELD":  # wakeloop's own filter (seccomp.py) answers io_uring with ENOSYS
            status, fix = OK, ""
            finding = (
                f"Docker engine {engine} predates 25.0 and lets io_uring through its seccomp "
                "profile; wakeloop's extra filter blocks it (probe blocks_io_uring: HELD)"
            )
        return HostCheck("engine", status, finding, fix)
    return HostCheck("engine", OK, f"Docker engine {engine}")


def _runc(version: dict, info: dict, runtime: str, verdicts: dict[str, str]) -> HostCheck:
    runc = _component(version, "runc")
    text = runc.get("Version") or (info.get("RuncCommit") or {}).get("ID", "?")
    build = (runc.get("Details") or {}).get("GitCommit", "")
    v = version_tuple(text)
    notes, fixes = [], []
    if v and v < RUNC_CVE_2019_5736_FIXED:
        notes.append("older than 1.0.0: open to CVE-2019-5736 (/proc/self/exe overwrite)")
        fixes.append("upgrade runc")
    if v and v < RUNC_CVE_2024_21626_FIXED:
        probe = verdicts.get("blocks_workdir_at_leaked_fd", "not run")
        backported = build in BACKPORTS_21626 or text in BACKPORTS_21626
        notes.append(
            f"older than 1.1.12 (CVE-2024-21626, leaked fd as working dir): "
            f"{'the distribution build ' + build + ' carries the fix; ' if backported else ''}"
            f"probe blocks_workdir_at_leaked_fd: {probe}"
        )
        if probe != "HELD":
            fixes.append("upgrade runc to 1.1.12+ (or your distribution's patched build)")
    if (
        v
        and not any(v[:2] == fixed[:2] and v >= fixed for fixed in RUNC_CVE_2025_FIXED)
        and v < RUNC_CVE_2025_FIXED[-1]
    ):
        notes.append(
            "older than 1.2.8/1.3.3: CVE-2025-31133/52565/52881 (masked-path and /dev/console mount "
            "races) need an attacker who chooses the image or its mounts; wakeloop builds its own "
            "image and mounts only the workspace, so they are not reachable from a tool call"
        )
        fixes.append("upgrade runc to 1.2.8, 1.3.3 or later when your distribution ships it")
    where = f"runc {text}" + (f" ({build})" if build else "")
    if runtime != "runc":
        where += f"; sandboxes run under {runtime}, not runc"
    status = WARNING if fixes and runtime == "runc" else OK
    return HostCheck("runc", status, where + (": " + "; ".join(notes) if notes else ""), "; ".join(fixes))


def _daemon_mode(info: dict) -> HostCheck:
    options = " ".join(info.get("SecurityOptions") or [])
    if "name=rootless" in options:
        return HostCheck("daemon", OK, "rootless daemon: an escape lands as an unprivileged user")
    if "name=userns" in options:
        return HostCheck("daemon", OK, "userns-remap: root in a box maps to an unprivileged host uid")
    return HostCheck(
        "daemon",
        WARNING,
        "the daemon runs as root without userns-remap: a kernel or runtime escape lands as host root "
        "(the box's own user is uid 1000 with no capabilities, which is what the probes test)",
        "run rootless Docker (dockerd-rootless-setuptool.sh install), or set "
        '"userns-remap": "default" in /etc/docker/daemon.json, or use runsc',
    )


def _seccomp(info: dict) -> HostCheck:
    options = info.get("SecurityOptions") or []
    seccomp = next((o for o in options if "seccomp" in o), "")
    profile = dict(part.split("=", 1) for part in seccomp.split(",") if "=" in part).get("profile", "")
    if not seccomp:
        return HostCheck(
            "seccomp",
            WARNING,
            "the engine reports no seccomp support: no syscall filter at all",
            "use a kernel and engine built with seccomp (CONFIG_SECCOMP_FILTER, libseccomp)",
        )
    if profile in ("unconfined", ""):
        return HostCheck(
            "seccomp",
            WARNING,
            f"the default seccomp profile is {profile or 'unknown'!r}",
            'remove "seccomp-profile" from /etc/docker/daemon.json to get the builtin default',
        )
    if profile != "default":
        return HostCheck(
            "seccomp",
            OK,
            f"a custom default seccomp profile is in force ({profile}); "
            "the privileges probes show what it lets through",
        )
    return HostCheck("seccomp", OK, "the engine's builtin default seccomp profile is in force")


def _runtime(info: dict, runtime: str) -> HostCheck:
    known = sorted((info.get("Runtimes") or {}).keys())
    if runtime not in known:
        return HostCheck(
            "runtime",
            WARNING,
            f"runtime {runtime!r} is not registered with the engine ({', '.join(known)})",
            'for runsc: scripts/setup-runsc.sh, or add it to "runtimes" in /etc/docker/daemon.json',
        )
    return HostCheck("runtime", OK, f"sandboxes run under {runtime} (registered: {', '.join(known)})")
