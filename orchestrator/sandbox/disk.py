"""An agent's workspace on a filesystem of its own, so the kernel bounds its bytes and files.

`sandbox.disk` and `sandbox.files` make a sparse ext4 image per agent
(`mkfs.ext4 -m 0 -N files`), attached to a loop device and given to each box
as a volume of the engine's `local` driver (type ext4, device /dev/loopN):

- a full workspace is ENOSPC in the box, and the host's free space is
  untouched: `fallocate --keep-size`, sparse files, hard links and
  directories count like anything else, because it is the filesystem's;
- a box names its workspace by a device, never by a host path: nothing done
  to paths under ROOT, at any moment (a pool refill included), redirects a
  box's mount, and /proc/self/mountinfo in the box shows /dev/loopN, not
  where the workspace lives;
- every mount of it is nosuid and nodev; `discard` hands a deleted file's
  blocks back to the host.

The same device is mounted (nosuid, nodev, noexec) where this process reads
the workspace (workspace.py): over the agent's workspace/ when wakeloop runs
the engine itself, so a person sees the files where they always were; at a
path of its own in the broker, which the orchestrator cannot rename. Images
live in $WAKELOOP_DISKS (default /var/lib/wakeloop/disks), outside every
agent's folder: a taken-over orchestrator cannot hand the kernel a crafted
filesystem, nor point the loop device at another file.

An existing workspace folder is copied into the new image (`mkfs.ext4 -d`),
once, with a line saying so; the folder's own copy is left as it is, unused.

Needs root (losetup, mount) and loop devices. Without them a policy that
sets sandbox.disk is refused in one line; `sandbox.disk: none` runs on a
plain folder with no disk limit, as before.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
from docker.types import Mount

from orchestrator.sandbox.box import WORKSPACE, SandboxError

DISKS_ENV = "WAKELOOP_DISKS"
DEFAULT_DISKS = Path("/var/lib/wakeloop/disks")
VOLUME_PREFIX = "wakeloop-disk-"
LABEL = "wakeloop.disk"                 # on each volume: the image it mounts
BOX_OPTIONS = "nosuid,nodev,discard"    # the box's mount (the engine's local driver)
VIEW_OPTIONS = "nosuid,nodev,noexec,discard"   # ours: nothing on it runs on the host
TOOLS = ("losetup", "mkfs.ext4", "resize2fs", "mount", "umount")
CAP_SYS_RESOURCE = 24                   # linux/capability.h: ext4's online resize asks for it
TOOL_TIMEOUT_S = 120                    # mkfs -d of a large folder; the rest take milliseconds
RESERVE = 0.05                          # of the disks' filesystem, never promised to any disk
ROOM_LOCK = "room.lock"                 # in the disks' directory: one process at a time claims room


class DiskError(SandboxError):
    """The workspace's disk cannot be made or attached: one line, with what to do."""


@dataclass(frozen=True)
class Disk:
    key: str
    image: Path
    device: str          # /dev/loopN
    view: Path           # where this process has it mounted, to read
    note: str | None = None   # a migration or a size it could not take, for the person

    @property
    def volume(self) -> str:
        return VOLUME_PREFIX + self.key

    def mount(self) -> Mount:
        """The box's one mount: the volume, by name; no_copy: the image's /workspace stays out."""
        return Mount(target=WORKSPACE, source=self.volume, type="volume", no_copy=True)


def disks_dir(environ=os.environ) -> Path:
    return Path(environ.get(DISKS_ENV) or DEFAULT_DISKS)


def path_of(key: str, kind: str) -> Path:
    """A disk's files in $WAKELOOP_DISKS: `img` (the image), `lock`, `view` (a broker's mount point)."""
    return disks_dir() / f"{key}.{kind}"


