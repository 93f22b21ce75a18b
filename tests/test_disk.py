"""The workspace's own disk (orchestrator/sandbox/disk.py), against the real engine and kernel.

The attacks on it (filling it, fallocate --keep-size, inodes, the symlink
swap) are escape probes (tests/escapes/); here: that an existing workspace
moves onto its disk, that the disk grows, what `status` says, and the one
line a host without root or loop devices gets.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from orchestrator.fleet.views import agent_status, render_agent_status
from orchestrator.policy.agent import load_agent
from orchestrator.sandbox import disk
from orchestrator.sandbox.disk import DiskError
from orchestrator.sandbox.engine import DockerSandbox

pytestmark = pytest.mark.docker
GIB = 2**30


def test_an_existing_workspace_is_copied_onto_its_new_disk_and_seen_in_the_box(agent_dir, docker_client):
    ws = agent_dir / "workspace"
    (ws / "notes").mkdir()
    (ws / "notes/a.md").write_text("kept\n")
    os.link(ws / "notes/a.md", ws / "notes/b.md")
    (ws / "link").symlink_to("/etc/passwd")
    agent = load_agent(agent_dir)
    with DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0) as box:
        assert box.disk and "copied" in box.warning and str(box.disk.image) in box.warning
        seen = box.run("cat notes/b.md; stat -c %h notes/a.md; readlink link; df -P . | tail -1",
                       timeout_s=30, max_output_chars=2000)
        assert os.stat(ws).st_dev != os.stat(agent_dir).st_dev     # mounted over workspace/ on the host
        (ws / "notes/a.md").unlink()   # the folder's own copy, beneath the mount, is untouched
    assert seen.ok, seen.output
    lines = seen.output.splitlines()
    assert lines[:3] == ["kept", "2", "/etc/passwd"]          # content, the hard link, the link as a link
    assert lines[3].startswith("/dev/loop")                    # the box's workspace is the disk
    assert os.stat(ws).st_dev == os.stat(agent_dir).st_dev     # released when the box closed
    assert (ws / "notes/a.md").read_text() == "kept\n"         # the folder's own copy, as it was


def test_raising_the_disk_grows_it_in_place_or_says_why_not_and_lowering_it_does_not_shrink_it(
        agent, docker_client):
    small = replace(agent.policy.sandbox, disk=64 * 2**20)
    with DockerSandbox(agent.workspace, small, agent=agent.name, warm=0) as box:
        box.run("echo x > kept.txt", timeout_s=30, max_output_chars=100)
        box.update_policy(replace(small, disk=128 * 2**20))
        df = box.run("df -P -B1M . | tail -1; cat kept.txt", timeout_s=30, max_output_chars=500)
        warning = box.warning or ""
    size_mib = int(df.output.split()[1])
    assert df.output.splitlines()[-1] == "x", df.output
    if disk._capable(disk.CAP_SYS_RESOURCE):
        assert 100 < size_mib <= 128, df.output
    else:   # this machine: root without CAP_SYS_RESOURCE; the disk stays, and a line says why
        assert size_mib <= 64 and "growing a disk in use needs CAP_SYS_RESOURCE" in warning, warning
    with DockerSandbox(agent.workspace, small, agent=agent.name, warm=0) as box:
        assert "does not shrink" in (box.warning or "") or not disk._capable(disk.CAP_SYS_RESOURCE)


def test_status_shows_the_disk_used_against_its_limit(agent, docker_client):
    with DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0) as box:
        box.run("head -c 3m /dev/zero > big", timeout_s=30, max_output_chars=100)
        d = agent_status(agent)["disk"]   # mounted over workspace/: the filesystem's own count
        assert d["limit_bytes"] == 2 * GIB and d["limit_files"] == 100_000
        assert 3 * 2**20 <= d["used_bytes"] < 64 * 2**20 and d["used_files"] > 2
        assert "MiB used" in render_agent_status(agent_status(agent))
    d = agent_status(agent)["disk"]       # released: the image's blocks on the host
    assert 3 * 2**20 <= d["host_bytes"] < 64 * 2**20 and d["size_bytes"] == 2 * GIB
    assert "held on the host" in render_agent_status(agent_status(agent))


def test_without_root_a_disk_is_one_line_saying_what_to_do(agent, docker_client, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(DiskError) as caught:
        DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("sandbox.disk: attaching a workspace disk needs root")
    assert "sandbox.disk: none" in message and "docker compose up" in message


def test_without_loop_devices_a_disk_is_one_line(monkeypatch):
    real = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: False if p == "/dev/loop-control" else real(p))
    assert disk.unavailable() == "this host has no loop devices (/dev/loop-control is missing)"


def test_no_disk_is_a_plain_folder_by_its_path(agent, docker_client):
    folder = replace(agent.policy.sandbox, disk=0)
    with DockerSandbox(agent.workspace, folder, agent=agent.name, warm=0) as box:
        assert box.disk is None
        _, host = box.container_spec(["true"])
    assert host["mounts"][0]["Type"] == "bind" and host["mounts"][0]["Source"] == str(agent.workspace)


@pytest.fixture
def small_disks_dir(tmp_path, monkeypatch, docker_client):
    """WAKELOOP_DISKS on a 300 MiB filesystem of its own; its disks released after."""
    import subprocess
    place = tmp_path / "disks"
    place.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300m", "tmpfs", str(place)], check=True)
    monkeypatch.setenv(disk.DISKS_ENV, str(place))
    try:
        yield place
    finally:
        for key in disk.keys():
            disk.release(docker_client, key, delete=True, force=True)
        subprocess.run(["umount", "--lazy", str(place)], check=True)   # a loop device may close later


def test_disks_never_promise_more_than_their_filesystem_holds(small_disks_dir, tmp_path, docker_client):
    from orchestrator.policy.agent import init_agent
    first, second = (load_agent(init_agent(tmp_path / name)) for name in ("first", "second"))
    policy = first.policy.sandbox
    with pytest.raises(DiskError) as caught:   # 2 GiB on 300 MiB: refused before mkfs
        DockerSandbox(first.workspace, policy, agent=first.name, warm=0)
    assert str(caught.value).startswith(f"sandbox.disk: no room for {2 * GIB:,} more bytes of disk in ")
    assert "\n" not in str(caught.value) and list(small_disks_dir.glob("*.img")) == []
    with DockerSandbox(first.workspace, replace(policy, disk=200 * 2**20), agent=first.name, warm=0) as box:
        assert box.run("true", timeout_s=30, max_output_chars=100).ok
    # 200 MiB promised to the first: 100 more would let the two fill the filesystem.
    with pytest.raises(DiskError, match="its 1 disk\\(s\\) may still take"):
        DockerSandbox(second.workspace, replace(policy, disk=100 * 2**20), agent=second.name, warm=0)
    with DockerSandbox(second.workspace, replace(policy, disk=32 * 2**20), agent=second.name, warm=0) as box:
        filled = box.run("head -c 64m /dev/zero > f; df -P -B1M . | tail -1", timeout_s=60, max_output_chars=500)
    assert "No space left on device" in filled.output, filled.output
    assert os.statvfs(small_disks_dir).f_bavail > 0
