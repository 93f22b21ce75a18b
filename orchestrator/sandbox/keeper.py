"""What the broker keeps for each agent: its box, its disk, its egress, its wake's layer; and the engine's rate.

The broker (broker/server.py) decides whether a request is served: the agent
folder, its policy, the ceiling, the caps on calls, the fleet's switch. What
it then asks is done here, by one Keeper. The same box, diff and undo on this
host without a broker are the functions at the end (`open_here`,
`diff_here`, `undo_here`, and `let_go_here` when a command ends).

Each agent keeps one DockerSandbox across requests, so its warm pool (the
policy's `sandbox.pool`) serves them as it would a direct wake; a policy
change drains the idle containers made under the old settings. `wind_down`
stops the pool's refills (a wake expects no more calls but its journal stub)
and the next wake's `check` rearms it. A box unused for IDLE_CLOSE_S (a wake
open: WAKE_IDLE_CLOSE_S), or whose workspace is gone, is closed: its pool,
then its disk let go (released unless another box holds it); all close at
exit. At most `max_agents` hold a box: past it the longest idle one closes,
or the request is Refused. A retired allowlist box takes its proxy and
network with it unless a live box has the same egress; a box whose proxy or
netns holder died is made anew.

Each wake is a transaction (wake_layer.py), mounted and committed here:
`begin` settles what the agent's earlier wakes left and mounts the wake's
overlay in its kept box; `finish` checks the wake's changes against the
policy the broker read (`workspace.protect`, protect_git), commits or drops
them. One begin, finish, undo or move of a disk at a time, and no call
meanwhile; a call with no wake open runs in a wake of its own, committed when
the last call sharing it ends. Where the engine cannot see this process's
mounts (a container without `propagation: rshared`; disks_reach_engine) the
engine mounts each disk and overlay itself (engine_mounts.py).

Each agent's workspace is a disk of its own (disk.py), its folder's by the
folder's identity (inode and birth time or generation, never its name or
path: a renamed agent keeps its one disk), given to boxes by device and
mounted for reading at the broker's own path, never under ROOT. A kept box
serves only the folder it was made for: a folder swapped in under that name
gets a box and a disk of its own. ROOT's host path is asked of the engine
(this container's mounts; on a plain host, ROOT itself).

Not here: whether a request is served (broker/server.py: the policy, the
ceiling, the caps, the stop switch), the wire (broker/ops.py, replies.py),
a box itself (engine.py), a disk (disk.py), a wake's overlay (wake_layer.py).
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors

from orchestrator.errors import ConfigError
from orchestrator.policy.agent import Agent
from orchestrator.policy.schema import DEFAULT, SandboxPolicy
from orchestrator.sandbox import rate
from orchestrator.sandbox.box import Files, Sandbox, SandboxError, SandboxResult
from orchestrator.sandbox.change_set import Settled, WakeChanges
from orchestrator.sandbox.containers.engine_client import connect
from orchestrator.sandbox.disks import disk, disk_attach, disk_index, disk_room, layers, workspace_stream
from orchestrator.sandbox.egress import egress_plan, netns, network
from orchestrator.sandbox.engine import DockerSandbox, resolve_user
from orchestrator.sandbox.policy_check import check_against_engine
from orchestrator.sandbox.wakes import undo_folders, wake_diff
from orchestrator.sandbox.wakes.undo_folders import Undone, UndoRefused
from orchestrator.sandbox.wakes.wake_diff import WakeDiff

HOST_ROOT_ENV = "WAKELOOP_HOST_ROOT"  # where ROOT lives on the host, if not discoverable
# An agent's box unused this long is closed: its idle containers removed, its disk released (a
# loop device, a mount and a volume are host-wide and finite; attaching again costs ~0.1 s). Calls
# of a wake come seconds apart and wakes minutes to hours apart: 10 min keeps a wake's box warm
# through its model's slowest turns and lets an agent that sleeps for an hour hold nothing.
IDLE_CLOSE_S = 600.0
WAKE_IDLE_CLOSE_S = 7200.0  # a box whose wake is open (begun, not finished) is kept this long idle: the
# ceiling's max_wake_s; closing it sooner would unmount the overlay its next call must see
SWEEP_EVERY_S = 30.0  # how often the serve loop looks for such pools
EGRESS_CHECK_S = 30.0  # how often an allowlist agent's proxy and netns holder are checked
RATE_KEEP_S = 600.0  # the engine's measured rate is reused this long (op rate)
RATE_CALLS_PER_CORE = 4  # as serve's own measurement (fleet/capacity.py)
RATE_PARALLEL_PER_CORE = 2
STREAM_SLACK = 64 * 2**20  # an import's stream may be twice its disk's size and this (tar's headers)
_CONTAINER_ID = re.compile(r"/containers/([0-9a-f]{64})/")
# Where a kept box is, and for which folder: (workspace, its host path, agent name, disk identity).
Place = tuple[Path, Path, str, "disk_index.Identity | None"]
Call = Callable[[Sandbox], SandboxResult]  # one call the broker allowed, made on the agent's box
T = TypeVar("T")


class Refused(Exception):
    """A request not served as things stand (busy, a wake open, no disk here): one line, the broker's refusal."""


