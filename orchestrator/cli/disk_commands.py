"""`wakeloop disk list|release|rm`: the agents' workspace disks.

Not here: the disks (sandbox/disks/disk.py), how they are shown (views/diskview.py).
"""

from __future__ import annotations

import os

from orchestrator.cli.declare import command, group, json_flag, print_json
from orchestrator.cli.wake_lock import no_wake
from orchestrator.errors import EXIT_OK
from orchestrator.policy.agent import AgentError
from orchestrator.sandbox.containers.engine_client import connect


def cmd_disk_list(args) -> int:
    from pathlib import Path

    from orchestrator.sandbox.disks import disk, disk_survey
    from orchestrator.views.diskview import disk_record, render_disks

    root = Path(args.root) if args.root else None
    if root and not root.is_dir():
        raise AgentError(f"{root} is not a folder; give the folder that holds the agents")
    try:
        records = disk_survey.survey(root)
    except PermissionError:
        raise disk.DiskError(
            f"cannot read {disk.disks_dir()} (the disks' folder is root's): run `sudo wakeloop disk list`"
        ) from None
    if args.json:
        print_json([disk_record(r) for r in records])
    else:
        print(render_disks(records, disk.disks_dir(), disk_survey.filesystem() if records else None), end="")
    return EXIT_OK


def _disk_of(agent_dir: str):
    """(the agent folder, its disk's key) for `disk release|rm`, or one line saying why not."""
    from pathlib import Path

    from orchestrator.sandbox.disks import disk, disk_index

    folder = Path(agent_dir).resolve()
    if not folder.is_dir():
        raise AgentError(f"{agent_dir} is not a folder; give an agent's folder, e.g. agents/mine")
    key = disk_index.lookup(folder)
    if key is None or not disk.path_of(key, "img").exists():
        raise disk.DiskError(
            f"{agent_dir} has no disk in {disk.disks_dir()} (`wakeloop disk list` shows every disk and its folder)"
        )
    return folder, key


def cmd_disk_release(args) -> int:
    from orchestrator.sandbox.disks import disk, disk_attach

    _need_root(disk)  # first: without root the index cannot be read, and no disk would be found
    folder, key = _disk_of(args.agent_dir)
    if not disk_attach.release(connect(), key):
        raise disk.DiskError(
            f"the disk of {args.agent_dir} is in use (a wake, a `sandbox exec` or the "
            "broker holds it); it is released when that ends"
        )
    print(f"released the disk of {folder}: unmounted and detached; the image {disk.path_of(key, 'img')} is kept")
    return EXIT_OK


def cmd_disk_rm(args) -> int:
    from orchestrator.sandbox.disks import disk, disk_attach

    _need_root(disk)  # first: without root the index cannot be read, and no disk would be found
    folder, key = _disk_of(args.agent_dir)
    image = disk.path_of(key, "img")
    if not args.yes:
        raise AgentError(
            f"this deletes {image}, the workspace's files of {folder}, for good; "
            f"add --yes: `wakeloop disk rm {args.agent_dir} --yes`"
        )
    # held while we delete: no wake starts on a disk going away
    with no_wake(args.agent_dir, folder / "state", disk.DiskError, "try again when the wake ends"):
        if not disk_attach.release(connect(), key, delete=True):
            raise disk.DiskError(
                f"the disk of {args.agent_dir} is in use (a `sandbox exec` or the broker "
                "holds it); try again when that ends"
            )
    print(f"deleted the disk of {folder} ({image}); its next wake makes a new one from workspace/")
    return EXIT_OK


def _need_root(disk) -> None:
    if os.geteuid() != 0:
        raise disk.DiskError("releasing or deleting a disk needs root (umount, losetup): run it with sudo")


def add_disk(commands) -> None:
    """`wakeloop disk list [ROOT]|release AGENT_DIR|rm AGENT_DIR --yes`."""
    disks = group(commands, "disk", "the agents' workspace disks: list, release, delete", "wakeloop disk list agents/")
    p = command(
        disks,
        "list",
        "every disk in $WAKELOOP_DISKS: its agent folder, size, bytes on the host, attached or not (reads only)",
        "wakeloop disk list agents/ --json",
        cmd_disk_list,
    )
    p.add_argument("root", nargs="?", metavar="ROOT", help="find each disk's folder among the agents here")
    json_flag(p, "the disks as a JSON list")
    p = command(
        disks,
        "release",
        "unmount and detach an agent's disk now (the image is kept; the next wake attaches it again)",
        "sudo wakeloop disk release agents/mine",
        cmd_disk_release,
    )
    p.add_argument("agent_dir")
    p = command(
        disks,
        "rm",
        "delete an agent's disk, its workspace's files with it (refused while it wakes)",
        "sudo wakeloop disk rm agents/old --yes",
        cmd_disk_rm,
    )
    p.add_argument("agent_dir")
    p.add_argument("--yes", action="store_true", help="yes, delete the workspace's files for good")
