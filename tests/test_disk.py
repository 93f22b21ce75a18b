"""The workspace's own disk (orchestrator/sandbox/disks/disk.py), against the real engine and kernel.

The attacks on it (filling it, fallocate --keep-size, inodes, the symlink
swap) are escape probes (tests/escapes/); here: that an existing workspace
moves onto its disk, that the disk grows, what `status` says, and the one
line a host without root or loop devices gets.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import replace

import pytest

from orchestrator.policy.agent import AgentError, load_agent
from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.disks import disk, disk_attach, disk_image, disk_index, disk_mounts, disk_room, disk_survey
from orchestrator.sandbox.disks.disk import DiskError
from orchestrator.sandbox.engine import DockerSandbox
from orchestrator.views.agent_status import agent_status, render_agent_status

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
        seen = box.run(
            "cat notes/b.md; stat -c %h notes/a.md; readlink link; df -P . | tail -1",
            timeout_s=30,
            max_output_chars=2000,
        )
        assert os.stat(ws).st_dev != os.stat(agent_dir).st_dev  # mounted over workspace/ on the host
        (ws / "notes/a.md").unlink()  # the folder's own copy, beneath the mount, is untouched
    assert seen.ok, seen.output
    lines = seen.output.splitlines()
    assert lines[:3] == ["kept", "2", "/etc/passwd"]  # content, the hard link, the link as a link
    assert lines[3].startswith("/dev/loop")  # the box's workspace is the disk
    assert os.stat(ws).st_dev == os.stat(agent_dir).st_dev  # released when the box closed
    assert (ws / "notes/a.md").read_text() == "kept\n"  # the folder's own copy, as it was


def test_raising_the_disk_grows_it_in_place_or_says_why_not_and_lowering_it_does_not_shrink_it(agent, docker_client):
    small = replace(agent.policy.sandbox, disk=64 * 2**20)
    with DockerSandbox(agent.workspace, small, agent=agent.name, warm=0) as box:
        box.run("echo x > kept.txt", timeout_s=30, max_output_chars=100)
        box.update_policy(replace(small, disk=128 * 2**20))
        df = box.run("df -P -B1M . | tail -1; cat kept.txt", timeout_s=30, max_output_chars=500)
        warning = box.warning or ""
    size_mib = int(df.output.split()[1])
    assert df.output.splitlines()[-1] == "x", df.output
    if disk_image.capable(disk_image.CAP_SYS_RESOURCE):
        assert 100 < size_mib <= 128, df.output
    else:  # this machine: root without CAP_SYS_RESOURCE; the disk stays, and a line says why
        assert size_mib <= 64 and "growing a disk in use needs CAP_SYS_RESOURCE" in warning, warning
    with DockerSandbox(agent.workspace, small, agent=agent.name, warm=0) as box:
        assert "does not shrink" in (box.warning or "") or not disk_image.capable(disk_image.CAP_SYS_RESOURCE)


def test_status_shows_the_disk_used_against_its_limit(agent, docker_client):
    with DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0) as box:
        box.run("head -c 3m /dev/zero > big", timeout_s=30, max_output_chars=100)
        d = agent_status(agent)["disk"]  # mounted over workspace/: the filesystem's own count
        assert d["limit_bytes"] == 2 * GIB and d["limit_files"] == 100_000
        assert 3 * 2**20 <= d["used_bytes"] < 64 * 2**20 and d["used_files"] > 2
        assert "MiB used" in render_agent_status(agent_status(agent))
    d = agent_status(agent)["disk"]  # released: the image's blocks on the host
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
    assert disk_attach.unavailable() == "this host has no loop devices (/dev/loop-control is missing)"


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
        for key in disk_survey.keys():
            disk_attach.release(docker_client, key, delete=True, force=True)
        subprocess.run(["umount", "--lazy", str(place)], check=True)  # a loop device may close later


MIB = 2**20


def small_box(root, name: str, size: int = 100 * MIB, **kwargs) -> DockerSandbox:
    """A box for a new agent under `root` whose disk is `size` bytes."""
    from orchestrator.policy.agent import init_agent

    agent = load_agent(root / name if (root / name).is_dir() else init_agent(root / name))
    return DockerSandbox(agent.workspace, replace(agent.policy.sandbox, disk=size), agent=agent.name, warm=0, **kwargs)


def run(box, command: str):
    return box.run(command, timeout_s=60, max_output_chars=2000)


def test_thin_disks_promise_more_than_their_filesystem_holds_within_the_overcommit(
    small_disks_dir, tmp_path, docker_client
):
    """Three 100 MiB disks on a 300 MiB filesystem (the old guard refused the third: every
    disk's whole size was set aside); the promise stops at `overcommit` times the filesystem."""
    boxes = [small_box(tmp_path, f"a{n}", overcommit=1.5) for n in range(4)]  # 400 MiB ≤ 1.5 × 300
    try:
        assert all(run(box, "echo x > kept").ok for box in boxes)
        with pytest.raises(DiskError) as caught:
            small_box(tmp_path, "past", size=60 * MIB, overcommit=1.5)
    finally:
        for box in boxes:
            box.close()
    line = str(caught.value)
    assert line.startswith(f"sandbox.disk: no promise of {60 * MIB:,} more bytes of disk in ") and "\n" not in line
    assert "4 disk(s) have" in line and "max.disk_overcommit" in line
    assert not [*small_disks_dir.glob("past-*.img"), *small_disks_dir.glob("past-*.partial")]


def test_a_call_starts_only_with_room_for_the_worst_case_of_every_call_in_flight(
    small_disks_dir, tmp_path, docker_client, monkeypatch
):
    """While a call of a 200 MiB disk runs (it may yet fill it), a call of another 200 MiB disk
    would let the two fill the 300 MiB filesystem: it waits, then is refused with one line;
    once the first ends, it runs. A disk that alone could fill it is refused at once."""
    from tests.helpers import wait_for
    from tests.helpers.sync import release_fifo

    monkeypatch.setattr(disk_room, "ROOM_WAIT_S", 0.5)
    first, second = small_box(tmp_path, "first", 200 * MIB), small_box(tmp_path, "second", 200 * MIB)
    try:
        assert run(first, "mkfifo hold").ok
        disk_room.settled(first.disk.key)  # landed: in flight below means the call held on the FIFO
        fifo = first.view / "hold"
        import threading

        held = {}
        caller = threading.Thread(target=lambda: held.update(result=run(first, "cat hold")))
        caller.start()
        try:
            wait_for(lambda: disk_room.in_flight(first.disk.key), "the first call in flight", 30)
            refused = run(second, "echo y > y")
        finally:
            release_fifo(fifo, 30)
            caller.join(60)
        assert held["result"].ok and not held["result"].no_room
        assert refused.exit_code == 2 and not refused.container_id and "\n" not in refused.no_room
        assert refused.no_room.startswith("sandbox.disk: this call did not start: the disks' filesystem")
        waited = re.search(
            r"the 1 other disk\(s\) with calls in flight [\d,]+ \(waited ([\d.]+) s for them\)", refused.no_room
        )
        assert waited and float(waited[1]) >= 0.5, refused.no_room
        assert refused.output == f"refused: {refused.no_room}"
        disk_room.settled(first.disk.key)  # synced: what it wrote is counted in the free space now
        assert not disk_room.in_flight(first.disk.key) and run(second, "echo y > y").ok
    finally:
        first.close()
        second.close()
    with pytest.raises(disk_room.NoRoom, match="this disk may still take"):  # made only with room for mkfs's worst case
        small_box(tmp_path, "huge", 400 * MIB)


def test_many_agents_writing_at_once_never_fill_the_disks_filesystem(
    small_disks_dir, tmp_path, docker_client, monkeypatch
):
    """Six agents, 600 MiB promised on 300 MiB, each writing 50 MiB at once and syncing it (300 MiB in all):
    every call runs to the end or is refused with the line; none meets a full filesystem
    under its own (ENOSPC or EIO from the image), and the reserve is never touched."""
    import threading

    monkeypatch.setattr(disk_room, "ROOM_WAIT_S", 2.0)
    boxes = [small_box(tmp_path, f"w{n}") for n in range(6)]
    results, lowest = {}, [os.statvfs(small_disks_dir).f_bavail]
    done = threading.Event()

    def watch():  # the filesystem's free space, as often as it can be read meanwhile
        while not done.is_set():
            lowest.append(os.statvfs(small_disks_dir).f_bavail)

    def write(n, box):
        results[n] = run(box, "head -c 50m /dev/zero > f && sync -f f && echo written")

    threads = [threading.Thread(target=write, args=(n, box)) for n, box in enumerate(boxes)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        done.set()
        watcher.join()
        for box in boxes:
            box.close()
    ran = [r for r in results.values() if not r.no_room]
    refused = [r for r in results.values() if r.no_room]
    assert len(results) == 6 and ran and refused, results
    assert all(r.ok and r.output.strip() == "written" for r in ran), [r.output for r in ran]
    assert all(r.no_room.startswith("sandbox.disk: this call did not start") for r in refused)
    st = os.statvfs(small_disks_dir)
    assert min(lowest) * st.f_frsize >= st.f_blocks * st.f_frsize * disk_room.RESERVE * 0.9, min(lowest)


def test_a_wake_whose_calls_find_no_room_says_so_once_and_status_shows_why(
    small_disks_dir, tmp_path, docker_client, monkeypatch
):
    """The model reads the line as the call's result; the wake records one event and queues
    one notification however many calls it had refused; `status` shows the line."""
    import json
    import threading

    from orchestrator.notify import queue
    from orchestrator.records.events import EVENTS_FILE, read_events
    from orchestrator.wake.loop import wake
    from tests.helpers import set_policy, wait_for
    from tests.helpers.sync import release_fifo

    monkeypatch.setattr(disk_room, "ROOM_WAIT_S", 0.2)
    first, second = small_box(tmp_path, "first", 200 * MIB), small_box(tmp_path, "second", 200 * MIB)
    second.close()  # its disk is made; its wake opens it again
    set_policy(
        tmp_path / "second",
        {"sandbox": {"disk": "200m", "pool": 0}},
        notify=[{"webhook": "https://hooks.example.com/x"}],
    )
    script = tmp_path / "script.json"
    call = {"name": "bash", "input": {"command": "echo z > z"}}
    script.write_text(json.dumps([{"tool_calls": [call]}, {"tool_calls": [call]}, {"text": "done"}]))
    try:
        assert run(first, "mkfifo hold").ok
        disk_room.settled(first.disk.key)  # landed: in flight below means the call held on the FIFO
        caller = threading.Thread(target=lambda: run(first, "cat hold"))
        caller.start()
        try:
            wait_for(lambda: disk_room.in_flight(first.disk.key), "the first call in flight", 30)
            receipt = wake(load_agent(tmp_path / "second"), script=script)
        finally:
            release_fifo(first.view / "hold", 30)
            caller.join(60)
    finally:
        first.close()
    state = tmp_path / "second" / "state"
    events = list(read_events(state / EVENTS_FILE))
    results = [e.data for e in events if e.type == "tool_result"]
    assert len(results) == 2 and all(
        r["is_error"] and r["no_room"].startswith("sandbox.disk: this call did not start") for r in results
    )
    assert results[-1]["no_room"] == receipt.no_room  # each line its own (how long it waited); the last kept
    assert [e.type for e in events].count("disk_no_room") == 1
    assert receipt.status == "done" and receipt.no_room.startswith("sandbox.disk: this call did not start")
    assert [item.event for item in queue.pending(state)] == ["no_room"]
    assert f"no room    a call of the last wake did not start: {receipt.no_room}" in render_agent_status(
        agent_status(load_agent(tmp_path / "second"))
    )


def test_a_call_in_flight_in_a_process_killed_with_sigkill_blocks_no_one(tmp_path, monkeypatch):
    """The mark of a call in flight is a record lock: it dies with its process, whatever ends it."""
    import sys

    from tests.helpers import REPO

    monkeypatch.setenv(disk.DISKS_ENV, str(tmp_path))
    (tmp_path / "a.img").write_bytes(b"")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from orchestrator.sandbox.disks import disk_room\n"
            "with disk_room.flight('a'):\n"
            "    print('flying', flush=True); time.sleep(600)\n",
        ],
        cwd=REPO,
        env={**os.environ, disk.DISKS_ENV: str(tmp_path)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "flying\n"
        assert disk_room.in_flight("a")
    finally:
        child.kill()
        child.wait(30)
    assert not disk_room.in_flight("a")
    with disk_room.flight("a"):  # and this process's own mark is seen by itself, counted per call
        with disk_room.flight("a"):
            assert disk_room.in_flight("a")
        assert disk_room.in_flight("a")
    assert not disk_room.in_flight("a")


# -- whose disk: one per agent folder, whatever its name ---------------------------------


def attached_devices(image) -> list[str]:
    """Loop devices backed by `image` now (sysfs: what the kernel has, not what we think)."""
    return sorted(d for d, backing in disk_image.loops().items() if backing == str(image))


def open_box(agent_dir, **kwargs) -> DockerSandbox:
    agent = load_agent(agent_dir)
    return DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0, **kwargs)


def test_renaming_an_agent_folder_keeps_its_one_disk(agent_dir, docker_client):
    with open_box(agent_dir) as box:
        box.run("echo mine > kept.txt", timeout_s=30, max_output_chars=100)
        first = box.disk
    images_before = disk_survey.keys()
    place = agent_dir
    for n in range(4):
        place = place.rename(place.with_name(f"renamed-{n}"))
        with open_box(place) as box:
            assert box.disk.key == first.key and box.disk.image == first.image
            seen = box.run("cat kept.txt", timeout_s=30, max_output_chars=100)
            assert seen.output == "mine\n" and len(attached_devices(first.image)) == 1
    assert disk_survey.keys() == images_before and attached_devices(first.image) == []
    assert disk_index.read_index()[first.key]["folder"] == str(place)  # where it was last seen


def test_a_folder_made_anew_where_a_deleted_one_was_gets_a_disk_of_its_own(agent_dir, docker_client):
    from orchestrator.policy.agent import init_agent

    with open_box(agent_dir) as box:
        box.run("echo secret > old.txt", timeout_s=30, max_output_chars=100)
        old = box.disk.key
    before = disk_index.identity_of(agent_dir)
    subprocess.run(["rm", "-rf", str(agent_dir)], check=True)
    again = init_agent(agent_dir)  # same path, same name; maybe the same inode number
    assert disk_index.identity_of(again) != before
    with open_box(again) as box:
        assert box.disk.key != old
        assert box.run("cat old.txt", timeout_s=30, max_output_chars=100).exit_code != 0
    assert disk.path_of(old, "img").exists()  # the old one is kept until `disk rm`


def test_a_disk_named_the_old_way_is_adopted_by_its_folder(agent_dir, docker_client):
    agent = load_agent(agent_dir)
    with open_box(agent_dir) as box:
        box.run("echo before > upgraded.txt", timeout_s=30, max_output_chars=100)
        made = box.disk.key
    old_style = disk_index.legacy_key(agent.name, agent.workspace.resolve())
    for kind in ("img", "lock", "use"):  # as an earlier wakeloop left it: no index entry
        disk.path_of(made, kind).rename(disk.path_of(old_style, kind))
    disk_index.forget(made)
    with open_box(agent_dir) as box:
        assert box.disk.key == old_style and disk_index.read_index()[old_style]["adopted"] is True
        assert box.run("cat upgraded.txt", timeout_s=30, max_output_chars=100).output == "before\n"
    agent_dir.rename(agent_dir.with_name("moved"))  # adopted once: the folder keeps it when renamed
    with open_box(agent_dir.with_name("moved")) as box:
        assert box.disk.key == old_style


def test_a_disk_is_released_when_its_last_holder_closes_and_its_image_is_kept(agent_dir, docker_client):
    first = open_box(agent_dir)
    second = open_box(agent_dir)  # a wake and a `sandbox exec` at once
    image = first.disk.image
    assert first.disk.key == second.disk.key and len(attached_devices(image)) == 1
    first.close()
    assert len(attached_devices(image)) == 1 and disk_attach.held(first.disk.key)  # the other still has it
    assert second.run("true", timeout_s=30, max_output_chars=100).ok
    second.close()
    assert attached_devices(image) == [] and not disk_attach.held(first.disk.key) and image.exists()
    ws = agent_dir / "workspace"
    assert os.stat(ws).st_dev == os.stat(agent_dir).st_dev  # unmounted: `rm -rf` of the folder works
    volumes = docker_client.api.volumes(filters={"label": disk.LABEL}).get("Volumes") or []
    assert first.disk.volume not in {v["Name"] for v in volumes}


def test_a_box_that_fails_after_attaching_lets_its_disk_go(agent_dir, docker_client, monkeypatch):
    from orchestrator.sandbox.egress import egress_plan, network

    policy = replace(load_agent(agent_dir).policy.sandbox, network="allowlist", allow_hosts=("example.com",))

    def no_proxy(*args, **kwargs):  # the allowlist's proxy fails to start, after the disk attached
        raise egress_plan.NetworkError("no proxy today")

    monkeypatch.setattr(network, "ensure", no_proxy)
    with pytest.raises(SandboxError, match="no proxy today"):
        DockerSandbox(agent_dir / "workspace", policy, agent="agent", warm=0)
    key = disk_index.lookup(agent_dir)
    assert key and attached_devices(disk.path_of(key, "img")) == [] and not disk_attach.held(key)


# -- a one-shot command leaves nothing attached; `wakeloop disk` ---------------------------


def test_one_shot_commands_release_the_disk_they_attached(agent_dir, docker_client, capsys):
    from orchestrator.cli.wakeloop import main

    assert main(["sandbox", "exec", str(agent_dir), "--", "echo x > made.txt"]) == 0
    key = disk_index.lookup(agent_dir)
    assert key and attached_devices(disk.path_of(key, "img")) == []
    assert main(["wake", str(agent_dir)]) == 0  # a dry run: the scripted model drives the real tools
    assert main(["context", str(agent_dir)]) == 0  # reads the memory on the disk, then lets it go
    assert main(["sandbox", "exec", str(agent_dir), "--", "exit 3"]) == 3  # a failing command too
    assert attached_devices(disk.path_of(key, "img")) == [] and not disk.holding()
    subprocess.run(["rm", "-rf", str(agent_dir)], check=True)  # "Device or resource busy" before


def test_the_last_holder_releases_the_disk_while_other_threads_fork(agent, docker_client):
    """A child forked by another thread (losetup for another agent) shares an flock's open
    file until it execs: with flock, the release right after the last holder closed found
    the disk held in most tries and left it mounted. A record lock is never inherited."""
    import threading

    stop = threading.Event()

    def fork_in_a_loop():
        while not stop.is_set():
            subprocess.run(["true"], check=True)

    forkers = [threading.Thread(target=fork_in_a_loop, daemon=True) for _ in range(3)]
    for forker in forkers:
        forker.start()
    try:
        for attempt in range(30):
            with DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0) as box:
                image = box.disk.image
            assert box.release_problem is None, box.release_problem
            assert attached_devices(image) == [], f"attempt {attempt}: the disk stayed attached"
    finally:
        stop.set()
        for forker in forkers:
            forker.join()
    assert not disk_attach.held(box.disk.key)


