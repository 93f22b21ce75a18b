"""The workspace disks as a person reads them: an agent's disk use (`status`), `wakeloop disk list`.

Data first (a dict, what `--json` prints and the console shows), then text.

Not here: the disks themselves (sandbox/disks/disk.py), the rest of an agent's
status (agent_status.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.policy.agent import Agent
from orchestrator.sandbox.disks import disk_index, disk_survey


def disk_status(agent: Agent) -> dict:
    """The workspace's disk use against sandbox.disk and sandbox.files: read from its
    mount over workspace/ while a command has it attached, else from its image's blocks
    on this host (the folder's disk, by its identity: disk_index.lookup); under compose only
    the broker has either."""
    box = agent.policy.sandbox
    data = {"limit_bytes": box.disk or None, "limit_files": box.files if box.disk else None}
    if not box.disk:
        return data
    ws = Path(agent.workspace)
    try:
        mounted = ws.stat().st_dev != ws.parent.stat().st_dev
        vfs = os.statvfs(ws) if mounted else None
    except OSError:
        vfs = None
    if vfs:
        return data | {
            "used_bytes": (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize,
            "size_bytes": vfs.f_blocks * vfs.f_frsize,
            "used_files": vfs.f_files - vfs.f_ffree,
        }
    key = disk_index.lookup(agent.dir.resolve())
    held = disk_survey.usage(key) if key else None
    return data | ({"host_bytes": held[0], "size_bytes": held[1]} if held else {"attached": False})


def disk_record(r: disk_survey.DiskRecord) -> dict:
    """One disk of `wakeloop disk list`, as data (--json)."""
    return {
        "folder": r.folder,
        "folder_found": r.folder_found,
        "image": str(r.image),
        "key": r.key,
        "size_bytes": r.size,
        "host_bytes": r.host_bytes,
        "attached": bool(r.devices),
        "devices": list(r.devices),
        "mounted_at": list(r.mounts),
        "held": r.held,
        "adopted": r.adopted,
        "in_flight": r.in_flight,
    }


def render_disks(records: list, where: Path, fs: disk_survey.Filesystem | None = None) -> str:
    """`wakeloop disk list`: one block per disk, for a person; then what they promise
    together, what they hold, and what their filesystem `fs` has free."""
    if not records:
        return f"no disks in {where}\n"
    lines = []
    for r in records:
        if r.folder_found:
            folder = str(r.folder)
        elif r.folder:
            folder = f"{r.folder} (last seen there; not found under ROOT)"
        else:
            folder = "no folder known (named the old way and not adopted yet, or its folder is gone)"
        if not r.devices:
            attached = "not attached"
        else:
            mounted = f"mounted at {', '.join(r.mounts)}" if r.mounts else "not mounted here"
            attached = (
                f"attached as {', '.join(r.devices)}, {mounted}{', in use' if r.held else ''}"
                f"{', a call running' if r.in_flight else ''}"
            )
        lines += [
            folder,
            f"  image {r.image}",
            f"  {mib(r.size)} promised, {mib(r.host_bytes)} held on the host; {attached}",
        ]
    if fs:
        promised, used = sum(r.size for r in records), sum(r.host_bytes for r in records)
        lines.append(
            f"{len(records)} disk(s) in {where}: {gib(promised)} promised ({promised / fs.size:.1f}x "
            f"the filesystem), {gib(used)} used; the filesystem has {gib(fs.free)} free of "
            f"{gib(fs.size)} ({gib(fs.reserve)} of it a reserve no call may take)"
        )
    return "\n".join(lines) + "\n"


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def disk_line(d: dict) -> str:
    """One line of an agent's status: `disk_status` for a person."""
    if not d["limit_bytes"]:
        return "none (sandbox.disk: none): a plain folder, no limit"
    limit = f"{mib(d['limit_bytes'])} and {d['limit_files']:,} files"
    if "used_bytes" in d:
        return f"{mib(d['used_bytes'])} of {mib(d['size_bytes'])} used, {d['used_files']:,} files (limit {limit})"
    if "host_bytes" in d:
        return f"{mib(d['host_bytes'])} held on the host of {mib(d['size_bytes'])} (limit {limit}; not mounted here)"
    return f"limit {limit}; no disk on this host yet (made at the first wake; under compose the broker has it)"


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"