class NoDisk(ConfigError):
    """An agent without a disk: its wakes write the folder directly, nothing to diff or undo (exit 2)."""


# -- where ROOT is on the host -------------------------------------------------------


def own_container_id() -> str | None:
    """This process's container's id (docker binds /etc/hostname from /var/lib/docker/containers/<id>/), or None."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    match = _CONTAINER_ID.search(text)
    return match.group(1) if match else None


def host_root(root: Path, client: docker.DockerClient) -> Path:
    """The host path of ROOT, which the engine needs as the mount source."""
    if os.environ.get(HOST_ROOT_ENV):
        return Path(os.environ[HOST_ROOT_ENV])
    cid = own_container_id()
    if cid is None:
        return root
    mounts = client.api.inspect_container(cid).get("Mounts") or []
    best = None
    for m in mounts:
        dest = Path(m.get("Destination", "/nonexistent"))
        if (root == dest or dest in root.parents) and (best is None or len(str(dest)) > len(str(best[0]))):
            best = (dest, Path(m["Source"]))
    if best is None:
        raise SandboxError(
            f"the broker runs in container {cid[:12]} but {root} is not mounted from "
            f"the host; mount the agents folder there, or set {HOST_ROOT_ENV}"
        )
    dest, source = best
    return source / root.relative_to(dest)


def disks_reach_engine(client: docker.DockerClient) -> bool:
    """Whether the engine sees the mounts this process makes in $WAKELOOP_DISKS (a box's volume binds
    KEY.box there). On the host, yes. In a container, only if that folder is mounted from the host with
    propagation (compose: `bind: {propagation: rshared}`, on a shared mount of the host); then
    disk.HOST_DISKS_ENV is set to where the host has it. Else the engine mounts them (engine_mounts.py)."""
    cid = own_container_id()
    if cid is None:
        return True
    where = disk.disks_dir()
    for m in client.api.inspect_container(cid).get("Mounts") or []:
        if Path(m.get("Destination", "/nonexistent")) == where and m.get("Propagation") in ("rshared", "shared"):
            os.environ.setdefault(disk.HOST_DISKS_ENV, str(m["Source"]))
            return True
    return False


class _HostPathSandbox(DockerSandbox):
    """DockerSandbox for a workspace the broker sees elsewhere than the host does: its disk, its agent
    folder's (on ROOT's filesystem), is mounted for reading at the broker's own path."""

    def __init__(self, workspace: Path, host_workspace: Path, policy: SandboxPolicy, **kwargs: Any) -> None:
        self.host_workspace = host_workspace
        super().__init__(workspace, policy, host_path=host_workspace, private_view=True, **kwargs)


@dataclass
class _AgentBox:
    """One agent's sandbox, kept across requests so its warm pool serves them."""

    box: _HostPathSandbox
    busy: int = 0  # requests using it now: it is closed only when none is
    used: float = field(default_factory=time.monotonic)  # when the last request ended
    retired: bool = False  # out of the dict: its last request closes it
    egress_checked: float = field(default_factory=time.monotonic)  # allowlist: proxy last seen alive


