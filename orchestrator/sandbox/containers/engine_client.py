"""The Docker engine a process talks to: where it is, the process's one client for it, its images checked.

One client per engine address for the process's life, shared by every wake,
sandbox and thread (urllib3's pools are thread-safe), so its idle connections
are bounded; an engine that cannot be reached is one line that says why and
the step that fixes it.

Not here: the boxes made on it (engine.py), building the images (images.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

import docker
import docker.errors

from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.containers import images
from orchestrator.sandbox.containers.pool import MakePace

ENGINE_TIMEOUT_S = 30  # one Docker API request (create, inspect, remove)
# Connections the shared client keeps per URL. The SDK makes a pool per URL (so
# per container: start, wait, inspect, delete) and keeps the 25 most recent, each
# with its idle connections, closing the rest as they are evicted: serve's sockets
# to the engine stay near 25-40 whatever the number of wakes. Concurrent requests
# share a URL only on create and ping; past this size urllib3 would open extra
# connections and warn, so it covers serve's 4 wakes and a broker's 16 calls.
ENGINE_POOL = 32


def engine_url(environ: Mapping[str, str] = os.environ) -> str:
    """Where the engine is: $DOCKER_HOST, else the `docker context` the user selected, else the default."""
    if environ.get("DOCKER_HOST"):
        return environ["DOCKER_HOST"]
    try:
        from docker.context import ContextAPI

        host: str | None = ContextAPI.get_current_context().Host
    except Exception:  # no config, a broken one: the default socket, as the docker CLI falls back
        host = None
    return host or "unix:///var/run/docker.sock"


_clients: dict[str, docker.DockerClient] = {}  # one per engine address, for the process's life
_clients_lock = threading.Lock()
_paces: dict[tuple[str, str], MakePace] = {}  # the pools open on this engine, per runtime


def connect(client: docker.DockerClient | None = None) -> docker.DockerClient:
    """The process's client for the local engine (checked with a ping), or a SandboxError
    that says what is wrong and how to fix it. Shared by every wake, sandbox and thread
    (as the broker's one client always has been: urllib3's pools are thread-safe), so
    its idle connections are bounded (ENGINE_POOL above), instead of a client per wake
    whose sockets only the garbage collector would close."""
    where = engine_url()
    try:
        client = client or _shared(where)
        client.ping()
        return client
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot reach the Docker engine at {where}: {_engine_problem(where, exc)}") from None


def _shared(where: str) -> docker.DockerClient:
    with _clients_lock:
        if where not in _clients:
            _clients[where] = docker.DockerClient(base_url=where, timeout=ENGINE_TIMEOUT_S, max_pool_size=ENGINE_POOL)
        return _clients[where]


def pace(client: docker.DockerClient, runtime: str) -> MakePace:
    """Shared by every pool of this process on this engine and runtime, so that a wake's
    pool can tell it is one of a fleet (pool.py: it then grows no more ahead)."""
    key = (str(client.api.base_url), runtime)
    with _clients_lock:
        return _paces.setdefault(key, MakePace())


def _engine_problem(where: str, exc: Exception) -> str:
    """The reason in words, with the one step that fixes it."""
    path = where[len("unix://") :] if where.startswith("unix://") else None
    text = str(exc)
    if path and not os.path.exists(path):
        return (
            f"the socket {path} does not exist: the engine is not running: start it "
            "(`sudo systemctl start docker`, or `sudo dockerd &`), or set DOCKER_HOST"
        )
    if "Permission denied" in text or "PermissionError" in text:
        return (
            f"permission denied on {path or where}: run as root, or join the group that owns it "
            "(`sudo usermod -aG docker $USER`, then log in again) and set `sandbox.disk: none` "
            "in the policy (a workspace disk needs root)"
        )
    if "Connection refused" in text or "ConnectionRefused" in text:
        return "nothing answers there: start it (`sudo systemctl start docker`, or `sudo dockerd &`)"
    return f"{first_line(exc)}; start it (`sudo systemctl start docker`, or `sudo dockerd &`) or set DOCKER_HOST"


def check_image(client: docker.DockerClient, image: str) -> str | None:
    """Raise if the image is missing; return a warning line if it is stale."""
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise SandboxError(f"sandbox image {image} not found; build it with `wakeloop image build`") from None
    reason = images.stale_reason(client, image)
    return f"warning: {reason}; rebuild it with `wakeloop image build`" if reason else None


def first_line(exc: Exception) -> str:
    text = str(getattr(exc, "explanation", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
