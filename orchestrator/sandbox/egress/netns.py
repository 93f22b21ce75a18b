"""One empty network namespace for all of a sandbox's gVisor boxes, instead of one each.

The engine makes a network namespace for every container, `network: none`
included, and deletes it at the container's removal. On these hosts that costs
0.17-0.19 CPU-s per container: a cold gVisor call of `true` costs the host 0.68
CPU-s and 0.73 s with its box in a shared namespace, against 0.86 CPU-s and
0.89 s in one of its own (`python -m bench.box_cpu`, 10 each, alternated). On
two cores at an agent's fastest pace that is CPU every call shares with the
boxes being made for the next ones (docs/benchmarks.md).

A gVisor box never uses that namespace. runsc registered with --network=none
(scripts/setup-runsc.sh; policy_check refuses any other network under it) gives
each sandbox a network stack of its own inside its Sentry, loopback only: two
boxes share no socket, port or interface through the host's namespace, which
holds only the Sentry's and gofer's host processes, no interface but lo. So
under such a runtime and `network: none` a sandbox's boxes join the namespace of
one small container, its holder (wakeloop-netns-ID: `sleep`, network none, no
capability, nobody, read-only, under the engine's default runtime: made as a
disk's keeper is, engine_mounts.start_idle), made with the sandbox's first box
and removed at its close.

Under any other runtime each box keeps a namespace of its own: there the
namespace is the box's network, and a process one call left running until its
box's removal would share the next call's loopback. The probe
`boxes_share_no_loopback` attacks exactly that, and escapes a runc box made to
join a holder (tests/escapes/test_weakened.py).
"""

from __future__ import annotations

import secrets
import threading
from pathlib import Path

import docker
import docker.errors

from orchestrator.sandbox.disks import engine_mounts

PREFIX = "wakeloop-netns-"
LABEL = "wakeloop.netns-of"  # on each holder: the workspace of the sandbox it serves

_own_stack: dict[tuple[str, str], bool] = {}
_own_stack_lock = threading.Lock()


def own_stack(client: docker.DockerClient, runtime: str) -> bool:
    """Whether the engine registers `runtime` as gVisor with --network=none: each of its
    boxes has a network stack of its own, whatever namespace it is started in."""
    key = (str(client.api.base_url), runtime)
    with _own_stack_lock:
        if key not in _own_stack:
            found = (client.info().get("Runtimes") or {}).get(runtime) or {}
            _own_stack[key] = "runsc" in str(found.get("path", "")) and "--network=none" in (
                found.get("runtimeArgs") or []
            )
        return _own_stack[key]


class Holder:
    """The empty namespace one sandbox's boxes join: `network_mode` names it at once;
    ensure() makes the holder before a box joins it, and again if it is gone (an engine
    restarted stops every container, and the broker keeps a sandbox for days)."""

    def __init__(self, client: docker.DockerClient, workspace: Path, image: str):
        self.client, self.workspace, self.image = client, workspace, image
        self.name = PREFIX + secrets.token_hex(6)
        self._lock = threading.Lock()
        self._up = False

    @property
    def network_mode(self) -> str:
        return f"container:{self.name}"

    def ensure(self) -> None:
        """The holder runs: made, or made anew. One inspect when it does, off a pooled call's path."""
        with self._lock:
            if self._up and self._running():
                return
            self._remove()
            # hostname: the boxes', since the engine refuses one of their own with this mode
            engine_mounts.start_idle(
                self.client, self.image, self.name, {LABEL: str(self.workspace)}, {"hostname": "sandbox"}
            )
            self._up = True

    def close(self) -> None:
        with self._lock:
            self._remove()

    def _running(self) -> bool:
        try:
            return bool(self.client.api.inspect_container(self.name)["State"]["Running"])
        except docker.errors.NotFound:
            return False

    def _remove(self) -> None:
        self._up = False
        try:
            self.client.api.remove_container(self.name, force=True)
        except docker.errors.NotFound:
            pass


def leftovers(client: docker.DockerClient, where: Path, keep: str = "") -> int:
    """Remove the holders a crashed run left for the workspace `where`, or for every workspace
    under it (a broker's ROOT); all but the one named `keep`."""
    found = client.api.containers(all=True, filters={"label": LABEL})
    ours = [c for c in found if Path((c.get("Labels") or {}).get(LABEL, "/")).is_relative_to(where)]
    stale = [c["Id"] for c in ours if f"/{keep}" not in (c.get("Names") or [])]
    for cid in stale:
        try:
            client.api.remove_container(cid, force=True)
        except docker.errors.NotFound:
            pass
    return len(stale)
