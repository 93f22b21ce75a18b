"""An agent's disk as the engine mounts it itself: for a broker whose own mounts it cannot see.

A broker in a container (compose) mounts each disk in its own mount namespace.
Where the host's disks folder is on a shared mount, `propagation: rshared`
carries those mounts to the engine (disk.HOST_DISKS_ENV). Where the host's `/`
is private (no systemd: these machines, many CI runners) nothing does: no mount
a container makes reaches the engine, and the engine's bind of a path in another
namespace's mount is refused by the kernel. So there the engine makes them,
from paths it resolves in its own folder (the volumes' Mountpoint, root's):

- the disk: a `local` volume of type ext4 on the loop device (wakeloop-disk-KEY).
  The engine mounts a volume only while a running container uses it, so one
  small container per attached disk, the keeper (wakeloop-keep-KEY: `sleep`,
  no network, no capability, nobody, read-only, the volume read-only at /disk),
  keeps it mounted at the volume's Mountpoint;
- a box outside a wake binds Mountpoint/files/: the agent's files, nothing else;
- a wake's overlay: a `local` volume of type overlay (wakeloop-wake-KEY-RUN;
  lower Mountpoint/files, upper and work in Mountpoint/.wakeloop/wakes/RUN,
  layers.OVERLAY_OPTIONS, nosuid, nodev), mounted by the engine for each of
  the wake's boxes.

The broker reads and commits through its own mount of the same disk: one
superblock, so what a box wrote is what the broker reads. Before a commit,
drop_wake removes every container that uses the wake's volume, then the volume:
the engine refuses to remove a volume any container uses, so once it is gone no
box can write the upper layer. During a wake the broker reads the workspace as
the boxes see it through an overlay of its own, read-only (wake_layer.reading).

Every path the engine resolves is under its own root-owned folder and, on the
disk, under files/ or .wakeloop/, which no box sees (a box sees files/' content
only, and cannot rename its own mount's root): nothing done under ROOT, nor in a
box, redirects one. If the keeper dies the disk is unmounted there and a box's
start fails on a missing path: a refused call, never another folder.
"""

from __future__ import annotations

from pathlib import Path

import docker
import docker.errors

from orchestrator.sandbox.disks import layers

DISK_PREFIX = "wakeloop-disk-"  # the device's volume (disk.VOLUME_PREFIX)
KEEPER_PREFIX = "wakeloop-keep-"
WAKE_PREFIX = "wakeloop-wake-"
DISK_LABEL = "wakeloop.disk"  # on each volume and keeper: the disk's image (a test session's sweep)
KEEPER_LABEL = "wakeloop.keeper"  # on each keeper: its disk's key
WAKE_LABEL = "wakeloop.wake-of"  # on each wake's volume: its disk's key
DISK_OPTIONS = "nosuid,nodev,discard"
REMOVAL_WAIT_S = 60  # a container another remover is removing: its removal is seconds
DROP_TRIES = 5  # a container a pool's maker was creating as the wake ended: found on the next listing
# The keeper's processes and threads. runc's start counts against it too (its init's stages, the
# Go threads of `runc init`): at 4, a loaded host refused it a fork now and then (dmesg: "fork
# rejected by pids controller"), the keeper never started, and the disk could not be attached.
KEEPER_PIDS = 32


class EngineMountError(Exception):
    """The engine would not make or drop one of these mounts (one line)."""


def keep(client: docker.DockerClient, key: str, device: str, disk_image: Path, image: str) -> Path:
    """The disk's device volume, mounted by the engine and kept so by a keeper; where the
    engine has the disk's root. A keeper of another device (a reboot renumbered the loops),
    or one that stopped, is made anew. `image`: the keeper's (the box's: it is here)."""
    volume, name = DISK_PREFIX + key, KEEPER_PREFIX + key
    options = {"type": "ext4", "device": device, "o": DISK_OPTIONS}
    try:
        keeper = client.api.inspect_container(name)
        if keeper["State"]["Running"] and _volume_options(client, volume) == options:
            return _mountpoint(client, volume)
        client.api.remove_container(name, force=True)
    except docker.errors.NotFound:
        pass
    try:
        if _volume_options(client, volume) != options:
            _remove_volume(client, volume)
            client.api.create_volume(volume, driver="local", driver_opts=options, labels={DISK_LABEL: str(disk_image)})
        start_idle(
            client,
            image,
            name,
            {KEEPER_LABEL: key, DISK_LABEL: str(disk_image)},
            {"network_disabled": True},
            mounts=[docker.types.Mount("/disk", volume, type="volume", read_only=True, no_copy=True)],
        )
    except docker.errors.DockerException as exc:
        raise EngineMountError(f"sandbox.disk: the engine cannot keep the disk {key} mounted: {_why(exc)}") from None
    return _mountpoint(client, volume)


