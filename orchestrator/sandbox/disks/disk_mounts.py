"""Where a disk is mounted: its root at KEY.view (ours, noexec), files/ at KEY.box (what boxes bind).

Every mount goes on a folder opened without following a link, or on a path in
$WAKELOOP_DISKS (root's): nothing done under ROOT redirects one. Where the
engine mounts the disk itself (engine_mounts.py), KEY.box stays empty and the
engine's volumes of it are dropped here.

Not here: a wake's overlay on top of KEY.box (wake_layer.py), the loop device
(disk_image.py), when a disk is mounted or unmounted (disk_attach.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import docker
import docker.errors

from orchestrator.sandbox.disks import engine_mounts
from orchestrator.sandbox.disks.disk import VOLUME_PREFIX, DiskError, path_of, tool

BOX_OPTIONS = "nosuid,nodev"  # KEY.box, files/ bound where the box's volume binds it
VIEW_OPTIONS = "nosuid,nodev,noexec,discard"  # ours: nothing on it runs on the host


def no_device_volume(client: docker.DockerClient, key: str, strict: bool = False) -> None:
    """The engine's volume of the device gone: an older wakeloop's (its boxes mounted the disk's
    root by it), or, where KEY.engine says the engine mounted this disk (engine_mounts.py), that
    and its keeper and wakes' volumes. One API call when it never did: this runs at every attach.
    Not `strict`: one still in use (by a container of an older wakeloop) stays, unused from now on."""
    marker = path_of(key, "engine")
    try:
        if marker.exists():
            engine_mounts.let_go(client, key)
            marker.unlink()
        else:
            client.api.remove_volume(VOLUME_PREFIX + key, force=True)
    except docker.errors.NotFound:
        pass
    except (docker.errors.DockerException, engine_mounts.EngineMountError):
        if strict:
            raise


def bind_box(files: Path, box: Path) -> None:
    """files/ bound at KEY.box, nosuid and nodev but not noexec (the box runs what the agent
    wrote), unless something is mounted there already (another holder's bind, or a running
    wake's overlay over it). Both paths are in $WAKELOOP_DISKS, root's: named by path."""
    box.mkdir(mode=0o700, exist_ok=True)
    if not _mount_point(box):
        tool("mount", "--no-canonicalize", "--bind", "-o", BOX_OPTIONS, str(files), str(box))


def _mount_point(path: Path) -> bool:
    return os.stat(path).st_dev != os.stat(path.parent).st_dev


def unmount_box(key: str) -> bool:
    if not wake_mounted(key):
        return False
    tool("umount", str(path_of(key, "box")))
    return True


def wake_mounted(key: str) -> bool:
    """Whether a wake's overlay is mounted over KEY.box, as this process sees the mounts."""
    box = str(path_of(key, "box"))
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        cut = fields.index("-")
        if fields[4].encode().decode("unicode_escape") == box and fields[cut + 1] == "overlay":
            return True
    return False


def mount_view(device: str, view: Path, source: Path | None = None) -> None:
    """Mount at the folder `view` names now, never at a path: whoever may write the agent
    folder could swap workspace/ for a link between a check and mount(8), which follows
    links in its target (root's disk on /etc/profile.d). So the folder is opened first,
    without following a link, and the mount goes on that open folder (/proc/self/fd/N in
    mount's own process, not canonicalized). `source`: a folder of the device's view
    (files/), bound there; it keeps the view's nosuid, nodev and noexec."""
    view.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(view, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise DiskError(
            f"sandbox.disk: {view} is not a folder wakeloop can mount on ({exc.strerror}); "
            "a disk is mounted only over a real folder, never through a link"
        ) from None
    try:
        if os.fstat(fd).st_dev == os.stat(device).st_rdev:
            return  # mounted there already
        if source is not None:
            tool("mount", "--no-canonicalize", "--bind", str(source), f"/proc/self/fd/{fd}", pass_fds=(fd,))
            return
        tool(
            "mount",
            "--no-canonicalize",
            "-t",
            "ext4",
            "-o",
            VIEW_OPTIONS,
            device,
            f"/proc/self/fd/{fd}",
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)


def mounts_of(device: str) -> list[str]:
    """Where `device` is mounted in this process's namespace, deepest first."""
    rdev = os.stat(device).st_rdev
    wanted = f"{os.major(rdev)}:{os.minor(rdev)}"
    targets = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[2] == wanted:
            targets.append(fields[4].encode().decode("unicode_escape"))
    return sorted(targets, key=len, reverse=True)
