"""Surface probes: the workspace disks' life cycle (sandbox/disks/disk.py), attacked as a
taken-over orchestrator would, which holds agents/ read-write and can rename,
delete and remake agent folders between calls.

Disks are attached by boxes, so these probes make boxes (warm=0, one or two
cold calls each) on agents in their trial's folder, and a broker of their own
on a ROOT there for the one that needs it; every disk they make is the
trial's, released and deleted at its cleanup.

Not here: filling a disk from inside the box (escapes/resources.py), the
symlink swap of workspace/ (escapes/orchestrator.py); each probe's weakened
control: tests/escapes/test_surfaces_disks.py.
"""

from __future__ import annotations

import io
import os
import secrets
import stat
import subprocess
import tarfile
from functools import partial
from pathlib import Path

import yaml

from orchestrator.broker.wire import BrokerError
from orchestrator.escapes.core import Probe, Trial, escaped, held
from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.sandbox.disks import disk, disk_image, disk_index

CATEGORY = "surfaces"
RENAMES = 3  # renames of one folder between calls (issue 20 saw 4 make 11 disks)
CALL_S = 30  # one cold call on a loaded host


def _attached(image: Path) -> list[str]:
    """Loop devices the kernel has backed by `image` now."""
    return sorted(device for device, backing in disk_image.loops().items() if backing == str(image))


def _box(trial: Trial, folder: Path):
    """A cold box on the agent at `folder`, as a wake makes it (the disk is the folder's)."""
    return trial.new_box(workspace=folder / "workspace", warm=0)


def _renaming_keeps_one_disk(t: Trial) -> str:
    """A box after each rename, all kept open (as a broker keeps a box per name until
    its sweep): then count the images and the loop devices attached."""
    agent = init_agent(t.dir / "renamed-0")
    place, boxes = agent, []
    try:
        for n in range(RENAMES + 1):
            if n:
                place = place.rename(place.with_name(f"renamed-{n}"))
            boxes.append(_box(t, place))  # attaching is what made a disk: no call needed
        keys = {box.disk.key for box in boxes}
        devices = {d for key in keys for d in _attached(disk.path_of(key, "img"))}
    finally:
        for box in reversed(boxes):  # last mounted, first unmounted (path-keyed disks stack)
            box.close()
        place.rename(agent)  # the trial's cleanup removes it by its first name
    if len(keys) > 1 or len(devices) > 1:
        return escaped(
            f"{RENAMES} renames of one agent folder, a box after each, made {len(keys)} disk "
            f"images and {len(devices)} loop devices attached at once"
        )
    return held(f"{RENAMES} renames of one agent folder, a box after each: 1 disk, 1 loop device")


def _one_shot_call_releases(t: Trial) -> str:
    from orchestrator.broker.client import open_sandbox
    from orchestrator.sandbox.engine import DockerSandbox

    agent = load_agent(init_agent(t.dir / "one-shot"))
    box = open_sandbox(agent, warm=0, environ={})  # `wakeloop sandbox exec`: the local engine
    assert isinstance(box, DockerSandbox)  # (no broker socket in that environ)
    assert box.disk is not None  # the default policy gives the workspace a disk
    try:
        box.run("echo x > made.txt", timeout_s=CALL_S, max_output_chars=100)
    finally:
        box.close()
    left = _attached(box.disk.image)
    mounted = os.stat(agent.workspace).st_dev != os.stat(agent.dir).st_dev
    volumes = t.lab.client.api.volumes(filters={"name": box.disk.volume}).get("Volumes") or []
    if left or mounted or any(v["Name"] == box.disk.volume for v in volumes):
        return escaped(
            f"after a one-shot call its disk is still attached ({', '.join(left) or 'no device'}"
            f"{', mounted over workspace/' if mounted else ''}"
            f"{', its volume kept' if volumes else ''}): `rm -rf` of the folder fails"
        )
    return held(
        "a one-shot call's disk is unmounted, its volume removed and its loop device detached "
        "when the call's box closes; the image is kept"
    )