class Keeper:
    """Each agent's kept box, disk, egress and wake under ROOT, for the broker that decided to serve it."""

    def __init__(
        self,
        root: Path,
        client: docker.DockerClient | None = None,
        log: Callable[[str], None] = print,
        *,
        node: str = "",
        max_agents: int,
        overcommit: float | None = None,
    ) -> None:
        self.root, self.node, self.log = root, node, log
        self.client = connect(client)
        self.host_root = host_root(self.root, self.client)
        self.max_agents = max_agents
        self.overcommit = (
            disk_room.OVERCOMMIT if overcommit is None else overcommit
        )  # the ceiling's max.disk_overcommit
        self._boxes: dict[str, _AgentBox] = {}  # by agent folder name
        self._lock = threading.Lock()  # the broker runs each request on a thread
        self._calls: dict[str, int] = {}  # calls in flight on a box, by agent
        self._layering: set[str] = set()  # agents whose begin, finish, undo or move runs: nothing else of theirs does
        self._own: dict[str, tuple[str, int]] = {}  # agent -> (its calls' own wake, calls in it): _own_begin
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S
        self._rate_lock = threading.Lock()
        self._rate_at: tuple[float, rate.Rate] | None = None  # (when, the engine's rate)
        self._held_before = disk.holding()  # another's disks in this process (a test, a probe): not ours to let go
        self.engine_mounts = not disks_reach_engine(self.client)  # KEY.box ours, or the engine's mounts
        # A swarm task's broker without --plain-container: no loop devices, for its whole life.
        self.no_disks = bool(node and disk_attach.unavailable())
        if self.engine_mounts:
            self.log(
                f"the engine cannot see this broker's mounts in {disk.disks_dir()}: it mounts each disk "
                "(kept by a container wakeloop-keep-KEY) and each wake's overlay itself"
            )

    # -- what the broker asks before it decides ------------------------------------------

    @staticmethod
    def user_of(policy: SandboxPolicy, workspace: Path) -> str:
        """The uid a box of `policy` runs as ("auto": the workspace's owner); OSError if it cannot be read."""
        return str(resolve_user(policy.user, workspace))

    def room(self) -> int | None:
        """The bytes this node's disks may still promise (None: no disks), for placement."""
        return disk_room.promise_room(self.overcommit)

    def measured_rate(self) -> rate.Rate | None:
        """The engine's rate if measured, at no cost (not under _rate_lock, held through a measurement)."""
        kept = self._rate_at
        return kept[1] if kept else None

    def rate(self) -> rate.Rate:
        """The engine's create-start-remove rate (rate.py) under the default policy, measured at
        most once per RATE_KEEP_S and one measurement at a time: a flood of asks costs one."""
        with self._rate_lock:
            if self._rate_at is None or time.monotonic() - self._rate_at[0] > RATE_KEEP_S:
                cores = len(os.sched_getaffinity(0))
                calls, parallel = RATE_CALLS_PER_CORE * cores, RATE_PARALLEL_PER_CORE * cores
                # On a scratch folder under ROOT: the engine can bind it.
                measured = rate.measure(
                    self.client, DEFAULT.sandbox, calls, parallel, under=(self.root, self.host_root)
                )
                self._rate_at = (time.monotonic(), measured)
                self.log(
                    f"engine rate: {measured.per_s:.2f} containers/s ({measured.calls} cold calls "
                    f"in {measured.seconds:.1f} s)"
                )
            return self._rate_at[1]

    def pace(self, name: str, how: str) -> None:
        """The agent's kept box (if any) winds its pool down (`wind_down`), or rearms it for a new wake (`rearm`)."""
        with self._lock:
            entry = self._boxes.get(name)
            if entry is not None:
                getattr(entry.box, how)()

    # -- a call, on the agent's kept box -------------------------------------------------

    def call(self, agent: Agent, call: Call, vet: Callable[[str], None]) -> SandboxResult:
        """`call` on the agent's kept box, made or set to the policy just read; `vet` first sees
        the uid the box really runs as ("auto" as its disk resolves it) and may refuse it."""
        name = agent.dir.name
        with self._lock:
            self._not_layering(name)
            self._calls[name] = self._calls.get(name, 0) + 1
        try:
            self._check_egress(name)
            with self._held(agent) as entry:
                vet(entry.box.user)
                own = self._own_begin(name, entry.box)
                note = ""
                try:
                    result = call(entry.box)
                finally:
                    if own:
                        note = self._own_end(agent, entry.box)
                return replace(result, output=result.output + note) if note else result
        finally:
            with self._lock:
                self._calls[name] -= 1
                if not self._calls[name]:
                    del self._calls[name]

    def read(self, agent: Agent, read: Callable[[Files], T]) -> T:
        """`read` of the agent's files (workspace_reads.Files) at its disk as this broker mounts it
        (a wake's merged view while one runs), or its folder."""
        with self._held(agent) as entry:  # makes and mounts the disk on a first request
            return read(entry.box.files())

    def _not_layering(self, name: str) -> None:
        """Lock held: refuse a call of `name`'s while a begin, finish or undo of its disk runs.
        During a finish, a call would bind KEY.box as the overlay goes and write the agent's
        files while the wake's changes are committed into them."""
        if name in self._layering:
            raise Refused(f"{name}: its wake is being begun, committed or undone; try again when that ends")

    @contextmanager
    def _layer_op(self, name: str, check: Callable[[], T]) -> Iterator[T]:
        """One begin, finish or undo of `name`'s disk at a time, and no call meanwhile: a second
        finish would commit the same layer twice at once, a begin would settle (unmount,
        discard) the layer being committed. `check` runs under the lock first; its value is given."""
        with self._lock:
            self._not_layering(name)
            checked = check()
            self._layering.add(name)
        try:
            yield checked
        finally:
            with self._lock:
                self._layering.discard(name)

    # -- one sandbox per agent, its pool kept warm across requests ----------------------

    @contextmanager
    def _held(self, agent: Agent) -> Iterator[_AgentBox]:
        entry = self._acquire(agent)
        try:
            yield entry
        finally:
            self._release(entry)

    def _acquire(self, agent: Agent) -> _AgentBox:
        """The agent's box, made on its first request, set to the policy just read.
        Hand it back with _release."""
        name, policy = agent.dir.name, agent.policy.sandbox
        workspace = agent.workspace.resolve()
        # Which folder has this name now: a kept box made for another (renamed away, a folder
        # swapped in) is not used for it. Its inode and birth mark, never its path.
        identity = disk_index.identity_of(agent.dir, within=self.root) if policy.disk else None
        place = (workspace, self.host_root / workspace.relative_to(self.root), agent.name, identity)
        made = None
        while True:
            stale = []  # retired boxes no request uses, closed outside the lock
            with self._lock:
                entry = self._boxes.get(name)
                # A box with a wake open keeps serving it (a new box would not mount its overlay):
                # what only a new box can change applies from the next wake.
                if entry and not entry.box.wake and _needs_new_box(entry.box, place, policy):
                    stale, entry = [self._retire(name)], None
                if entry is None and made is None:
                    stale.append(self._make_room(name))
                if entry is None and made is not None:
                    entry = self._boxes[name] = _AgentBox(made)
                    made = None
                    self.log(f"{name}: made a sandbox with a pool of {policy.pool} for {place[1]}")
                if entry is not None:
                    if entry.box.policy != policy:
                        entry.box.update_policy(policy)  # drops idle containers of the old settings
                    entry.busy += 1
            for old in filter(None, stale):
                self._close_box(old.box)
            if entry is not None:
                break
            # Made outside the lock: an allowlist agent's first box starts its proxy,
            # and other agents' requests need not wait for that.
            made = self._make_box(agent, place)
        if made is not None:
            made.close()  # a concurrent request for this agent made its box first (same egress: kept)
        return entry

    def _make_box(self, agent: Agent, place: Place) -> _HostPathSandbox:
        policy = agent.policy.sandbox
        try:
            return _HostPathSandbox(
                place[0],
                place[1],
                policy,
                agent=agent.name,
                client=self.client,
                identity=place[3],
                folder=agent.dir,
                within=self.root,
                host_folder=self.host_root / agent.dir.name,
                overcommit=self.overcommit,
                engine_mounts=self.engine_mounts,
                # On a disk its pool starts at the wake's begin, with the overlay: one made now,
                # at the wake's `check`, was drained at begin unused (the fleet bench through
                # the broker: one container in vain for each agent's first wake).
                ahead_at_begin=True,
            )
        except Exception:
            self._drop_egress(place[0], policy)  # a proxy set up halfway is not left behind
            raise

    def _make_room(self, name: str) -> _AgentBox | None:
        """Lock held, before a new agent's box is made: at max_agents, retire the
        longest-idle box (returned, for the caller to close) or refuse if all are busy."""
        if len(self._boxes) < self.max_agents:
            return None
        idle = [(e.used, n) for n, e in self._boxes.items() if e.busy == 0 and not e.box.wake]  # a wake open: kept
        if not idle:
            raise Refused(
                f"{name}: busy: {len(self._boxes)} agents hold a sandbox, the broker's "
                f"max.agents is {self.max_agents}; try again when one's call ends"
            )
        return self._retire(min(idle)[1])

    def _close_box(self, box: _HostPathSandbox) -> None:
        """Close a retired box, and its allowlist proxy, holder and network unless a
        live box has the same egress (the same workspace and hosts): a policy changed
        on every request must not leave one proxy per change."""
        box.close()
        if box.release_problem:
            self.log(f"{box.agent}: {box.release_problem}")
        self._drop_egress(box.workspace, box.policy)

    def _drop_egress(self, workspace: Path, policy: SandboxPolicy) -> None:
        if policy.network != "allowlist":
            return
        key = egress_plan.plan_for(workspace, policy).key
        with self._lock:
            shared = any(
                e.box.policy.network == "allowlist" and egress_plan.plan_for(e.box.workspace, e.box.policy).key == key
                for e in self._boxes.values()
            )
        if not shared:
            network.shutdown(self.client, {key}, shared=False)  # the wakeloop-egress network stays

    def _check_egress(self, name: str) -> None:
        """An allowlist agent's box is made with its proxy and netns holder running, its idle containers in
        that holder's namespace. If either has died since (OOM, a manual `docker rm`), retire the box: the
        next is made with both anew, instead of every call failing until the box goes idle."""
        entry = self._boxes.get(name)
        if (
            entry is None
            or entry.box.policy.network != "allowlist"
            or time.monotonic() - entry.egress_checked < EGRESS_CHECK_S
        ):
            return
        entry.egress_checked = time.monotonic()
        if network.alive(self.client, egress_plan.plan_for(entry.box.workspace, entry.box.policy)):
            return
        if entry.box.wake:  # a new box would not mount the open wake's overlay: from its next wake
            self.log(f"{name}: its allowlist proxy or network holder is gone; a new one comes with its next wake")
            return
        self.log(f"{name}: its allowlist proxy or network holder is gone; making its sandbox anew")
        with self._lock:
            stale = self._retire(name) if self._boxes.get(name) is entry else None
        if stale:
            stale.box.close()

    def _release(self, entry: _AgentBox) -> None:
        with self._lock:
            entry.busy -= 1
            entry.used = time.monotonic()
            done = entry.retired and entry.busy == 0
        if done:
            self._close_box(entry.box)

    def _retire(self, name: str) -> _AgentBox | None:
        """Take an agent's box out of use (lock held). Returns it when no request
        uses it, for the caller to close outside the lock; else _release closes it."""
        entry = self._boxes.pop(name)
        entry.retired = True
        return entry if entry.busy == 0 else None

    def sweep(self) -> None:
        """Close boxes unused for IDLE_CLOSE_S or whose workspace is gone (agent removed or renamed): their
        idle containers would otherwise run, and their disks stay attached, until the broker stops."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY_S
        with self._lock:
            names = [
                n
                for n, e in self._boxes.items()
                if e.busy == 0
                and (now - e.used > (WAKE_IDLE_CLOSE_S if e.box.wake else IDLE_CLOSE_S) or not e.box.workspace.is_dir())
            ]
            idle = [self._retire(n) for n in names]
        for entry in filter(None, idle):  # none is None: each was idle (busy == 0)
            self._close_box(entry.box)
            self.log(f"{entry.box.agent}: closed its idle sandbox and let go of its disk")

    def close(self) -> None:
        """Close every agent's box (at shutdown): its idle containers removed, then its disk released."""
        with self._lock:
            idle = [self._retire(n) for n in list(self._boxes)]
        for entry in idle:
            if entry:
                self._close_box(entry.box)
        # any a box could not let go of: none, normally
        for problem in disk_attach.let_go_all(self.client, kept=self._held_before):
            self.log(problem)

    def remove_leftovers(self) -> int:
        """Remove the containers a crashed broker left for workspaces under ROOT (and their netns holders): how many."""
        # The low-level list: no per-container inspect to race with removals elsewhere.
        stale = self.client.api.containers(all=True, filters={"label": "wakeloop.sandbox=1"})
        under = str(self.root) + "/"
        mine = [c["Id"] for c in stale if (c.get("Labels") or {}).get("wakeloop.workspace", "").startswith(under)]
        for cid in mine:
            try:
                self.client.api.remove_container(cid, force=True)
            except docker.errors.APIError:
                pass  # gone already, or being removed
        return len(mine) + netns.leftovers(self.client, self.root)

    # -- a wake as a transaction (wake_layer.py): the keeper mounts and commits ------------

    def begin(self, agent: Agent, run_id: str) -> Settled:
        """Settle what the agent's earlier wakes left, then mount this wake's overlay in its kept box."""
        name = agent.dir.name
        with self._layer_op(name, lambda: self._no_call(name, "begin")), self._held(agent) as entry:
            settled = entry.box.begin(run_id)
        self.log(f"{name}: wake {run_id} begun" + "".join(f"; {line}" for line in settled.lines))
        return settled

    def finish(self, agent: Agent, run_id: str) -> tuple[WakeChanges, list[dict[str, Any]]]:
        """Check the wake's changes against the policy as the broker read it, commit or drop them; the
        changes and the allowlist proxy's decisions. Refused while a call of the agent runs."""
        name = agent.dir.name
        with self._layer_op(name, lambda: self._finishable(name, run_id)) as entry:
            try:
                policy = agent.policy
                changes = entry.box.finish(policy.workspace.protect, policy.tools.write_file.protect_git)
                if entry.box.disk_root:  # at the wake's end, while the broker surely holds the disk
                    gone = undo_folders.prune(entry.box.disk_root, policy.workspace.keep_undo_days)
                    if gone:
                        self.log(f"{name}: pruned the undo data of {len(gone)} wake(s) past workspace.keep_undo_days")
            finally:
                self._release(entry)
        record = changes.record()
        self.log(f"{name}: wake {run_id} {record.outcome}: {record.count} changed, {record.refused_count} refused")
        return changes, entry.box.egress_decisions()

    def _finishable(self, name: str, run_id: str) -> _AgentBox:
        """Lock held: the wake's box, held (busy) for its finish, if the wake is begun and not
        finished and no call of it runs (nothing may write the layer being committed)."""
        entry = self._boxes.get(name)
        if entry is None or entry.box.begun != run_id:  # begun, not finished (an overlay or not)
            raise Refused(f"{name}: no wake {run_id} is open in the broker")
        self._no_call(name, "finish")
        entry.busy += 1
        return entry

    def _no_call(self, name: str, what: str) -> None:
        """Lock held: a wake begins or finishes only when no call of the agent runs (a call outside
        a wake runs in a wake of its own, which a begin would discard under it)."""
        if self._calls.get(name):
            raise Refused(f"{name}: a call is still running; {what} the wake when it has ended")

    def _no_wake_open(self, name: str) -> None:
        """Lock held: an undo or a move runs only between wakes (a call in flight means one runs all the same)."""
        entry = self._boxes.get(name)
        if self._calls.get(name) or (entry is not None and entry.box.wake):
            raise Refused(f"{name}: a wake is open (begun, not finished); undo when it has ended")

    def diff(self, agent: Agent, run_id: str | None) -> WakeDiff:
        """One wake's diff (wake_diff.py; None: the last to commit), read on the agent's disk."""
        return self._on_disk(agent, lambda root: wake_diff.read(root, run_id))

    def undo(self, agent: Agent, run_id: str, force: bool) -> Undone | str:
        """Put back what wake `run_id` changed, or the one line why not (a later wake changed the
        same paths: an answer, not a broken request). Refused while a call of the agent runs."""
        name = agent.dir.name
        try:
            with self._layer_op(name, lambda: self._no_wake_open(name)):
                undone = self._on_disk(agent, lambda root: undo_folders.undo(root, run_id, force))
        except UndoRefused as exc:
            return str(exc)
        self.log(f"{name}: undid wake {run_id}: {undone.changes} change(s) put back")
        return undone

    def _on_disk(self, agent: Agent, read: Callable[[Path], T]) -> T:
        """`read` of the agent's disk's root (layers.py), as this broker mounts it; its errors one line."""
        name = agent.dir.name
        with self._held(agent) as entry:  # makes and mounts the disk on a first request
            root = entry.box.disk_root
            if root is None:
                raise Refused(f"{name}: its workspace has no disk (sandbox.disk: none): no wake is a transaction")
            try:
                return read(root)
            except (undo_folders.NoSuchWake, undo_folders.BadUndoFolder) as exc:
                raise Refused(f"{name}: {exc}") from None

    # -- a call outside a wake: a wake of its own --------------------------------------------

    def _own_begin(self, name: str, box: DockerSandbox) -> str | None:
        """A call with no wake open, on a disk (`wakeloop sandbox exec`, an orchestrator that never
        begins): it runs in a wake of its own, shared by the calls outside a wake that overlap it
        and committed when the last ends, so workspace.protect binds every call. Its run id, or
        None (a wake is open, or no disk)."""
        with self._lock:
            self._not_layering(name)  # its own wake's begin or finish runs: refused, as any call then
            own = self._own.get(name)
            if own is not None:
                self._own[name] = (own[0], own[1] + 1)
                return own[0]
            if box.begun is not None or box.disk_root is None:
                return None
            run_id = uuid.uuid4().hex[:12]
            self._own[name] = (run_id, 1)
            self._layering.add(name)
        try:
            box.begin(run_id)
        except BaseException:
            box.begun = None  # no wake open: the next call begins one of its own again
            with self._lock:
                del self._own[name]
            raise
        finally:
            with self._lock:
                self._layering.discard(name)
        return run_id

    def _own_end(self, agent: Agent, box: DockerSandbox) -> str:
        """A call of a wake of its own ended: the last one commits it (what workspace.protect
        refuses is dropped). A line for the call's output when something did not land."""
        name = agent.dir.name
        with self._lock:
            run_id, count = self._own[name]
            if count > 1:
                self._own[name] = (run_id, count - 1)
                return ""
            self._layering.add(name)  # no call starts while it commits
        try:
            policy = agent.policy
            changes = box.finish(policy.workspace.protect, policy.tools.write_file.protect_git)
        finally:
            with self._lock:
                del self._own[name]
                self._layering.discard(name)
        record = changes.record()
        self.log(
            f"{name}: call outside a wake, as wake {run_id}: {record.outcome}: {record.count} changed, "
            f"{record.refused_count} refused"
        )
        if changes.error:
            return f"\n[wakeloop: this call's changes did not land: {changes.error}]"
        if changes.refused:
            shown = ", ".join(f"{r.change.path} ({r.rule})" for r in changes.refused[:5])
            more = f" and {len(changes.refused) - 5} more" if len(changes.refused) > 5 else ""
            return f"\n[wakeloop: not landed, refused by the policy at the call's end: {shown}{more}]"
        return ""

    # -- a disk moving to another node (`wakeloop move`; broker/disk_move.py) -------------------

    def disk_here(self, agent: Agent) -> str:
        """The key of the agent's disk, if it has one of its own and this node has one of its folder."""
        name = agent.dir.name
        if not agent.policy.sandbox.disk:
            raise Refused(f"{name}: sandbox.disk: none: its workspace is a folder of ROOT, no disk to move")
        key = disk_index.lookup(agent.dir)
        if key is None:
            raise Refused(f"{name}: no disk of its folder on this node ({self.node or 'one host'})")
        return key

    def export(self, agent: Agent, out: workspace_stream.Writes) -> workspace_stream.Summary:
        """Write the agent's workspace (its disk's files/, as committed) to `out` as a tar stream,
        no call or wake of it meanwhile; the tree's digest and entries."""
        name = agent.dir.name
        with self._layer_op(name, lambda: self._no_wake_open(name)), self._held(agent) as entry:
            return workspace_stream.pack(self._held_disk(entry).files, out)

    def import_(self, agent: Agent, receive: Callable[[int], workspace_stream.Reads]) -> workspace_stream.Summary:
        """Make the agent's disk here (or take the one it has), empty its files/ (and the wake history a disk
        it had here before keeps) and write into files/ the stream `receive(limit)` gives once the disk is
        ready: the tree's digest, read back. In flight meanwhile (disk_room.flight), as a call's writes are."""
        name, size = agent.dir.name, agent.policy.sandbox.disk
        # the disk is made (from the folder's workspace/, cleared below) if new
        with self._layer_op(name, lambda: self._no_wake_open(name)), self._held(agent) as entry:
            held = self._held_disk(entry)
            root, files = held.view, held.files
            disk_attach.unmount_wake(held)
            try:
                with disk_room.flight(held.key, root):
                    for history in (layers.wakes(root), layers.undos(root)):  # of its life before here, if
                        if history.is_dir():  # it had one: a cut commit's recovery would replay it on these
                            workspace_stream.clear(history)
                    workspace_stream.clear(files)
                    return workspace_stream.unpack(receive(2 * size + STREAM_SLACK), files)
            except workspace_stream.StreamRefused as exc:
                raise Refused(f"{name}: import refused: {exc}") from None

    def drop(self, agent: Agent, key: str) -> None:
        """Delete the agent's disk `key` here: its box closed, the disk released and its image removed.
        Between wakes; the broker has checked the agent is placed on another node."""
        name = agent.dir.name
        with self._layer_op(name, lambda: self._no_wake_open(name)):
            with self._lock:
                stale = self._retire(name) if name in self._boxes else None
            if stale:
                self._close_box(stale.box)
            if not disk_attach.release(self.client, key, delete=True):
                raise Refused(f"{name}: its disk here is still held (a request in flight); try again")

    @staticmethod
    def _held_disk(entry: _AgentBox) -> disk.Disk:
        held = entry.box.disk
        if held is None or held.hold is None:
            raise Refused(f"{entry.box.agent}: its disk is not attached here")
        return held


