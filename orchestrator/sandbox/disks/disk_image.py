"""A disk's image: made from the workspace folder, given a loop device, grown.

`sandbox.disk` and `sandbox.files` make a sparse ext4 image per agent
(`mkfs.ext4 -m 0 -N files`), attached to a loop device and given to each box
as a bind of its files/:

An existing workspace folder is copied into the new image (`mkfs.ext4 -d`),
once, with a line saying so; the folder's own copy is left as it is, unused.

Not here: the mounts of the image's filesystem (disk_mounts.py), the room it
may take on the host (disk_room.py), when it is made (disk_attach.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.sandbox.disks.disk import TOOL_TIMEOUT_S, DiskError, disks_dir, locked, tool
from orchestrator.sandbox.disks.disk_room import ROOM_LOCK, check_promise, flight

CAP_SYS_RESOURCE = 24  # linux/capability.h: ext4's online resize asks for it


def create(image: Path, size: int, files: int, seed: Path, overcommit: float) -> str | None:
    """A sparse image holding a copy of `seed`; -m 0: no blocks kept back for root.
    mkfs writes it as a call would: only with room for its worst case (the guard)."""
    fd = os.open(seed, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # never a symlinked folder
    partial = image.with_suffix(".partial")
    try:
        st = os.fstat(fd)
        entries = os.listdir(fd)
        with locked(disks_dir() / ROOM_LOCK):  # the check and the claim, one process at a time
            check_promise(size, overcommit)
            with open(partial, "wb") as f:
                f.truncate(size)
        options = f"nodiscard,lazy_itable_init=1,lazy_journal_init=1,root_owner={st.st_uid}:{st.st_gid}"
        with flight(image.stem):  # mkfs fsyncs what it wrote before it exits: nothing left to settle
            done = subprocess.run(
                [
                    "mkfs.ext4",
                    "-q",
                    "-F",
                    "-m",
                    "0",
                    "-N",
                    str(files),
                    "-E",
                    options,
                    "-d",
                    f"/proc/self/fd/{fd}",
                    str(partial),
                ],
                pass_fds=(fd,),
                capture_output=True,
                text=True,
                timeout=TOOL_TIMEOUT_S,
            )
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        why = (done.stderr.strip().splitlines() or ["mkfs.ext4 failed"])[-1]
        raise DiskError(
            f"sandbox.disk: cannot make the workspace's disk from {seed} ({size:,} bytes, {files:,} files): {why}"
        )
    partial.chmod(0o600)
    partial.rename(image)
    # The folder's own copy stays where it is (beneath the disk's mount, when that is
    # over it): never deleted by us, and no longer used.
    return (
        (
            f"copied {len(entries)} entries of {seed} into the agent's new disk {image}; the folder's "
            "own copy is no longer used (beneath the disk's mount if it is mounted there)"
        )
        if entries
        else None
    )


def attach_loop(image: Path) -> str:
    """The loop device of `image`: the one it has, or a free one (--nooverlap)."""
    return tool("losetup", "--nooverlap", "--find", "--show", str(image)).strip()


def grow(image: Path, device: str, size: int, overcommit: float) -> str | None:
    """A policy that asks for more: grow the mounted filesystem in place (ext4's online
    resize, which needs CAP_SYS_RESOURCE). Less, or no such capability: say so."""
    have = image.stat().st_size
    anew = f"to make it anew, stop the agent, copy its files out and remove {image}"
    if size < have:
        return f"sandbox.disk asks for {size:,} bytes but the disk has {have:,}; a disk does not shrink: {anew}"
    if size > have and not capable(CAP_SYS_RESOURCE):
        return (
            f"sandbox.disk asks for {size:,} bytes but the disk has {have:,}: growing a disk in use "
            f"needs CAP_SYS_RESOURCE, which this process lacks; {anew}"
        )
    if size > have:
        with locked(disks_dir() / ROOM_LOCK):
            check_promise(size - have, overcommit)
            os.truncate(image, size)
        tool("losetup", "--set-capacity", device)
        tool("resize2fs", device)
    return None


def capable(cap: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def loops() -> dict[str, str]:
    """/dev/loopN -> the file backing it, from sysfs (readable without root)."""
    out = {}
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            out["/dev/" + backing.parent.parent.name] = backing.read_text().strip()
        except OSError:
            continue
    return out


def devices_of(image: Path) -> list[str]:
    out = tool("losetup", "--noheadings", "--output", "NAME", "--associated", str(image), check=False)
    return [line.strip() for line in out.splitlines() if line.strip()]
