"""A disk attached for its holders, let go by each, released when nobody holds it.

Life cycle: each holder of a disk (a DockerSandbox: a wake, a one-shot
command, a broker's kept box) counts as a holder while it has the disk: in
its process, a count per disk; between processes, a shared POSIX record lock
on `KEY.use`, taken by the process's first holder and dropped by its last.
`release` tests it exclusive, without waiting, and so unmounts, removes the
volume and detaches only a disk nobody holds. A holder lets go (and releases
if it was the last) when it closes: at the end of every one-shot command, a
broker's box after its idle time. The image is kept. Record locks, not
flock: a child forked by any thread (losetup for another agent, a notify
command) shares flock's open file until it execs, so a release right after
the last holder closed found the disk held in 2 of 3 tries under forks in a
loop, and left it mounted; a record lock belongs to the process and is never
inherited by a child.

Needs root (losetup, mount) and loop devices. Without them a policy that
sets sandbox.disk is refused in one line; `sandbox.disk: none` runs on a
plain folder with no disk limit, as before. Reading the list needs neither.

Not here: which disk a folder has (disk_index.py), making and growing the
image (disk_image.py), the mounts (disk_mounts.py), when a box closes
(engine.py, keeper.py), the CLI's `disk release|rm` (cli/disk_commands.py).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import docker
import docker.errors

from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.disks import disk_holders, engine_mounts, layers
from orchestrator.sandbox.disks.disk import (
    Disk,
    DiskError,
    Hold,
    disks_dir,
    holding,
    locked,
    nobody_holds,
    path_of,
    tool,
)
from orchestrator.sandbox.disks.disk_image import attach_loop, create, devices_of, grow, loops
from orchestrator.sandbox.disks.disk_index import forget
from orchestrator.sandbox.disks.disk_mounts import bind_box, mount_view, mounts_of, no_device_volume, unmount_box
from orchestrator.sandbox.disks.disk_room import OVERCOMMIT, settled

TOOLS = ("losetup", "mkfs.ext4", "resize2fs", "mount", "umount")
DETACH_WAIT_S = 10  # a detached loop device goes when its last opener closes it
# (udev's probe, the engine's unmount): ~0.1-1 s, bounded here
DETACH_POLL_S = 0.02  # how often sysfs is read meanwhile


def unavailable() -> str | None:
    """Why this process cannot attach a disk on this host, or None."""
    if os.geteuid() != 0:
        return "attaching a workspace disk needs root (losetup and mount)"
    if not os.path.exists("/dev/loop-control"):
        return "this host has no loop devices (/dev/loop-control is missing)"
    missing = [name for name in TOOLS if not shutil.which(name)]
    if missing:
        return f"{', '.join(missing)} not found (Debian: e2fsprogs, mount)"
    return None


def refusal(reason: str) -> DiskError:
    """The one line a person gets where a disk cannot be attached: why, and the three ways on."""
    return DiskError(
        f"sandbox.disk: {reason}; run wakeloop as root or through the broker "
        "(`docker compose up`), or set `sandbox.disk: none` in the policy for a "
        "workspace with no disk limit"
    )


def require() -> None:
    """Refuse (one line) before anything in $WAKELOOP_DISKS is touched where this process
    cannot attach a disk: a user in the docker group who is not root reaches the engine
    but not root's index.lock, and would otherwise meet a PermissionError there."""
    reason = unavailable()
    if reason:
        raise refusal(reason)


def attach(
    client: docker.DockerClient,
    *,
    key: str,
    size: int,
    files: int,
    seed: Path,
    person: Path | None = None,
    overcommit: float = OVERCOMMIT,
    engine_mounts_in: str | None = None,
) -> Disk:
    """The agent's disk, made if it is new (from `seed`, the workspace folder as it
    is), attached, its root mounted at KEY.view and arranged (layers.py), its files/
    bound at KEY.box, and (`person`: the agent's workspace/ when wakeloop runs the
    engine itself) bound there; held (its `use` lock, shared) until let_go. Made or
    grown only while the disks' sizes together stay within `overcommit` times their
    filesystem. `engine_mounts_in` (an image; a broker whose mounts the engine cannot
    see): the engine mounts the disk itself, kept by a container of that image
    (engine_mounts.py), and KEY.box stays empty."""
    require()
    disks_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    image = path_of(key, "img")
    with locked(path_of(key, "lock")):
        hold = Hold(key)  # first: a release waiting for this lock then finds the disk held
        try:
            note = None
            if not image.exists():
                note = create(image, size, files, seed, overcommit)
            device = attach_loop(image)
            note = grow(image, device, size, overcommit) or note
            view = path_of(key, "view")
            mount_view(device, view)
            try:
                moved = layers.arrange(view)  # a new disk is made so here: only an old one's move is news
                note = note or moved
            except OSError as exc:
                raise DiskError(
                    f"sandbox.disk: cannot arrange the disk {image} (files/ beside .wakeloop/): {exc}"
                ) from None
            engine_root = None
            if engine_mounts_in:
                path_of(key, "box").mkdir(mode=0o700, exist_ok=True)  # where a wake's reads mount (wake_layer)
                path_of(key, "engine").touch(mode=0o600)  # first: a release then drops what keep made
                try:
                    engine_root = engine_mounts.keep(client, key, device, image, engine_mounts_in)
                except engine_mounts.EngineMountError as exc:
                    raise DiskError(str(exc)) from None
            else:
                no_device_volume(client, key)
                bind_box(layers.files(view), path_of(key, "box"))
            if person is not None:
                mount_view(device, person, source=layers.files(view))
        except BaseException:
            hold.drop()
            raise
    return Disk(key, image, device, view, note, hold, engine_root, client if engine_root else None)