@pytest.mark.serial  # a wall-clock bound: alone, not beside another worker
def test_ctrl_c_during_a_sandbox_call_still_releases_the_disk(agent_dir, docker_client):
    from tests.helpers import wait_for
    from tests.helpers.sync import exec_to_interrupt, interrupt

    agent = load_agent(agent_dir)
    proc = exec_to_interrupt(agent_dir, "sleep 60")
    try:
        running = lambda: docker_client.api.containers(
            filters={"label": f"wakeloop.workspace={agent.workspace.resolve()}", "status": "running"}
        )
        wait_for(running, "the call's container to run", 60)
        code, err = interrupt(proc, 60)
    finally:
        proc.kill()
    assert code == 130, err
    key = disk_index.lookup(agent_dir)
    assert attached_devices(disk.path_of(key, "img")) == [] and not disk_attach.held(key), err


def test_disk_list_release_and_rm(agent_dir, docker_client, capsys, monkeypatch):
    import json

    from orchestrator.cli.wakeloop import main
    from orchestrator.records.state import WakeLock

    box = open_box(agent_dir)
    image = box.disk.image
    assert main(["disk", "list", str(agent_dir.parent), "--json"]) == 0
    [listed] = [d for d in json.loads(capsys.readouterr().out) if d["image"] == str(image)]
    assert listed["folder"] == str(agent_dir.resolve()) and listed["folder_found"] and listed["attached"]
    assert listed["size_bytes"] == 2 * GIB and 0 < listed["host_bytes"] < 64 * 2**20
    assert str(agent_dir / "workspace") in listed["mounted_at"] and listed["held"] is True
    assert sorted(listed["mounted_at"]) == sorted(
        [str(agent_dir / "workspace"), str(disk.path_of(box.disk.key, "view")), str(disk.path_of(box.disk.key, "box"))]
    )  # the person's files/, the root (files/ beside .wakeloop/), what the box's volume binds
    assert main(["disk", "release", str(agent_dir)]) == 3  # held by the box: one line, exit 3
    assert "is in use" in capsys.readouterr().err
    box.close()
    assert main(["disk", "list"]) == 0
    out = capsys.readouterr().out
    assert f"image {image}" in out and "not attached" in out
    with monkeypatch.context() as m:  # without root, list still reads
        m.setattr(os, "geteuid", lambda: 1000)
        assert main(["disk", "list", "--json"]) == 0 and str(image) in capsys.readouterr().out
        assert main(["disk", "release", str(agent_dir)]) == 3
        assert "needs root" in capsys.readouterr().err
    assert main(["disk", "rm", str(agent_dir)]) == 2 and "--yes" in capsys.readouterr().err
    lock = WakeLock(agent_dir / "state")
    assert lock.acquire() is None  # a wake runs
    try:
        assert main(["disk", "rm", str(agent_dir), "--yes"]) == 3
        assert "is waking" in capsys.readouterr().err and image.exists()
    finally:
        lock.release()
    assert main(["disk", "rm", str(agent_dir), "--yes"]) == 0
    assert not image.exists() and disk_index.lookup(agent_dir) is None
    err = capsys.readouterr().err
    assert main(["disk", "release", str(agent_dir)]) == 3
    assert "has no disk" in capsys.readouterr().err and err == ""


