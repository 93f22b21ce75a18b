"""Whether the kernel killed something in a container at its memory limit: the
memory cgroup's own count of OOM kills, read from the host.

Under runc a pooled container's launcher reads this count in the box (its
cgroup is visible there, read-only) and reports it on its status line. Under
gVisor the box sees the sentry's cgroups, which count no host OOM kill, and
the killed command does not even die by a signal: the host's OOM killer kills
the sandbox's stub process for the command's address space, and gVisor ends
the command with exit status 1. Only the host can tell that call from an
ordinary exit 1.

So for each pooled container the engine finds, once, when it is started
(off any call's path), the host file holding its memory cgroup's `oom_kill`
count: `memory.events` (cgroup v2) or `memory.oom_control` (v1), under the
path /proc/<its pid>/cgroup names. Reading it at the end of a call costs one
small read. The kernel raises the count before it sends the SIGKILL, so once
a command is seen dead of it the count shows it. Nothing in the box can write
the file or choose its path (found before the box was handed any command), so
a command that prints "out of memory" or exits 137 is never counted. Where
this process cannot see the host's cgroups (the broker in its own container,
an engine in a VM or behind TCP) there is no file, and the engine asks the
Docker engine instead (engine.py's _final_state).

Not here: deciding which word counts for a call (engine.py), the launcher's
own reading in the box (programs.py).
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
COUNTER_FILES = ("memory.events", "memory.oom_control")   # v2, v1: each has an "oom_kill N" line


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
        _, controllers, path = line.split(":", 2)
        if cid not in path:
            continue
        if controllers == "":                   # v2: one unified hierarchy
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