def let_go(client: docker.DockerClient, held: Disk) -> str | None:
    """This holder is done with the disk: release it if nobody else holds it. Never raises
    (it runs at the end of a command, whatever ended it): the reason it could not, or None."""
    if held.hold is None:
        return None
    settled(held.key)
    if not held.hold.drop():
        return None
    try:
        release(client, held.key)
    except (SandboxError, docker.errors.DockerException, OSError) as exc:
        return f"could not release the disk {held.image}: {exc}; `wakeloop disk release` retries"
    return None


def let_go_all(client: docker.DockerClient, kept: frozenset[Hold] = frozenset()) -> list[str]:
    """Every disk this process still holds but those in `kept` (a command's end, whatever
    ended it): let go, each released if nobody else holds it."""
    left = [hold for hold in holding() if hold not in kept]
    problems = []
    for hold in left:
        settled(hold.key)
        if hold.drop():
            try:
                release(client, hold.key)
            except (SandboxError, docker.errors.DockerException, OSError) as exc:
                problems.append(f"could not release the disk {path_of(hold.key, 'img')}: {exc}")
    return problems


def release(client: docker.DockerClient, key: str, *, delete: bool = False, force: bool = False) -> bool:
    """Unmount the disk everywhere this process sees it, remove its volume, detach
    its loop device; with `delete`, the image too (its files are gone). Only a disk
    nobody holds (False, nothing done, while a wake or a box has it), unless `force`
    (the tests' own cleanup of what a test left)."""
    image = path_of(key, "img")
    if not disks_dir().is_dir():
        return True
    settled(key)  # its syncfs holds the mount open: an unmount beside it fails EBUSY (a forced release too)
    with locked(path_of(key, "lock")):
        # A holder is made only under this lock (attach): none can appear until it is let go.
        if not nobody_holds(key) and not force:
            return False
        _detach(client, key, image)
        if delete:
            image.unlink(missing_ok=True)
            for kind in ("view", "box"):  # mount points, empty once unmounted
                if path_of(key, kind).is_dir():
                    path_of(key, kind).rmdir()
            forget(key)
    if delete:  # the lock files last: nobody waits on them now
        for kind in ("use", "call", "engine", "lock"):
            path_of(key, kind).unlink(missing_ok=True)
    return True


def held(key: str) -> bool:
    """Whether a wake, a one-shot command or a broker's box holds this disk now."""
    if not path_of(key, "use").exists():
        return False
    return not nobody_holds(key)


def _detach(client: docker.DockerClient, key: str, image: Path) -> None:
    unmount_box(key)  # a wake's overlay over KEY.box first: it holds the disk
    for device in devices_of(image):
        rdev = os.stat(device).st_rdev
        for target in mounts_of(device):
            # umount takes a path and removes the mount on top there: never another disk's.
            if os.stat(target).st_dev != rdev:
                raise DiskError(
                    f"sandbox.disk: {image} is mounted at {target} beneath another mount; release that one first"
                )
            tool("umount", target)
    try:
        no_device_volume(client, key, strict=True)  # first: the engine's mounts of the device, if any
    except (docker.errors.DockerException, engine_mounts.EngineMountError) as exc:
        raise DiskError(f"sandbox.disk: cannot drop the engine's mounts of {image}: {exc}") from None
    devices = devices_of(image)
    for device in devices:
        # Not checked: a device still open (udev's probe, the engine's last unmount) is
        # detached when it closes, and one another release detached first is gone.
        tool("losetup", "-d", device, check=False)
    deadline = time.monotonic() + DETACH_WAIT_S
    while any(loops().get(device) == str(image) for device in devices):
        if time.monotonic() > deadline:  # released means gone: its last writes are in the image
            raise DiskError(
                f"sandbox.disk: {', '.join(devices)} still open {DETACH_WAIT_S:g} s after "
                f"detaching ({_who_holds(devices)}); it goes when that closes it"
            )
        time.sleep(DETACH_POLL_S)


def _who_holds(devices: list[str]) -> str:
    """Another mount namespace's copy of a mount (a lab's node, `unshare -m`), named with the way out."""
    found = disk_holders.holders(devices)
    if not found:
        return "by another process?"
    return "; ".join(f"{h.describe()}: `{h.release()}` lets go" for h in found)


def unmount_wake(held: Disk) -> bool:
    """A wake's overlay gone from where boxes get it: unmounted from KEY.box, or (the engine's
    mounts) its volume dropped with every container that uses it. True if there was one."""
    if held.engine_root is None or held.engine is None:
        return unmount_box(held.key)
    try:
        return engine_mounts.drop_wake(held.engine, held.key)
    except (engine_mounts.EngineMountError, docker.errors.DockerException) as exc:
        raise DiskError(str(exc)) from None