def key_for(agent: str, place: Path) -> str:
    """One agent's disk, by its name and where its folder is on the host."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", agent)[:40]
    return f"{name}-{hashlib.sha256(str(place).encode()).hexdigest()[:12]}"


def unavailable() -> str | None:
    """Why this process cannot attach a disk on this host, or None."""
    if os.geteuid() != 0:
        return "attaching a workspace disk needs root (losetup and mount)"
    if not os.path.exists("/dev/loop-control"):
        return "this host has no loop devices (/dev/loop-control is missing)"
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not found (Debian: e2fsprogs, mount)"
    return None


def attach(client: docker.DockerClient, *, key: str, size: int, files: int, seed: Path,
           view: Path) -> Disk:
    """The agent's disk, made if it is new (from `seed`, the workspace folder as it
    is), attached, offered to the engine as a volume and mounted at `view`."""
    reason = unavailable()
    if reason:
        raise DiskError(f"sandbox.disk: {reason}; run wakeloop as root or through the broker "
                        "(`docker compose up`), or set `sandbox.disk: none` in the policy for a "
                        "workspace with no disk limit")
    disks_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    image = path_of(key, "img")
    with _locked(path_of(key, "lock")):
        note = None
        if not image.exists():
            note = _create(image, size, files, seed)
        device = _loop(image)
        note = _grow(image, device, size) or note
        _volume(client, key, device, image)
        _mount_view(device, view)
    return Disk(key, image, device, view, note)


def keys() -> set[str]:
    """Every disk in $WAKELOOP_DISKS, attached or not."""
    return {image.stem for image in disks_dir().glob("*.img")}


def usage(key: str) -> tuple[int, int] | None:
    """(bytes the image holds on the host, the disk's size), or None if it has none."""
    try:
        st = path_of(key, "img").stat()
    except OSError:
        return None
    return st.st_blocks * 512, st.st_size


def release(client: docker.DockerClient, key: str, *, delete: bool = False) -> None:
    """Unmount the disk everywhere this process sees it, remove its volume, detach
    its loop device; with `delete`, the image too (its files are gone)."""
    image = path_of(key, "img")
    for device in _devices_of(image):
        for target in _mounts_of(device):
            _tool("umount", target)
        try:
            client.api.remove_volume(VOLUME_PREFIX + key, force=True)
        except docker.errors.NotFound:
            pass
        # Not checked: a device still open (the engine's last unmount) is detached when it
        # closes, and one another release detached first is gone; either way it goes.
        _tool("losetup", "-d", device, check=False)
    if delete:
        image.unlink(missing_ok=True)
        path_of(key, "lock").unlink(missing_ok=True)
        view = path_of(key, "view")   # a broker's mount point, empty once unmounted
        if view.is_dir():
            view.rmdir()


# -- the steps ------------------------------------------------------------------------

def _create(image: Path, size: int, files: int, seed: Path) -> str | None:
    """A sparse image holding a copy of `seed`; -m 0: no blocks kept back for root."""
    fd = os.open(seed, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # never a symlinked folder
    try:
        st = os.fstat(fd)
        entries = os.listdir(fd)
        partial = image.with_suffix(".partial")
        with _locked(disks_dir() / ROOM_LOCK):   # the check and the claim, one process at a time
            _check_room(size)
            with open(partial, "wb") as f:
                f.truncate(size)
        options = f"nodiscard,lazy_itable_init=1,lazy_journal_init=1,root_owner={st.st_uid}:{st.st_gid}"
        done = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-N", str(files), "-E", options,
                               "-d", f"/proc/self/fd/{fd}", str(partial)],
                              pass_fds=(fd,), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    finally:
        os.close(fd)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        why = (done.stderr.strip().splitlines() or ["mkfs.ext4 failed"])[-1]
        raise DiskError(f"sandbox.disk: cannot make the workspace's disk from {seed} "
                        f"({size:,} bytes, {files:,} files): {why}")
    partial.chmod(0o600)
    partial.rename(image)
    # The folder's own copy stays where it is (beneath the disk's mount, when that is
    # over it): never deleted by us, and no longer used.
    return (f"copied {len(entries)} entries of {seed} into the agent's new disk {image}; the folder's "
            "own copy is no longer used (beneath the disk's mount if it is mounted there)") if entries else None


def _check_room(more: int) -> None:
    """Sparse images take host blocks only as the box writes: refuse `more` bytes
    of disk unless every disk here, filled to its size, would still fit in the
    filesystem that holds them (less RESERVE), so agents together cannot fill it."""
    st = os.statvfs(disks_dir())
    room = st.f_bavail * st.f_frsize - int(st.f_blocks * st.f_frsize * RESERVE)
    promised = 0
    for image in [*disks_dir().glob("*.img"), *disks_dir().glob("*.partial")]:
        try:
            held = image.stat()
        except FileNotFoundError:
            continue   # released meanwhile
        promised += max(held.st_size - held.st_blocks * 512, 0)
    if more + promised > room:
        raise DiskError(f"sandbox.disk: no room for {more:,} more bytes of disk in {disks_dir()}: its "
                        f"filesystem has {max(room, 0):,} free beyond its {RESERVE:.0%} reserve, and its "
                        f"{len(keys())} disk(s) may still take {promised:,} of them as they fill; lower "
                        "sandbox.disk, delete the disks of agents you removed, or give WAKELOOP_DISKS "
                        "a bigger filesystem")


def _loop(image: Path) -> str:
    """The loop device of `image`: the one it has, or a free one (--nooverlap)."""
    return _tool("losetup", "--nooverlap", "--find", "--show", str(image)).strip()


def _grow(image: Path, device: str, size: int) -> str | None:
    """A policy that asks for more: grow the mounted filesystem in place (ext4's online
    resize, which needs CAP_SYS_RESOURCE). Less, or no such capability: say so."""
    have = image.stat().st_size
    anew = f"to make it anew, stop the agent, copy its files out and remove {image}"
    if size < have:
        return f"sandbox.disk asks for {size:,} bytes but the disk has {have:,}; a disk does not shrink: {anew}"
    if size > have and not _capable(CAP_SYS_RESOURCE):
        return (f"sandbox.disk asks for {size:,} bytes but the disk has {have:,}: growing a disk in use "
                f"needs CAP_SYS_RESOURCE, which this process lacks; {anew}")
    if size > have:
        with _locked(disks_dir() / ROOM_LOCK):
            _check_room(size - have)
            os.truncate(image, size)
        _tool("losetup", "--set-capacity", device)
        _tool("resize2fs", device)
    return None


def _capable(cap: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def _volume(client: docker.DockerClient, key: str, device: str, image: Path) -> None:
    """The engine's volume for the device; made again if a reboot gave the image another device."""
    name = VOLUME_PREFIX + key
    options = {"type": "ext4", "device": device, "o": BOX_OPTIONS}
    try:
        if client.api.inspect_volume(name).get("Options") == options:
            return
        client.api.remove_volume(name, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:   # in use by a container of the old device
        raise DiskError(f"sandbox.disk: the engine's volume {name} names another device and is in "
                        f"use: {exc.explanation or exc}") from None
    client.api.create_volume(name, driver="local", driver_opts=options, labels={LABEL: str(image)})


def _mount_view(device: str, view: Path) -> None:
    view.mkdir(parents=True, exist_ok=True)
    if os.stat(view).st_dev == os.stat(device).st_rdev:
        return   # mounted there already
    _tool("mount", "-t", "ext4", "-o", VIEW_OPTIONS, device, str(view))


def _devices_of(image: Path) -> list[str]:
    out = _tool("losetup", "--noheadings", "--output", "NAME", "--associated", str(image), check=False)
    return [line.strip() for line in out.splitlines() if line.strip()]


def _mounts_of(device: str) -> list[str]:
    """Where `device` is mounted in this process's namespace, deepest first."""
    rdev = os.stat(device).st_rdev
    wanted = f"{os.major(rdev)}:{os.minor(rdev)}"
    targets = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[2] == wanted:
            targets.append(fields[4].encode().decode("unicode_escape"))
    return sorted(targets, key=len, reverse=True)


def _tool(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    if check and done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise DiskError(f"sandbox.disk: {argv[0]} failed: {why}")
    return done.stdout


@contextmanager
def _locked(path: Path):
    """One process at a time makes, attaches or mounts a given disk."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
