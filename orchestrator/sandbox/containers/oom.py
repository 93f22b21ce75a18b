"""Whether the kernel killed something in a container at its memory limit: the
memory cgroup's own count of OOM kills, read from the host.

Under runc a pooled container's launcher reads this count in the box (its
cgroup is visible there, read-only) and reports it on its status line. Under
gVisor the box sees the sentry's cgroups, which count no host OOM kill, and
the killed command does not even die by a signal: the host's OOM killer kills
the sandbox's stub process for the command's address space, and gVisor ends
the command with exit status 1. Only the host can tell that call from an
ordinary exit 1. And for a cold call the engine's own flag (State.OOMKilled)
is lost whenever the box exits soon after the kill: Docker 20.10 took the exit
before its OOM event in about one cold call in eight here, on both runtimes.

So for each pooled container the engine finds, once, when it is started
(off any call's path), the host file holding its memory cgroup's `oom_kill`
count: `memory.events` (cgroup v2) or `memory.oom_control` (v1), where the
engine puts a container's cgroup by default (USUAL_PLACES: one stat, no
request), else under the path /proc/<its pid>/cgroup names (one inspect of
the container, ~6 ms). Reading it at the end of a call costs one small read.
A cold call's guard holds its box, once the command is over, until the host
has read the count the same way (programs.py's GUARD). The
kernel raises the count before it sends the SIGKILL, so once a command is
seen dead of it the count shows it. Nothing in the box can write the
file, nor move the box's first process (the engine names its pid) to another
cgroup: no capability, /sys read-only. So a command that prints "out of
memory" or exits 137 is never counted. Where
this process cannot see the host's cgroups (the broker in its own container,
an engine in a VM or behind TCP) there is no file, and the engine asks the
Docker engine instead (engine.py's _final_state).

Not here: deciding which word counts for a call (engine.py), the launcher's
own reading in the box (programs.py).
"""

from __future__ import annotations

from pathlib import Path

import docker
import docker.errors

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
COUNTER_FILES = ("memory.events", "memory.oom_control")  # v2, v1: each has an "oom_kill N" line
# Where Docker puts container {cid}'s memory cgroup by default, under CGROUP_ROOT:
# the cgroupfs driver on v1 and v2, then the systemd driver on v1 and v2.
USUAL_PLACES = (
    "memory/docker/{cid}/memory.oom_control",
    "docker/{cid}/memory.events",
    "memory/system.slice/docker-{cid}.scope/memory.oom_control",
    "system.slice/docker-{cid}.scope/memory.events",
)


def usual_counter_file(cid: str, root: Path = CGROUP_ROOT) -> Path | None:
    """Container `cid`'s OOM count where the engine puts it by default, if it is there
    (an engine given another cgroup parent: None, and counter_file finds it)."""
    if not cid:
        return None
    for place in USUAL_PLACES:
        path = root / place.format(cid=cid)
        if path.is_file() and read_kills(path) is not None:
            return path
    return None


def counter_file(pid: int, cid: str, proc: Path = PROC, root: Path = CGROUP_ROOT) -> Path | None:
    """The host file counting OOM kills in the memory cgroup of process `pid`, which
    must be container `cid`'s (its id in the cgroup's path: a reused pid is not it);
    None where this process cannot see it."""
    if pid <= 0:
        return None
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3 or not cid or cid not in fields[2]:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2: one unified hierarchy
            where = root / path.lstrip("/")
        elif "memory" in controllers.split(","):
            where = root / "memory" / path.lstrip("/")
        else:
            continue
        for name in COUNTER_FILES:
            if (where / name).is_file() and read_kills(where / name) is not None:
                return where / name
    return None


def read_kills(path: Path) -> int | None:
    """The count of OOM kills in that cgroup so far; None if it cannot be read
    (the container is gone, or a kernel older than 4.13 keeps no count)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def counter_file_of(client: docker.DockerClient, cid: str) -> Path | None:
    """Where the host counts a running container's OOM kills; None where this process
    cannot see it."""
    usual = usual_counter_file(cid)
    if usual:
        return usual
    try:
        pid: int = client.api.inspect_container(cid)["State"]["Pid"]
    except docker.errors.DockerException:
        return None
    return counter_file(pid, cid)


def killed_at_once(launcher_said: str | None, counted: Path | None, exit_code: int) -> bool | None:
    """Whether a pooled call was killed at its memory limit, from a count the kernel
    keeps: the one its launcher read in the box (runc: "0" or "1"), else the one read
    here on the host (gVisor, whose box shows no such count, and whose command killed at
    the limit merely exits 1). None when only the engine can tell."""
    if launcher_said in ("0", "1"):
        return launcher_said == "1"
    kills = read_kills(counted) if counted else None
    if kills is not None:
        return kills > 0
    # No count here (this process does not see the host's cgroups: the broker in its
    # own container, a remote engine). A command that ended 0 was not killed; any
    # other status is the engine's to explain, at the cost of waiting for the exit.
    return False if exit_code == 0 else None