def _new_folder_in_a_deleted_ones_place(t: Trial) -> str:
    victim = init_agent(t.dir / "victim")
    canary = "wakeloop-disk-canary-" + secrets.token_hex(6)
    box = _box(t, victim)  # its disk, mounted over workspace/ while the box is open
    try:
        (box.view / "secret.txt").write_text(canary)
    finally:
        box.close()
    before = os.stat(victim).st_ino
    subprocess.run(["rm", "-rf", str(victim)], check=True)
    newcomer = init_agent(victim)  # the same path and name; ext4 often hands back the same inode
    reused = "the same inode" if os.stat(newcomer).st_ino == before else "another inode"
    box = _box(t, newcomer)
    try:
        seen = (box.view / "secret.txt").read_text() if (box.view / "secret.txt").exists() else ""
    finally:
        box.close()
    if canary in seen:
        return escaped(
            f"a folder made where a deleted agent's was ({reused}) got the deleted agent's "
            "disk: its files were readable in the newcomer's box"
        )
    return held(f"a folder made where a deleted agent's was ({reused}) got a disk of its own")


def _broker_box_follows_the_folder(t: Trial) -> str:
    from orchestrator.broker.server import Broker

    root = t.dir / "root"
    canary = "wakeloop-disk-canary-" + secrets.token_hex(6)
    _no_pool(init_agent(root / "alpha"))
    broker = Broker(root, client=t.lab.client, log=lambda line: None)
    try:
        call = lambda name, cmd: broker.handle({"op": "run", "agent": name, "command": cmd})
        call("alpha", f"echo {canary} > secret.txt")
        key = disk_index.lookup(root / "alpha")
        (root / "alpha").rename(root / "kept")  # alpha's folder, now under another name
        _no_pool(init_agent(root / "alpha"))  # a newcomer under the old name
        seen = call("alpha", "cat secret.txt 2>/dev/null || echo absent")["result"]["output"]
    finally:
        broker.close()
    if canary in seen:
        return escaped(
            "the broker served a folder made under a renamed agent's old name with the box "
            "it kept for that agent: the newcomer's calls ran on the renamed agent's disk"
        )
    if disk_index.lookup(root / "kept") != key:
        return escaped("the renamed agent lost its disk: its folder has another one under its new name")
    return held(
        "a kept box serves only the folder it was made for: a newcomer under a renamed "
        "agent's old name got a disk of its own, and the renamed agent kept its"
    )


def _hostile(outside: Path) -> dict[str, list[tuple[str, bytes, str]]]:
    """What a taken-over orchestrator could relay into a node's broker as an agent's moving disk:
    each a stream of its own (one refused member refuses its whole stream) of (name, tar type,
    link), aimed at `outside` (the trial's folder, outside every disk) or at the host's kernel."""
    return {
        "dotdot": [("../" * 40 + str(outside).lstrip("/") + "/dotdot", tarfile.REGTYPE, "")],
        "absolute": [(f"{outside}/absolute", tarfile.REGTYPE, "")],
        "through-a-link": [("out", tarfile.SYMTYPE, str(outside)), ("out/through-a-link", tarfile.REGTYPE, "")],
        "hard-link": [("hard", tarfile.LNKTYPE, f"{outside}/target")],
        "device": [("mem", tarfile.CHRTYPE, "")],  # 1:1, /dev/mem
        "set-id": [("suid", tarfile.REGTYPE, "")],  # every member is mode 6755
    }