def _needs_new_box(box: _HostPathSandbox, place: Place, policy: SandboxPolicy) -> bool:
    """What update_policy cannot change: the mount and labels, the pool's size, and
    the egress set up when the box was made (an allowlist's proxy and netns holder)."""

    def fixed(p: SandboxPolicy) -> tuple[object, ...]:
        return p.pool, p.network, p.allow_hosts, p.credentials, p.http, p.max_egress_bytes_per_wake, p.ask_hosts

    return (box.workspace, box.host_workspace, box.agent, box.identity) != place or fixed(box.policy) != fixed(policy)


# -- on this host, without a broker ----------------------------------------------------------


def open_here(
    agent: Agent,
    *,
    run_id: str | None = None,
    warm: int | None = None,
    fresh: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> DockerSandbox:
    """The local engine's box for `agent`'s calls, checked (image and runtime) before it is
    returned. `fresh` (a wake holding the agent's lock) also removes containers an earlier,
    interrupted run left for this workspace and prunes the undo folders past keep_undo_days."""
    client, policy = connect(), agent.policy.sandbox
    check_against_engine(agent.policy, client)  # before any container starts
    # ahead_at_begin: a wake's pool starts at its begin, with the overlay
    box = DockerSandbox(
        agent.workspace, policy, agent=agent.name, run_id=run_id, client=client, warm=warm, ahead_at_begin=fresh
    )
    if box.warning:
        say(box.warning)
    if fresh:
        try:
            left = box.cleanup_leftovers()  # the caller holds the lock: any container of this workspace is stale
        except docker.errors.DockerException as exc:
            box.close()  # its pool has started: nothing of this run may outlive it
            raise SandboxError(f"cannot remove the containers an earlier wake left: {exc}") from None
        if left:
            say(f"removed {left} sandbox container(s) left by an earlier, interrupted wake")
        _prune_undo(box.disk_root, agent, say)
    return box


def _prune_undo(root: Path | None, agent: Agent, say: Callable[[str], None]) -> None:
    """At a wake's start: undo folders past workspace.keep_undo_days go; a disk whose cannot be read is said."""
    if root is None:
        return
    days = agent.policy.workspace.keep_undo_days
    try:
        gone = undo_folders.prune(root, days)
    except (undo_folders.BadUndoFolder, OSError) as exc:
        say(f"could not prune the undo folders: {exc}")
        return
    if gone:
        say(f"pruned the undo data of {len(gone)} wake(s) older than {days:g} days (workspace.keep_undo_days)")


def diff_here(agent: Agent, run_id: str | None) -> WakeDiff:
    """One wake's diff, read on this host, on the agent's disk attached as a wake attaches it."""
    with _disk_root(agent) as root:
        return wake_diff.read(root, run_id)


def undo_here(agent: Agent, run_id: str, force: bool) -> Undone:
    """Put back what wake `run_id` changed, on this host; UndoRefused if a later wake changed the
    same paths. The caller holds the agent's wake lock."""
    with _disk_root(agent) as root:
        return undo_folders.undo(root, run_id, force)


@contextmanager
def _disk_root(agent: Agent) -> Iterator[Path]:
    """The agent's disk's root on this host (layers.py), attached for the block."""
    # Only the disk: no container is made, so no allowlist proxy is started for it either.
    quiet = replace(agent.policy.sandbox, network="none", allow_hosts=(), pool=0)
    box = DockerSandbox(agent.workspace, quiet, agent=agent.name, warm=0)
    try:
        if box.disk_root is None:
            raise NoDisk(f"{agent.name}: its workspace has no disk (sandbox.disk: none), so no wake is a transaction")
        yield box.disk_root
    finally:
        box.close()


def let_go_here(held_before: frozenset[Any]) -> list[str]:
    """At a command's end, whatever ended it: the disks it still holds let go (released unless
    another process holds one; `held_before`, an embedding process's own, kept) and the allowlist
    proxies it started removed. A line for each that could not be."""
    lines = []
    if disk.holding() - held_before:
        try:
            problems = disk_attach.let_go_all(connect(), kept=held_before)
        except Exception as exc:  # releasing must not mask the command's own result
            problems = [f"could not release the workspace disk(s): {exc}"]
        lines += [f"{line}; `wakeloop disk release AGENT_DIR` retries" for line in problems]
    if network.started():
        try:
            network.shutdown(connect())
        except Exception as exc:  # nor must shutting down
            lines.append(f"could not remove the allowlist proxy: {exc}")
    return lines