# -- the broker: one disk per folder through renames, released when idle --------------------


def broker_call(broker, name: str, command: str = "true"):
    return broker.handle({"op": "run", "agent": name, "command": command})["result"]


def test_through_the_broker_renames_keep_one_disk_and_an_idle_box_releases_it(tmp_path, docker_client):
    from orchestrator.broker.server import Broker
    from orchestrator.policy.agent import init_agent
    from orchestrator.sandbox.keeper import IDLE_CLOSE_S
    from tests.helpers import set_policy

    root = tmp_path / "agents"
    for name in ("alpha", "beta"):
        set_policy(init_agent(root / name), {"sandbox": {"pool": 0}})
    broker = Broker(root, client=docker_client, log=lambda line: None)
    before = disk_survey.keys()
    try:
        broker_call(broker, "alpha", "echo mine > kept.txt")
        broker_call(broker, "beta")
        key = disk_index.lookup(root / "alpha")
        name = "alpha"
        for n in range(4):  # the attack of issue 20: each rename, then a call
            (root / name).rename(root / f"alpha-{n}")
            name = f"alpha-{n}"
            assert broker_call(broker, name, "cat kept.txt")["output"] == "mine\n"
        assert disk_survey.keys() - before == {key, disk_index.lookup(root / "beta")}  # two agents, two disks
        assert disk_index.lookup(root / name) == key
        assert len(attached_devices(disk.path_of(key, "img"))) == 1
        # Idle past IDLE_CLOSE_S (and the renamed-away boxes, whose folders are gone): released.
        for entry in broker.keeper._boxes.values():
            entry.used -= IDLE_CLOSE_S + 1
        broker.keeper._next_sweep = 0
        broker.sweep()
        assert attached_devices(disk.path_of(key, "img")) == [] and broker.keeper._boxes == {}
        assert disk.path_of(key, "img").exists()
        assert broker_call(broker, name, "cat kept.txt")["output"] == "mine\n"  # attached again
    finally:
        broker.close()
    assert attached_devices(disk.path_of(key, "img")) == []


