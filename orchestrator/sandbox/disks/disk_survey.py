"""What is there: every disk image, its folder, its devices and mounts, for `wakeloop disk list`.

Reads only: no root needed beyond reading $WAKELOOP_DISKS (sysfs and
mountinfo are world-readable); whether a disk is held or has a call in flight
is told only where this process may write there.

Not here: rendering the list (views/diskview.py), the CLI's `disk
list|release|rm` (cli/disk_commands.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.sandbox.disks.disk import DiskError, disks_dir, path_of
from orchestrator.sandbox.disks.disk_attach import held
from orchestrator.sandbox.disks.disk_image import loops
from orchestrator.sandbox.disks.disk_index import IndexEntry, identity_of, read_index
from orchestrator.sandbox.disks.disk_mounts import mounts_of
from orchestrator.sandbox.disks.disk_room import RESERVE, in_flight


@dataclass(frozen=True)
class DiskRecord:
    """One image in $WAKELOOP_DISKS, as `disk list` shows it."""

    key: str
    image: Path
    folder: str | None  # the agent folder it belongs to (found under ROOT, or last seen)
    folder_found: bool  # the folder was found (under ROOT) by its identity just now
    adopted: bool  # named the old way and adopted by its folder
    size: int  # bytes promised: the disk's size
    host_bytes: int  # bytes the sparse image holds on the host
    devices: tuple[str, ...]  # loop devices backed by it: attached if any
    mounts: tuple[str, ...]  # where those are mounted (in this namespace)
    held: bool | None  # a wake or a box holds it now (None: cannot tell without root)
    in_flight: bool | None = None  # a call of it runs now (None: cannot tell without root)


@dataclass(frozen=True)
class Filesystem:
    """The filesystem that holds the disks, as `disk list` shows it."""

    size: int
    free: int  # f_bavail: what the disks may still take, the reserve included
    reserve: int  # RESERVE of it, left out of every call's room


def filesystem() -> Filesystem:
    st = os.statvfs(disks_dir())
    return Filesystem(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, int(st.f_blocks * st.f_frsize * RESERVE))


def survey(root: Path | None = None) -> list[DiskRecord]:
    """Every disk image, with its folder and whether it is attached. Reads only: no
    root needed beyond reading $WAKELOOP_DISKS (sysfs and mountinfo are world-readable)."""
    index = read_index()
    found = _folders_under(root, index) if root else {}
    backing = loops()
    records = []
    for image in sorted(disks_dir().glob("*.img")):
        key, st = image.stem, image.stat()
        entry = index.get(key, {})
        devices = tuple(sorted(dev for dev, file in backing.items() if file == str(image)))
        try:
            holding = held(key) if os.access(disks_dir(), os.W_OK) else None
            flying = in_flight(key) if os.access(disks_dir(), os.W_OK) else None
        except OSError:
            holding = flying = None
        records.append(
            DiskRecord(
                key,
                image,
                str(found[key]) if key in found else entry.get("folder"),
                key in found,
                bool(entry.get("adopted")),
                st.st_size,
                st.st_blocks * 512,
                devices,
                tuple(t for dev in devices for t in mounts_of(dev)),
                holding,
                flying,
            )
        )
    return records


def _folders_under(root: Path, index: dict[str, IndexEntry]) -> dict[str, Path]:
    """key -> the folder directly under ROOT that has that disk's identity."""
    out = {}
    for child in sorted(Path(root).iterdir()):
        try:
            if not child.is_dir() or child.is_symlink():
                continue
            ident = identity_of(child)
        except (DiskError, OSError):
            continue
        key = next((k for k, e in index.items() if ident.matches(e)), None)
        if key:
            out[key] = child.resolve()
    return out


def keys() -> set[str]:
    """Every disk in $WAKELOOP_DISKS, attached or not."""
    return {image.stem for image in disks_dir().glob("*.img")}


def devices(key: str) -> list[str]:
    """The loop devices backed by this disk's image now, one on its way out (detached, still open) too."""
    image = str(path_of(key, "img"))
    return sorted(device for device, backing in loops().items() if backing == image)


def usage(key: str) -> tuple[int, int] | None:
    """(bytes the image holds on the host, the disk's size), or None if it has none."""
    try:
        st = path_of(key, "img").stat()
    except OSError:
        return None
    return st.st_blocks * 512, st.st_size
