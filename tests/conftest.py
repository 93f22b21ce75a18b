"""Shared fixtures: a real Docker engine, a real agent directory, a real sandbox.

Nothing here mocks the docker SDK. The suite needs a running engine and the
sandbox image; `.ci/run` (scripts/test.sh) provides both on a bare machine.
A test that needs the engine carries the `docker` marker: by its module
(DOCKER_MODULES), by asking for an engine fixture, or by its own
`@pytest.mark.docker`. `pytest -m "not docker"` runs the rest with no engine.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import docker
import pytest

from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.sandbox.disks import disk, disk_attach, disk_index, disk_survey
from orchestrator.sandbox.engine import DockerSandbox
from tests.helpers.leftovers import our_containers

# Agents' disk images (disk.py) of this session go to a directory of its own,
# in this process and in every CLI it runs (support.scrubbed_env keeps it).
os.environ[disk.DISKS_ENV] = tempfile.mkdtemp(prefix="wakeloop-test-disks-")


def _remove_if_empty(path: str) -> None:
    """A run that never reached the session's end (`--co`, `-x`, an error at collection) made the
    folder and nothing in it: gone at exit. What is in it, no_disk_left_behind reports."""
    try:
        os.rmdir(path)
    except OSError:
        pass


atexit.register(_remove_if_empty, os.environ[disk.DISKS_ENV])
ENGINE_FIXTURES = {"docker_client", "runtime", "make_sandbox", "sandbox", "make_lab", "engine_runtimes"}
# Modules every test of which drives real containers (directly or through the CLI).
DOCKER_MODULES = {
    "test_sandbox",
    "test_pool",
    "test_broker",
    "test_network",
    "test_compose",
    "test_loop",
    "test_state",
    "test_bench",
    "test_policy_tools",
    "test_probes_hold",
    "test_weakened",
    "test_wheel",
    "test_not_root",
}


# scripts/test.sh runs the suite on two workers (pytest-xdist,
# --dist loadscope: a module's tests on one worker, so a module-scoped fixture is made once,
# by one), then the `serial` tests alone: those whose verdict rests on a wall-clock bound or a share of the CPU, which
# another worker's load could move. These probes are (and their weakened controls):
SERIAL_PROBES = {
    "caps_cpu",
    "kills_at_deadline",
    "ends_call_with_ptrace_stopped_init",
    "survives_fork_bomb",
    "survives_million_small_files",
    "bounds_huge_output",
    "broker_bounds_silent_connections",
    "broker_bounds_calls_in_flight",
    "pins_workspace_against_symlink_swap",  # its control escapes only if enough calls race the swaps
    # Its next wake begins at once on a disk out of inodes: the last box's teardown must have
    # let go of what it held (ci31, runsc: "No space left on device" at that begin).
    "transaction_whole_on_a_full_disk",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in DOCKER_MODULES or ENGINE_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.docker)
        callspec = getattr(item, "callspec", None)
        if callspec and SERIAL_PROBES & set(callspec.id.split("-")):
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session")
def docker_client():
    client = docker.from_env()
    client.ping()  # no engine is a failure, not a skip: CI always has one
    return client


@pytest.fixture
def agent_dir(tmp_path) -> Path:
    """A fresh agent made by `wakeloop init`, workspace owned by the sandbox user."""
    return init_agent(tmp_path / "agent")


@pytest.fixture
def agent(agent_dir):
    return load_agent(agent_dir)


@pytest.fixture
def no_ceiling(monkeypatch):
    """No operator ceiling (WAKELOOP_CEILING) from the machine: a test that wants one sets its own."""
    monkeypatch.delenv("WAKELOOP_CEILING", raising=False)


# Every sandbox test runs under each: runc (the default) and gVisor's runsc,
# which scripts/setup-runsc.sh installs and registers (with --network=none).
RUNTIMES = ("runc", "runsc")


@pytest.fixture(scope="session")
def engine_runtimes(docker_client) -> set[str]:
    return set(docker_client.info().get("Runtimes") or {})


@pytest.fixture(params=RUNTIMES)
def runtime(request, engine_runtimes) -> str:
    if request.param not in engine_runtimes:
        pytest.skip(f"runtime {request.param} is not registered with this engine (run scripts/setup-runsc.sh)")
    return request.param


@pytest.fixture
def make_sandbox(agent, docker_client, runtime):
    """DockerSandbox(policy=the agent's, **changes) under `runtime`: closed (pool removed)
    after the test."""
    made = []

    def make(policy=None, **kwargs) -> DockerSandbox:
        policy = replace(policy or agent.policy.sandbox, runtime=runtime)
        box = DockerSandbox(agent.workspace, policy, agent=agent.name, client=docker_client, **kwargs)
        made.append(box)
        return box

    yield make
    for box in made:
        box.close()


@pytest.fixture
def sandbox(make_sandbox) -> DockerSandbox:
    """The sandbox as a wake uses it: the policy's warm pool on."""
    return make_sandbox()


@pytest.fixture
def fake_api(monkeypatch):
    """start(replies=(), then=None): a local Messages API (orchestrator/testing/fakeapi.py) that the
    real SDK reaches through ANTHROPIC_BASE_URL, with a fake key set; stopped after."""
    from orchestrator.testing.fakeapi import FAKE_KEY, FakeAPI

    servers = []

    def start(replies=(), then=None) -> FakeAPI:
        api = FakeAPI(replies, then=then).__enter__()
        servers.append(api)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        return api

    yield start
    for api in servers:
        api.__exit__(None, None, None)


@pytest.fixture(scope="session", autouse=True)
def no_container_left_behind(request, tmp_path_factory):
    """After the whole session, not one sandbox container of ours may exist."""
    if not any(item.get_closest_marker("docker") for item in request.session.items):
        yield  # `-m "not docker"`: no engine to ask
        return
    docker_client = request.getfixturevalue("docker_client")
    base = tmp_path_factory.getbasetemp()
    yield
    left = our_containers(docker_client, base)
    for cid in left:
        docker_client.api.remove_container(cid, force=True)
    assert not left, f"sandbox containers left behind: {left}"


@pytest.fixture
def disk_view(docker_client):
    """view(agent_dir): the agent's workspace as its wakes see it, its disk attached for
    the rest of the test (a wake releases it when it ends; workspace/ then shows the
    folder's own, unused copy), released after; the folder itself with `sandbox.disk: none`."""
    boxes = {}

    def view(agent_dir) -> Path:
        agent = load_agent(agent_dir)
        if not agent.policy.sandbox.disk:
            return agent.workspace
        if agent.dir not in boxes:
            boxes[agent.dir] = DockerSandbox(
                agent.workspace, agent.policy.sandbox, agent=agent.name, client=docker_client, warm=0
            )
        return boxes[agent.dir].view

    yield view
    for box in boxes.values():
        box.close()


@pytest.fixture(autouse=True)
def disks_released(request):
    """A test's agents' disks are deleted after it (those of wider-scoped fixtures at
    the session's end). A disk the code under test left attached is a leak: forced
    off here so later tests run clean, and named at the session's end, which fails."""
    if not request.node.get_closest_marker("docker"):
        yield
        return
    client = request.getfixturevalue("docker_client")
    before = disk_survey.keys()
    yield
    for key in disk_survey.keys() - before:
        if disk_attach.held(key) or _attached(disk.path_of(key, "img")):
            _leaks.append(f"{request.node.nodeid}: disk {key} still attached after the test")
        disk_attach.release(client, key, delete=True, force=True)


_leaks: list[str] = []  # tests whose code left a disk attached (disks_released)


def _attached(image: Path) -> bool:
    """A loop device on `image` that is not on its way out. One that release detached
    (autoclear set) and nothing mounts goes when its last opener closes it (the engine's
    unmount, udev's probe): disk.py promises that much, not when; the session's end and
    scripts/test.sh check that it went."""
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        if not backing.read_text().strip().startswith(str(image)):
            continue
        device = backing.parent.parent
        going = (device / "loop" / "autoclear").read_text().strip() == "1"
        if _mount_points(device) or not going:
            return True
    return False


def _mount_points(device: Path) -> list[str]:
    """Where the loop device (its /sys/block folder) is mounted in this namespace."""
    numbers = (device / "dev").read_text().strip()
    return [
        line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines() if line.split()[2] == numbers
    ]


def disk_leftovers(client, where: Path) -> list[str]:
    """What this session's disks dir still has on the host: loop devices backed by a
    file in it, mounts of those, engine volumes labelled with an image in it (client
    None: no engine to ask), images."""
    left = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        if backing.read_text().strip().startswith(str(where) + "/"):
            device = backing.parent.parent
            left.append(f"loop device /dev/{device.name} ({backing.read_text().strip()})")
            left += [f"mount of /dev/{device.name} at {target}" for target in _mount_points(device)]
    volumes = (client.api.volumes(filters={"label": disk.LABEL}).get("Volumes") or []) if client else []
    for volume in volumes:
        if (volume.get("Labels") or {}).get(disk.LABEL, "").startswith(str(where) + "/"):
            left.append(f"volume {volume['Name']}")
    for keeper in client.api.containers(all=True, filters={"label": disk.LABEL}) if client else []:
        if (keeper.get("Labels") or {}).get(disk.LABEL, "").startswith(str(where) + "/"):
            left.append(f"container {keeper['Names'][0]}")
    left += [f"image {image}" for image in sorted(where.glob("*.img"))]
    return left


@pytest.fixture(scope="session", autouse=True)
def no_disk_left_behind(request):
    """After the whole session: no loop device, mount or volume of this session's disks
    dir remains, and no test's code left a disk attached; else the run fails. Images
    (a module fixture's, whose box closed) are deleted here, and none may be left after."""
    yield
    where = disk.disks_dir()
    if not where.is_dir():
        return
    # `-m "not docker"`: no engine to ask, and no test that ran attached a disk (what is
    # there anyway, an image or a loop device, is named below all the same).
    engine = any(item.get_closest_marker("docker") for item in request.session.items)
    client = docker.from_env() if engine else None
    left = [what for what in disk_leftovers(client, where) if not what.startswith("image ")]
    for key in disk_survey.keys() if client else ():  # cleaned anyway, so the host is left as it was found
        disk_attach.release(client, key, delete=True, force=True)
    left += disk_leftovers(client, where)  # what even a forced release could not remove
    for name in (disk_index.INDEX, "index.partial-index"):
        (where / name).unlink(missing_ok=True)
    for view in [*where.glob("*.view"), *where.glob("*.box")]:
        view.rmdir()  # the disks' mount points, unmounted by release: empty, or this fails loudly
    for kind in ("lock", "use", "call", "engine"):
        for lock in where.glob(f"*.{kind}"):
            lock.unlink()  # room.lock, and those of disks refused before they were made
    where.rmdir()
    problems = left + _leaks
    assert not problems, "disks left behind by this session:\n  " + "\n  ".join(problems)


def pytest_report_header(config):
    return f"docker: {os.environ.get('DOCKER_HOST', 'unix:///var/run/docker.sock')}"