def start_idle(client: docker.DockerClient, image: str, name: str, labels: dict, config: dict, **host) -> None:
    """Create and start `name`, a container that only holds something for the engine (a
    disk's mount here, a namespace in netns.py): `sleep` as nobody, no network of its own to
    use, read-only, no capability, KEEPER_PIDS, 16 MiB. `config` and `host`: what it holds."""
    client.api.create_container(
        image,
        entrypoint=["sleep"],  # whatever the image's own entrypoint
        command=["infinity"],
        name=name,
        user="65534:65534",
        labels=labels,
        **config,
        host_config=client.api.create_host_config(
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=KEEPER_PIDS,
            mem_limit="16m",
            **host,
        ),
    )
    client.api.start(name)


def let_go(client: docker.DockerClient, key: str) -> None:
    """The disk's mounts in the engine, gone: its wakes' volumes, its keeper, its volume."""
    drop_wake(client, key)
    try:
        client.api.remove_container(KEEPER_PREFIX + key, force=True)
    except docker.errors.NotFound:
        pass
    _remove_volume(client, DISK_PREFIX + key)


def wake_volume(key: str, run_id: str) -> str:
    return f"{WAKE_PREFIX}{key}-{layers.run_id_ok(run_id)}"


def offer_wake(client: docker.DockerClient, key: str, root: Path, run_id: str, disk_image: Path) -> None:
    """Wake `run_id`'s overlay, as a volume the engine mounts for each of its boxes; `root`:
    the disk's root as the engine has it (keep)."""
    layer = layers.overlay_options(layers.files(root), layers.upper(root, run_id), layers.work(root, run_id))
    options = {"type": "overlay", "device": "overlay", "o": layer}
    try:
        labels = {WAKE_LABEL: key, DISK_LABEL: str(disk_image)}
        client.api.create_volume(wake_volume(key, run_id), driver="local", driver_opts=options, labels=labels)
    except docker.errors.DockerException as exc:
        raise EngineMountError(f"sandbox.disk: the engine cannot make the wake's overlay: {_why(exc)}") from None


def drop_wake(client: docker.DockerClient, key: str) -> bool:
    """Every wake volume of the disk gone, with every container that uses one (a wake's
    boxes, idle or not): then no box writes its upper layer. True if there was one."""
    names = [v["Name"] for v in client.api.volumes(filters={"label": f"{WAKE_LABEL}={key}"}).get("Volumes") or []]
    for name in names:
        for _ in range(DROP_TRIES):
            for c in client.api.containers(all=True, filters={"volume": name}):
                _remove_container(client, c["Id"])
            try:
                _remove_volume(client, name)
                break
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: in use by a container made since the listing
                    why = _why(exc)
                    raise EngineMountError(f"sandbox.disk: the engine cannot drop the wake's overlay: {why}") from None
        else:
            raise EngineMountError(f"sandbox.disk: the wake's overlay {name} is still in use after {DROP_TRIES} tries")
    return bool(names)


def _remove_container(client: docker.DockerClient, cid: str) -> None:
    """Gone when this returns, whoever removes it: a pool's remover may have begun (409)."""
    try:
        client.api.remove_container(cid, force=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise
        try:
            client.api.wait(cid, timeout=REMOVAL_WAIT_S, condition="removed")
        except docker.errors.NotFound:
            pass


def _volume_options(client: docker.DockerClient, name: str) -> dict | None:
    try:
        return client.api.inspect_volume(name).get("Options")
    except docker.errors.NotFound:
        return None


def _mountpoint(client: docker.DockerClient, volume: str) -> Path:
    return Path(client.api.inspect_volume(volume)["Mountpoint"])


def _remove_volume(client: docker.DockerClient, name: str) -> None:
    try:
        client.api.remove_volume(name)
    except docker.errors.NotFound:
        pass


def _why(exc: docker.errors.DockerException) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    return str(text).splitlines()[0] if text else type(exc).__name__
