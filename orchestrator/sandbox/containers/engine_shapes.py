"""The engine's shapes one call writes and reads: create_container's and create_host_config's
arguments (container_spec), and the part of inspect_container's answer the result is read from.

The docker SDK is untyped; these say what engine.py hands it and takes back, so a key
misspelled in either is the checker's error, not a container made without it.

Not here: making, running or reading a container (engine.py), `policy explain`'s
rendering of the same spec as `docker run` flags (explain.py).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from docker.types import LogConfig, Mount, Ulimit


class ContainerConfig(TypedDict):
    """create_container's arguments for one call (container_spec)."""

    image: str
    command: list[str]
    user: str
    working_dir: str
    hostname: NotRequired[str]  # not with a holder's or the proxy's network
    environment: dict[str, str]
    labels: NotRequired[dict[str, str]]  # not in the pool's settings key
    stdin_open: bool
    detach: bool
    use_config_proxy: bool


class HostConfig(TypedDict):
    """create_host_config's arguments for one call (container_spec)."""

    mounts: list[Mount]
    network_mode: str
    read_only: bool
    tmpfs: dict[str, str]
    cap_drop: list[str]
    security_opt: list[str]
    pids_limit: int
    mem_limit: int
    memswap_limit: int
    nano_cpus: int
    ulimits: list[Ulimit]
    ipc_mode: str
    shm_size: int
    init: bool
    runtime: str
    log_config: LogConfig


class ContainerState(TypedDict):
    """What a call's result reads of the engine's State (inspect_container), or the launcher's."""

    ExitCode: int
    OOMKilled: bool


class _InspectedState(ContainerState):
    Running: bool
    Pid: int


class Inspected(TypedDict):
    """The part of inspect_container's answer read here."""

    State: _InspectedState
