"""Who else has a disk mounted: the mount namespaces, other than this process's, that hold a loop device.

A mount copied into another mount namespace (`unshare -m`, a lab's node made
with `mount --make-rprivate /`, a runtime's container started while the disk
was mounted) keeps the disk's loop device open after every mount of ours is
gone, so a detach waits for it in vain. This names each such namespace by one
of its processes and one of its mount points of the device, and says how to
let go of it there. Reads only /proc and the devices' numbers: no root needed
beyond reading other processes' mount tables (root's, for another user's).

Not here: attaching, unmounting and detaching (disk_attach.py).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Holder:
    """One namespace that has `device` mounted: a process of it, and where it sees the mount."""

    device: str  # /dev/loopN
    pid: int  # the lowest pid in that mount namespace
    command: str  # that process's name (/proc/PID/comm)
    mount: str  # one of the device's mount points there, as that namespace names it

    def describe(self) -> str:
        return f"{self.device} mounted at {self.mount} in the mount namespace of pid {self.pid} ({self.command})"

    def release(self) -> str:
        """The command that lets go of it there (or end that process)."""
        return f"nsenter -t {self.pid} -m umount -l {shlex.quote(self.mount)}"


def holders(devices: Iterable[str]) -> list[Holder]:
    """Every other mount namespace that has one of `devices` mounted: one Holder per
    namespace and device, in pid order."""
    wanted = {}  # "major:minor" as mountinfo writes it -> the device
    for device in devices:
        try:
            rdev = os.stat(device).st_rdev
        except OSError:
            continue  # gone already: nobody holds it
        wanted[f"{os.major(rdev)}:{os.minor(rdev)}"] = device
    if not wanted:
        return []
    seen = {_namespace("self")}
    found = []
    for pid in sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        namespace = _namespace(str(pid))
        if namespace is None or namespace in seen:
            continue
        seen.add(namespace)
        mounts = _mounts(pid, set(wanted))
        found += [Holder(wanted[numbers], pid, _comm(pid), mount) for numbers, mount in mounts.items()]
    return found


def _namespace(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:  # gone, a kernel thread, or not ours to read
        return None


def _mounts(pid: int, wanted: set[str]) -> dict[str, str]:
    """major:minor -> its first mount point in `pid`'s mount table, for those in `wanted`."""
    try:
        with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in lines:
        fields = line.split()
        if len(fields) > 4 and fields[2] in wanted and fields[2] not in found:
            found[fields[2]] = _unescape(fields[4])
    return found


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash in octal (\\040)."""
    for escaped, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(escaped, char)
    return path


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as comm:
            return comm.read().strip() or "?"
    except OSError:
        return "?"