def test_the_broker_never_releases_a_disk_while_a_call_of_it_runs(tmp_path, docker_client):
    from orchestrator.broker.server import Broker
    from orchestrator.policy.agent import init_agent
    from orchestrator.sandbox.keeper import IDLE_CLOSE_S
    from tests.helpers import set_policy

    root = tmp_path / "agents"
    set_policy(init_agent(root / "alpha"), {"sandbox": {"pool": 0}})
    broker = Broker(root, client=docker_client, log=lambda line: None)
    try:
        entry = broker.keeper._acquire(broker._agent("alpha"))  # a call in flight holds the box
        entry.used -= IDLE_CLOSE_S + 1
        broker.keeper._next_sweep = 0
        broker.sweep()
        key = disk_index.lookup(root / "alpha")
        assert len(attached_devices(disk.path_of(key, "img"))) == 1 and "alpha" in broker.keeper._boxes
        assert entry.box.run("echo still > here.txt", timeout_s=30, max_output_chars=100).ok
        broker.keeper._release(entry)
    finally:
        broker.close()
    assert attached_devices(disk.path_of(key, "img")) == []


def test_through_the_broker_two_folders_swapped_between_calls_each_keep_their_own_disk(tmp_path, docker_client):
    from orchestrator.broker.server import Broker
    from orchestrator.policy.agent import init_agent
    from tests.helpers import set_policy

    root = tmp_path / "agents"
    for name in ("alpha", "beta"):
        set_policy(init_agent(root / name), {"sandbox": {"pool": 0}})
    broker = Broker(root, client=docker_client, log=lambda line: None)
    try:
        for name in ("alpha", "beta"):
            broker_call(broker, name, f"echo {name} > mine.txt")
        for name, other in (("alpha", "swap"), ("beta", "alpha"), ("swap", "beta")):
            (root / name).rename(root / other)  # alpha's folder is now "beta", and beta's "alpha"
        assert broker_call(broker, "alpha", "cat mine.txt")["output"] == "beta\n"
        assert broker_call(broker, "beta", "cat mine.txt")["output"] == "alpha\n"
        symlinked = root / "gamma"
        symlinked.symlink_to(root / "alpha")  # a link claiming a folder's identity: refused
        with pytest.raises(Exception, match="not a folder directly under"):
            broker_call(broker, "gamma")
    finally:
        broker.close()


