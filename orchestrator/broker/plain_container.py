"""A swarm task's broker, run as a plain container of its own node's engine, so it can attach disks.

A swarm service cannot be given devices or device cgroup rules (moby/moby#35028),
nor `privileged` (moby/moby#24862), so a broker running as a swarm task cannot
run losetup, and its agents could not have a workspace disk. The way around it
named in moby#24862: the task holds its node's Docker socket (a broker does
anyway), so it has that engine start the broker as a plain container with what
compose gives the one-host broker (CAP_SYS_ADMIN, the loop devices' cgroup
rules, /dev, AppArmor unconfined: no more power than the socket it already
holds), and stays as its parent:

- the broker runs in the task's network namespace (`container:TASK`), so
  `tasks.broker` and the task's host-mode port reach it, as they reach the task;
- it gets the task's mounts (`volumes_from`: the Docker socket, ROOT, policies/
  with the ceiling, the disks' volume, which is the node's own) and its
  environment (WAKELOOP_NODE);
- the task's TLS files (swarm secrets, which `volumes_from` does not carry) are
  copied into it before it starts, readable by root alone, and go with it;
- its output is the task's output (`docker service logs`); SIGTERM to the task
  stops it (its calls in flight finish, as the broker's own SIGTERM promises),
  and the task exits with its status, so the swarm restarts both;
- a broker container whose task is gone (a task killed outright) is stopped and
  removed by the next task on that node before it starts its own.

Not here: the broker itself (server.py, transport.py), or how disks attach (disk.py).
"""

from __future__ import annotations

import io
import signal
import sys
import tarfile
from pathlib import Path
from typing import Any

import docker
from docker.models.containers import Container

from orchestrator.broker import tls
from orchestrator.errors import ConfigError
from orchestrator.sandbox.keeper import own_container_id

LABEL = "wakeloop.broker-of"  # on the plain container: the task container it belongs to
TLS_DIR = "/run/wakeloop-tls"  # in the plain container: the task's TLS files, copied
STOP_S = 150  # as compose.yaml's broker stop_grace_period: a call in flight finishes
# What compose.override.yaml gives the one-host broker for losetup and mount (its comments say why).
DEVICES = {
    "cap_add": ["SYS_ADMIN"],
    "device_cgroup_rules": ["b 7:* rmw", "c 10:237 rmw"],
    "security_opt": ["apparmor:unconfined"],
}


def run(root: str, listen: str, tls_dir: Path, ceiling: str | None) -> int:
    """Start `wakeloop broker ROOT --listen LISTEN` as a plain container and wait on it: its status."""
    task = own_container_id()
    if task is None:
        raise ConfigError("--plain-container runs in a container (a swarm task): this process is on a plain host")
    client = docker.from_env()
    _remove_orphans(client)
    command = ["wakeloop", "broker", root, "--listen", listen, "--tls-dir", TLS_DIR]
    if ceiling:
        command += ["--ceiling", ceiling]
    broker = _create(client, client.api.inspect_container(task), command)
    try:
        broker.put_archive("/", _tls_files(tls_dir))
        for signum in (signal.SIGTERM, signal.SIGINT):  # before the start: the task's stop stops it
            signal.signal(signum, lambda *_: broker.stop(timeout=STOP_S))
        broker.start()
        for chunk in broker.logs(stream=True, follow=True):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        return int(broker.wait().get("StatusCode", 1))
    finally:
        broker.remove(force=True)


def _create(client: docker.DockerClient, task: dict[str, Any], command: list[str]) -> Container:
    config, host = task["Config"], task["HostConfig"]
    return client.containers.create(
        task["Image"],
        command,
        entrypoint=["wakeloop-entrypoint"],
        environment=config.get("Env") or [],
        labels={LABEL: task["Id"]},
        network_mode=f"container:{task['Id']}",
        volumes_from=[task["Id"]],
        volumes={"/dev": {"bind": "/dev", "mode": "rw"}},  # loop devices made after the start appear here
        log_config=host.get("LogConfig"),
        **DEVICES,
    )


def _tls_files(folder: Path) -> bytes:
    """The broker's TLS files as a tar for put_archive: TLS_DIR, root's alone."""
    data, base = io.BytesIO(), TLS_DIR.lstrip("/")
    with tarfile.open(fileobj=data, mode="w") as tar:
        entry = tarfile.TarInfo(base)
        entry.type, entry.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(entry)
        for path in tls.files(folder, tls.BROKER_NAME):
            entry = tarfile.TarInfo(f"{base}/{path.name}")
            content = path.read_bytes()
            entry.size, entry.mode = len(content), 0o400
            tar.addfile(entry, io.BytesIO(content))
    return data.getvalue()


def _remove_orphans(client: docker.DockerClient) -> None:
    """Plain broker containers whose task is not running (it was killed before it could stop
    them): stopped, so that their calls finish and their disks are let go, then removed."""
    for orphan in client.containers.list(all=True, filters={"label": LABEL}):
        try:
            running = client.api.inspect_container(orphan.labels[LABEL])["State"]["Running"]
        except docker.errors.NotFound:
            running = False
        if not running:
            orphan.stop(timeout=STOP_S)
            orphan.remove(force=True)