def _stream(members: list[tuple[str, bytes, str]]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.devmajor, info.devminor = kind, link, 0o6755, 1, 1
            data = b"#!/bin/sh\nid\n" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


def _given(stream: io.BytesIO, limit: int) -> io.BytesIO:
    return stream


def _import_stays_in_its_disk(t: Trial) -> str:
    from orchestrator.broker import ops
    from orchestrator.broker.server import Broker
    from orchestrator.records.placement import write_node

    root, outside = t.dir / "root", t.dir / "outside"
    outside.mkdir()
    (outside / "target").write_text("the host's\n")
    write_node(_no_pool(init_agent(root / "alpha")) / "state", "elsewhere")  # moving here from another node
    broker = Broker(root, client=t.lab.client, log=lambda line: None, node="here")
    attacks, refused, landed = _hostile(outside), [], []
    try:
        for attack, members in attacks.items():
            try:
                broker.import_(ops.Import("alpha"), partial(_given, _stream(members)))
            except BrokerError:
                refused.append(attack)
        files = broker._boxes["alpha"].box.disk.files  # type: ignore[union-attr]
        for path in [files, *files.rglob("*")]:
            st = path.lstat()
            hard_link = stat.S_ISREG(st.st_mode) and st.st_nlink > 1
            if st.st_mode & (stat.S_ISUID | stat.S_ISGID) or stat.S_ISCHR(st.st_mode) or hard_link:
                landed.append(f"{path.name} ({stat.filemode(st.st_mode)}, {st.st_nlink} links)")
    finally:
        broker.close()
    written = sorted(p.name for p in outside.iterdir() if p.name != "target")
    if written or landed or (outside / "target").read_text() != "the host's\n":
        return escaped(
            f"a hostile stream imported as an agent's moving disk wrote outside it ({', '.join(written) or 'nothing'}) "
            f"or landed in it what a box cannot make ({', '.join(landed) or 'nothing'})"
        )
    return held(
        f"{len(attacks)} hostile streams imported as an agent's moving disk: {len(refused)} refused "
        f"({', '.join(refused)}), nothing written outside the disk, no device, set-id bit or hard link in it"
    )


def _no_pool(agent_dir: Path) -> Path:
    """One cold call at a time: nothing of the probe idles in a pool."""
    config = agent_dir / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    data["policy"] = {"sandbox": {"pool": 0}}
    config.write_text(yaml.safe_dump(data))
    return agent_dir


disks_one_per_folder_through_renames = Probe(
    "disks_one_per_folder_through_renames",
    CATEGORY,
    f"{RENAMES} renames of an agent folder, a box after each, keep its one disk and one loop device",
    _renaming_keeps_one_disk,
)
disks_released_after_a_one_shot_call = Probe(
    "disks_released_after_a_one_shot_call",
    CATEGORY,
    "a one-shot call's disk is unmounted, its volume removed and its loop device detached at its end",
    _one_shot_call_releases,
)
disks_never_handed_to_a_folder_made_in_a_deleted_ones_place = Probe(
    "disks_never_handed_to_a_folder_made_in_a_deleted_ones_place",
    CATEGORY,
    "a folder made at a deleted agent's path (even on its inode) gets a disk of its own",
    _new_folder_in_a_deleted_ones_place,
)
disks_broker_box_follows_the_folder_not_the_name = Probe(
    "disks_broker_box_follows_the_folder_not_the_name",
    CATEGORY,
    "the broker's kept box is not reused for a folder swapped in under a renamed agent's name",
    _broker_box_follows_the_folder,
)

disks_import_writes_only_inside_the_new_disk = Probe(
    "disks_import_writes_only_inside_the_new_disk",
    CATEGORY,
    "a hostile stream imported as an agent's moving disk (wakeloop move) writes nothing outside that disk, "
    "and no device, set-id bit or hard link in it",
    _import_stays_in_its_disk,
)

PROBES: list = [
    disks_one_per_folder_through_renames,
    disks_released_after_a_one_shot_call,
    disks_never_handed_to_a_folder_made_in_a_deleted_ones_place,
    disks_broker_box_follows_the_folder_not_the_name,
    disks_import_writes_only_inside_the_new_disk,
]