def test_a_workspace_that_is_a_link_to_another_agents_gets_no_disk_mounted_over_it(tmp_path, docker_client):
    from orchestrator.policy.agent import init_agent

    victim, evil = init_agent(tmp_path / "victim"), init_agent(tmp_path / "evil")
    subprocess.run(["rm", "-rf", str(evil / "workspace")], check=True)
    (evil / "workspace").symlink_to(victim / "workspace")  # whoever may write the evil folder (actor D)
    with pytest.raises(AgentError, match="is a symlink"):  # load_agent refuses it first
        open_box(evil)
    policy = load_agent(victim).policy.sandbox  # and the box itself, without load_agent
    with pytest.raises(DiskError, match="is a link"):
        DockerSandbox(evil / "workspace", policy, agent="evil", warm=0)
    assert os.stat(victim / "workspace").st_dev == os.stat(victim).st_dev  # nothing mounted there


def test_a_workspace_swapped_for_a_link_just_before_the_mount_is_not_mounted_through(tmp_path):
    """The check that workspace/ is no link and mount(8) are apart in time: a folder's author
    who swaps in a link between the two must not get the disk mounted where the link points
    (as root: /etc/profile.d). The mount goes on the folder opened without following a link."""
    image, target, view = tmp_path / "x.img", tmp_path / "target", tmp_path / "workspace"
    subprocess.run(["truncate", "-s", "32M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    device = subprocess.run(
        ["losetup", "-f", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        target.mkdir()
        view.symlink_to(target)  # the swap, already made when the mount comes
        with pytest.raises(DiskError, match="never through a link"):
            disk_mounts.mount_view(device, view)
        assert os.stat(target).st_dev == os.stat(tmp_path).st_dev  # nothing mounted where it points
        view.unlink()
        view.mkdir()
        disk_mounts.mount_view(device, view)  # a real folder: mounted, on that folder
        assert os.stat(view).st_dev == os.stat(device).st_rdev
    finally:
        subprocess.run(["umount", str(view)], check=False, capture_output=True)
        subprocess.run(["losetup", "-d", device], check=True)
