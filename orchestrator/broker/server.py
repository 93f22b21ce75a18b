"""The sandbox broker: the one process under compose that talks to Docker.

The Docker API is root on the host, so the process that reads model output
(the orchestrator) must not hold it. The broker holds the socket and answers
fifteen ops over a local unix socket or mutual TLS (ops.py, replies.py,
wire.py; docs/architecture.md §5). Three make a container: `run` a command and
`write` a file, in agent X's workspace, under agent X's policy, and
`append` to today's journal, the
harness's stub when a wake ends unjournaled. Seven make none: `diff` and
`undo` (one wake's changes, read or put back on X's disk: below), `check` (would
X be served? asked at each wake's start, so a refusal is one line then, not
an error on every call), `read` (X's memory and journal for the wake's
context), `wind_down` (X's pool makes no more ahead), `rate` (the engine's
rate, for `serve`'s choice of how many wakes at once, measured at most once
every RATE_KEEP_S) and `ping`. Two frame a wake: `begin` and `finish`
(below). Three move X's disk to another node (`wakeloop move`, past one
host; broker/disk_move.py): `export` streams its files out, `import` streams
them into X's disk here, `drop` deletes X's disk here once X is placed on
another node; the import is read as hostile (workspace_stream.py). A
request names the agent (its folder name under ROOT) and the command, the
path and the content, or a run id: nothing else.
The broker loads X's policy itself from ROOT on every request, refuses it
above the ceiling (ceiling.py), takes the timeout and output cap from it,
refuses what it disables, and creates every container through DockerSandbox,
from its own fixed settings. Append is allowed whatever the tools policy says
(a bash-less agent still gets its stub) and so is held to one exact path shape
and a size cap. So a compromised orchestrator can at worst run what the agent
itself could, plus append a bounded note to the agent's journal, read what
one of its wakes changed and put that back (`diff`, `undo`: a run id of 12
hex digits names an undo folder; no path is ever taken from the wire), read
X's files (`export`, as `run` could), replace them (`import`, with what a box
could write: no device, set-id bit, hard link or name outside the disk), and
delete X's disk on a node X is not placed on (`drop`: a copy, not the one in use).

Each agent keeps one DockerSandbox across requests, so its warm pool (the
policy's `sandbox.pool`) serves them as it would a direct wake; a policy
change drains the idle containers made under the old settings. A wake's
`wind_down` (no more calls but its journal stub) stops the pool's refills and
the next wake's `check` starts them again, so no container is made for a call
that will not come. A box unused for IDLE_CLOSE_S, or whose workspace is
gone, is closed (its pool first, then its disk is let go: released unless
another box holds it); all close at exit.

Against an orchestrator taken over (which plants files in ROOT and holds the
socket): an agent name must be a real folder directly under ROOT; agent.yaml
and its policy file are read as untrusted (regular files only, capped, no YAML
aliases: records/yamlfile.py); a request line must arrive whole within
REQUEST_READ_S (transport.py); calls in flight, agents with a box, and open connections are
capped, and a request past a cap is refused at once, never queued; a retired
allowlist box takes its proxy and network with it; log lines are cut short.

The fleet's switch (ROOT/STOP, records/stopswitch.py) is read from ROOT on
every request that could start a container or a wake (`check`, `run`,
`write`, `append`): while it is there each is refused (a BrokerError, so
`refused: true`); and every DockerSandbox here kills its call in flight
within POLL_S of it appearing. The file survives the broker's restart, so a
stop holds until `wakeloop start ROOT` removes it.

Each wake is a transaction (sandbox/wake_layer.py) and the broker does the
mounting and the committing: `begin` settles what the agent's earlier wakes
left and mounts the wake's overlay in its kept box; `finish` checks the
wake's changes against the broker's own reading of the policy
(`workspace.protect`, protect_git), commits or drops them. The orchestrator
names a run id, never a path. A box with a wake open is kept idle up to
WAKE_IDLE_CLOSE_S, not IDLE_CLOSE_S. A broker in a container whose mounts
the engine cannot see (compose without `propagation: rshared`, or on a host
whose `/` is private; disks_reach_engine) has the engine mount each disk and
each wake's overlay itself (sandbox/engine_mounts.py), with the same promises.

It holds no API key and never parses model output: it passes the sandbox's
result back as data. A path-prefix proxy in front of docker.sock could not
give this guarantee: it lets any body through on container create.

The ops and their limits: ops.py; what each answers: replies.py; the line: wire.py.

Workspaces: each agent's is a disk of its own (disk.py), belonging to its
folder by the folder's identity (inode and birth time or generation, never
its name or path: a renamed agent keeps its one disk), attached by the
broker, given to boxes as a volume (by device: nothing the orchestrator does
to paths moves it) and mounted for reading at the broker's own path, never
under ROOT. A kept box is used only while the folder under its name is the
one it was made for: a folder swapped in under that name gets a box (and a
disk) of its own. So the orchestrator reads a workspace through the broker:
op `read`, the same no-follow, capped readers (sandbox/workspace_reads.py) a wake uses
on a host, on that mount. At start the broker asks the engine where its own
ROOT comes from (its own container's mounts); outside a container ROOT is the
host path. A disk is released (unmounted, volume removed, detached; the image
kept) when the last box holding it closes: after IDLE_CLOSE_S unused, when
its folder is gone, and when the broker stops.

Not here: the model, tools' schemas, the event log (all orchestrator-side);
the orchestrator's client (client.py); the sockets, TLS, threads and
`wakeloop broker`'s start and stop (transport.py).
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar, assert_never

import docker

from orchestrator.sandbox import disk, layers, network, rate, undo_folders, wake_diff, workspace_stream
from orchestrator.policy.agent import Agent, AgentError, load_agent
from orchestrator.policy.ceiling import Ceiling, host_covers
from orchestrator.sandbox.engine import resolve_user
from orchestrator.policy.schema import DEFAULT, PolicyError, SandboxPolicy
from orchestrator.broker import edit_op, nodes, ops, replies, wire
from orchestrator.broker.ops import APPEND_TIMEOUT_S
from orchestrator.broker.wire import BrokerError
from orchestrator.sandbox.box import SandboxError, SandboxResult
from orchestrator.sandbox.engine import DockerSandbox, connect
from orchestrator.records import placement, stopswitch

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
# The broker's capacity when the ceiling does not say (max.calls, max.calls_per_agent, max.agents):
# a request past them is refused at once, never queued, so a flood cannot pile up threads.
DEFAULT_MAX_CALLS = 32  # sandbox calls in flight across all agents
DEFAULT_MAX_CALLS_PER_AGENT = 8  # in flight for one agent (a wake makes one at a time)
DEFAULT_MAX_AGENTS = 64  # agents holding a sandbox (a pool, an allowlist proxy) at once
RATE_KEEP_S = 600.0  # the engine's measured rate is reused this long (op rate)
RATE_CALLS_PER_CORE = 4  # as serve's own measurement (fleet/capacity.py)
RATE_PARALLEL_PER_CORE = 2
STREAM_SLACK = 64 * 2**20  # an import's stream may be twice its disk's size and this (tar's headers)
LOG_LINE_CHARS = 300  # a log line (and a refusal's reason in it) is cut to this
_CONTAINER_ID = re.compile(r"/containers/([0-9a-f]{64})/")
# Where a kept box is, and for which folder: (workspace, its host path, agent name, disk identity).
Place = tuple[Path, Path, str, "disk.Identity | None"]
T = TypeVar("T")


# -- where ROOT is on the host -------------------------------------------------------


def own_container_id() -> str | None:
    """The id of the container this process runs in, or None on a plain host.
    Docker bind-mounts /etc/hostname from /var/lib/docker/containers/<id>/."""
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
    """Whether the engine sees the mounts this process makes in $WAKELOOP_DISKS (a box's volume
    binds KEY.box there: disk.py, wake_layer.py). On the host, yes. In a container, only if
    that folder is mounted from the host with propagation (compose: `bind: {propagation:
    rshared}`, on a host whose folder is on a shared mount); then disk.HOST_DISKS_ENV is set to
    where the host has it. Otherwise the engine mounts each disk and wake itself (engine_mounts.py)."""
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
    """DockerSandbox for a workspace the broker sees elsewhere than the host does: its
    disk is its agent folder's (on ROOT's own filesystem), mounted for reading at the
    broker's own path. `identity`: the folder's, read once when the box is made, both
    to claim its disk and to key the kept box (None: no disk)."""

    def __init__(self, workspace: Path, host_workspace: Path, policy: SandboxPolicy, **kwargs: Any) -> None:
        self.host_workspace = host_workspace
        super().__init__(workspace, policy, host_path=host_workspace, private_view=True, **kwargs)


# -- the service ------------------------------------------------------------------------


def real_agent_dir(root: Path, name: str) -> Path:
    """ROOT/name if it is a real folder, checked without following links: a symlink
    would make agent X mean another folder (another agent's, or one outside ROOT),
    served under X's name and counted against X's limits."""
    agent_dir = root / name
    try:
        st = agent_dir.lstat()
    except OSError:
        raise BrokerError(f"{name}: no such agent folder under {root}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise BrokerError(
            f"{name}: not a folder directly under {root} (a symlink or a file); "
            "the broker serves only real agent folders"
        )
    return agent_dir


@dataclass
class _AgentBox:
    """One agent's sandbox, kept across requests so its warm pool serves them."""

    box: _HostPathSandbox
    busy: int = 0  # requests using it now: it is closed only when none is
    used: float = field(default_factory=time.monotonic)  # when the last request ended
    retired: bool = False  # out of the dict: its last request closes it
    egress_checked: float = field(default_factory=time.monotonic)  # allowlist: proxy last seen alive


class Broker:
    """Turns one request into one sandbox call for one agent under ROOT."""

    def __init__(
        self,
        root: Path,
        client: docker.DockerClient | None = None,
        log: Callable[[str], None] = print,
        ceiling: Ceiling | None = None,
        node: str | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.node = nodes.this_node() if node is None else node  # past one host, its node's name; "" on one
        self.ceiling = ceiling or Ceiling()  # what no agent's policy may exceed
        self.client = connect(client)
        self.host_root = host_root(self.root, self.client)
        # Cut to LOG_LINE_CHARS: a planted reason cannot flood the log.
        self.log: Callable[[str], None] = lambda line: log(cut_to_line(line, LOG_LINE_CHARS))
        self._boxes: dict[str, _AgentBox] = {}  # by agent folder name
        self._lock = threading.Lock()  # the server runs each request on a thread
        self._calls: dict[str, int] = {}  # sandbox calls in flight, by agent
        self._layering: set[str] = set()  # agents whose begin, finish or undo runs: nothing else of theirs does
        self._own: dict[str, tuple[str, int]] = {}  # agent -> (its calls' own wake, calls in it): _own_begin
        capacity = self.ceiling.max
        self.max_calls = int(capacity.get("calls", DEFAULT_MAX_CALLS))
        self.max_calls_per_agent = int(capacity.get("calls_per_agent", DEFAULT_MAX_CALLS_PER_AGENT))
        self.max_agents = int(capacity.get("agents", DEFAULT_MAX_AGENTS))
        self.disk_overcommit = capacity.get("disk_overcommit", disk.OVERCOMMIT)  # thin disks' bound
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S
        self._rate_lock = threading.Lock()
        self._rate_at: tuple[float, replies.EngineRate] | None = None  # (when, the rate op's answer)
        self._held_before = disk.holding()  # another's disks in this process (a test, a probe): not ours to let go
        self.engine_mounts = not disks_reach_engine(self.client)  # KEY.box ours, or the engine's mounts
        # A swarm task's broker without --plain-container: no loop devices, for its whole life.
        self.swarm_without_disks = bool(self.node and disk.unavailable())
        if self.engine_mounts:
            self.log(
                f"the engine cannot see this broker's mounts in {disk.disks_dir()}: it mounts each disk "
                "(kept by a container wakeloop-keep-KEY) and each wake's overlay itself"
            )

    def handle(self, raw: object) -> wire.JSONObject:
        """One request line's JSON value, its reply's (in the ok envelope); BrokerError if refused."""
        return wire.ok(replies.to_json(self.serve(ops.parse(raw))))

    def serve(self, req: ops.Request) -> replies.Reply:
        """One request, its reply (replies.py); BrokerError if refused. The transport encodes it."""
        match req:
            case ops.Ping():  # node, rate and room: for placement past one host (nodes.py)
                return self._standing()
            case ops.Rate():  # serve fits its K to the engine it cannot see
                return self._rate()
            case ops.WindDown():  # a hint that costs nothing to obey: no policy read, no box made
                self._pace(req.agent, "wind_down")
                return replies.WoundDown()
            case ops.Finish():  # whatever ended the wake, a stop of the fleet included
                return self._finish(self._agent(req.agent), req.run_id)
            case ops.Drop():  # a move's last step: it starts nothing
                return self.drop(req)
            case ops.Export() | ops.Import():
                raise BrokerError(f"{req.op} streams frames: the transport serves it, over a connection of its own")
            case ops.Read():  # reads and undos start nothing: served while the fleet is stopped
                return self._read(self._agent(req.agent), req)
            case ops.Diff():
                agent = self._agent(req.agent)
                return self._on_disk(agent, lambda root: wake_diff.read(root, req.run_id))
            case ops.Undo():
                return self._undo(self._agent(req.agent), req)
            case ops.Check():  # loaded, inside ROOT, within the ceiling: calls will not be refused for that
                agent = self._startable(req.agent)
                self._pace(agent.dir.name, "rearm")  # a wake starts: its kept pool makes one ahead again
                return replies.Checked(agent.dir.name)
            case ops.Begin():
                return self._begin(self._startable(req.agent), req.run_id)
            case ops.Run() | ops.Write() | ops.Edit() | ops.Append():
                return self._call(self._startable(req.agent), req)
            case _:
                assert_never(req)

    def _startable(self, name: str) -> Agent:
        """The agent, for a request that could start a container or a wake: refused while the fleet is stopped."""
        halted = stopswitch.read(self.root)
        if halted is not None:
            raise BrokerError(f"{name}: refused: {halted.describe()}")
        return self._agent(name)

    def _call(self, agent: Agent, req: ops.Run | ops.Write | ops.Edit | ops.Append) -> SandboxResult:
        """One call that makes a container, as the agent's policy allows it."""
        call = self._allowed(agent, req)  # a refusal comes before any box or container is made
        name = agent.dir.name
        self._take_call_slot(name)  # refused at once past max.calls / max.calls_per_agent
        try:
            self._check_egress(name)
            entry = self._acquire(agent)
            try:
                over = self.ceiling.refusal(agent.policy, user=entry.box.user)  # "auto" as the disk resolves it
                if over:
                    raise BrokerError(f"{name}: {over}")
                own = self._own_begin(name, entry.box)
                note = ""
                try:
                    result = call(entry.box)
                finally:
                    if own:
                        note = self._own_end(agent, entry.box)
                if note:
                    result = replace(result, output=result.output + note)
            finally:
                self._release(entry)
        finally:
            with self._lock:
                self._calls[name] -= 1
                if not self._calls[name]:
                    del self._calls[name]
        self.log(
            f"{agent.dir.name}: {req.op} exit {result.exit_code}"
            f"{' timed out' if result.timed_out else ''}{' oom' if result.oom_killed else ''}"
            f" in {result.duration_ms}ms, {result.output_bytes:,} bytes, container {result.container_id}"
        )
        return result

    def _standing(self) -> replies.Standing:
        """What a ping says of this node at no cost: the engine's rate if measured (None if not:
        measuring takes seconds, and the `rate` op does it) and the disk its disks may still promise."""
        kept = self._rate_at  # not under _rate_lock, held through a measurement: one read of a tuple
        measured = kept[1].per_s if kept else None
        return replies.Standing(str(self.root), self.node, measured, disk.promise_room(self.disk_overcommit))

    def _rate(self) -> replies.EngineRate:
        """The engine's create-start-remove rate (sandbox/rate.py) under the default
        policy, measured at most once per RATE_KEEP_S and one measurement at a time:
        a flood of `rate` requests costs the engine one measurement."""
        with self._rate_lock:
            if self._rate_at is None or time.monotonic() - self._rate_at[0] > RATE_KEEP_S:
                cores = len(os.sched_getaffinity(0))
                measured = rate.measure(  # on a scratch folder under ROOT: the engine can bind it
                    self.client,
                    DEFAULT.sandbox,
                    RATE_CALLS_PER_CORE * cores,
                    RATE_PARALLEL_PER_CORE * cores,
                    under=(self.root, self.host_root),
                )
                self._rate_at = (
                    time.monotonic(),
                    replies.EngineRate(measured.per_s, measured.calls, measured.seconds, measured.latency_s),
                )
                self.log(
                    f"engine rate: {measured.per_s:.2f} containers/s ({measured.calls} cold calls "
                    f"in {measured.seconds:.1f} s)"
                )
            return self._rate_at[1]

    def _pace(self, name: str, how: str) -> None:
        """The agent's kept box (if any) winds its pool down, or rearms it for a new wake."""
        with self._lock:
            entry = self._boxes.get(name)
            if entry is not None:
                getattr(entry.box, how)()

    def _agent(self, name: str) -> Agent:
        agent_dir = real_agent_dir(self.root, name)
        try:
            agent = load_agent(agent_dir)  # fresh every call: the policy on disk is the policy
        except (AgentError, PolicyError) as exc:
            raise BrokerError(str(exc)) from None
        workspace = agent.workspace.resolve()
        if self.root not in workspace.parents:
            raise BrokerError(f"{name}: workspace resolves to {workspace}, outside {self.root}")
        try:
            user = str(resolve_user(agent.policy.sandbox.user, workspace))  # "auto" is bounded as resolved
        except OSError as exc:
            raise BrokerError(f"{name}: cannot stat its workspace: {exc.strerror}") from None
        over = self.ceiling.refusal(agent.policy, user=user)
        if over:
            raise BrokerError(f"{name}: {over}")
        if agent.policy.sandbox.disk and self.swarm_without_disks:
            raise BrokerError(
                f"{name}: sandbox.disk needs loop devices, which a swarm service cannot be given "
                f"(moby/moby#35028): run the broker with --plain-container, as compose.yaml does "
                f"on a swarm, or set `sandbox.disk: none`"
            )
        return agent

    def _not_layering(self, name: str) -> None:
        """Lock held: refuse a call of `name`'s while a begin, finish or undo of its disk runs.
        During a finish, a call would bind KEY.box as the overlay goes and write the agent's
        files while the wake's changes are committed into them."""
        if name in self._layering:
            raise BrokerError(f"{name}: its wake is being begun, committed or undone; try again when that ends")

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

    def _take_call_slot(self, name: str) -> None:
        """Count a call in flight, or refuse it at once: never queued, so a flood of
        `sleep 30`s holds at most max.calls threads and containers."""
        with self._lock:
            self._not_layering(name)
            total, mine = sum(self._calls.values()), self._calls.get(name, 0)
            if mine >= self.max_calls_per_agent:
                raise BrokerError(
                    f"{name}: busy: {mine} calls in flight for this agent, the broker's "
                    f"max.calls_per_agent is {self.max_calls_per_agent}; try again when one ends"
                )
            if total >= self.max_calls:
                raise BrokerError(
                    f"{name}: busy: {total} calls in flight, the broker's max.calls is "
                    f"{self.max_calls}; try again when one ends"
                )
            self._calls[name] = mine + 1

    # -- one sandbox per agent, its pool kept warm across requests ----------------------

    def _acquire(self, agent: Agent) -> _AgentBox:
        """The agent's box, made on its first request, set to the policy just read.
        Hand it back with _release."""
        name, policy = agent.dir.name, agent.policy.sandbox
        workspace = agent.workspace.resolve()
        # Which folder has this name now: a kept box made for another (renamed away, a folder
        # swapped in) is not used for it. Its inode and birth mark, never its path.
        identity = disk.identity_of(agent.dir, within=self.root) if policy.disk else None
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
            try:
                made = _HostPathSandbox(
                    place[0],
                    place[1],
                    policy,
                    agent=agent.name,
                    client=self.client,
                    identity=identity,
                    folder=agent.dir,
                    within=self.root,
                    host_folder=self.host_root / name,
                    overcommit=self.disk_overcommit,
                    engine_mounts=self.engine_mounts,
                    # On a disk its pool starts at the wake's begin, with the overlay: one made now,
                    # at the wake's `check`, was drained at begin unused (the fleet bench through
                    # the broker: one container in vain for each agent's first wake).
                    ahead_at_begin=True,
                )
            except Exception:
                self._drop_egress(workspace, policy)  # a proxy set up halfway is not left behind
                raise
        if made is not None:
            made.close()  # a concurrent request for this agent made its box first (same egress: kept)
        return entry

    def _make_room(self, name: str) -> _AgentBox | None:
        """Lock held, before a new agent's box is made: at max.agents, retire the
        longest-idle box (returned, for the caller to close) or refuse if all are busy."""
        if len(self._boxes) < self.max_agents:
            return None
        idle = [(e.used, n) for n, e in self._boxes.items() if e.busy == 0 and not e.box.wake]  # a wake open: kept
        if not idle:
            raise BrokerError(
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
        key = network.plan_for(workspace, policy).key
        with self._lock:
            shared = any(
                e.box.policy.network == "allowlist" and network.plan_for(e.box.workspace, e.box.policy).key == key
                for e in self._boxes.values()
            )
        if not shared:
            network.shutdown(self.client, {key}, shared=False)  # the wakeloop-egress network stays

    def _check_egress(self, name: str) -> None:
        """An allowlist agent's box is made with its proxy and netns holder running,
        and its idle containers live in that holder's network namespace. If either
        has died since (OOM, a manual `docker rm`), retire the box: the next is made
        with both anew, instead of every call failing until the box goes idle."""
        entry = self._boxes.get(name)
        if (
            entry is None
            or entry.box.policy.network != "allowlist"
            or time.monotonic() - entry.egress_checked < EGRESS_CHECK_S
        ):
            return
        entry.egress_checked = time.monotonic()
        if network.alive(self.client, network.plan_for(entry.box.workspace, entry.box.policy)):
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
        """Close boxes unused for IDLE_CLOSE_S or whose workspace is gone (agent removed
        or renamed): their idle containers would otherwise run, and their disks stay
        attached, until the broker stops. A box closes its pool, then lets go of its disk."""
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
        """Close every agent's box (at shutdown): its idle containers removed, then its
        disk released (unmounted, volume removed, loop device freed; the image kept)."""
        with self._lock:
            idle = [self._retire(n) for n in list(self._boxes)]
        for entry in idle:
            if entry:
                self._close_box(entry.box)
        for problem in disk.let_go_all(self.client, kept=self._held_before):  # any a box could not: none, normally
            self.log(problem)

    # -- a wake as a transaction (sandbox/wake_layer.py): the broker mounts and commits ----------

    def _begin(self, agent: Agent, run_id: str) -> replies.Begun:
        """Settle what the agent's earlier wakes left, then mount this wake's overlay in its kept box."""
        with self._layer_op(agent.dir.name, lambda: self._no_call(agent.dir.name)):
            entry = self._acquire(agent)
            try:
                settled = entry.box.begin(run_id)
            finally:
                self._release(entry)
        self.log(f"{agent.dir.name}: wake {run_id} begun" + "".join(f"; {line}" for line in settled.lines))
        return replies.Begun(settled.lines, tuple(w.record() for w in settled.discarded))

    def _finish(self, agent: Agent, run_id: str) -> replies.Finished:
        """Check the wake's changes against the policy as the broker reads it, commit or drop them.
        Refused while a call of the agent runs: nothing may write the layer being committed."""
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
        return replies.Finished(record, tuple(entry.box.egress_decisions()))

    def _finishable(self, name: str, run_id: str) -> _AgentBox:
        """Lock held: the wake's box, held (busy) for its finish, if the wake is begun and not
        finished and no call of it runs (nothing may write the layer being committed)."""
        entry = self._boxes.get(name)
        if entry is None or entry.box.begun != run_id:  # begun, not finished (an overlay or not)
            raise BrokerError(f"{name}: no wake {run_id} is open in the broker")
        if self._calls.get(name):
            raise BrokerError(f"{name}: a call is still running; finish the wake when it has ended")
        entry.busy += 1
        return entry

    def _no_call(self, name: str) -> None:
        """Lock held: a wake begins only when no call of the agent runs (a call outside a wake runs
        in a wake of its own, which a begin would discard under it)."""
        if self._calls.get(name):
            raise BrokerError(f"{name}: a call is still running; begin the wake when it has ended")

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

    def _no_wake_open(self, name: str) -> None:
        """Lock held: an undo runs only between wakes (a call in flight means one runs all the same)."""
        entry = self._boxes.get(name)
        if self._calls.get(name) or (entry is not None and entry.box.wake):
            raise BrokerError(f"{name}: a wake is open (begun, not finished); undo when it has ended")

    def _read(self, agent: Agent, req: ops.Read) -> replies.ReadReply:
        """files.Files, read at the agent's disk as this broker mounts it (or its folder)."""
        entry = self._acquire(agent)  # makes and mounts the disk on a first request
        try:
            files = entry.box.files()  # a wake's merged view while one runs
            if req.what == "journal_names":
                return replies.Names(tuple(files.journal_names()))
            return replies.READ_REPLIES[req.what](getattr(files, req.what)(req.arg))
        finally:
            self._release(entry)

    # -- a wake's transaction, on the disk only the broker mounts ----------------------------

    def _on_disk(self, agent: Agent, read: Callable[[Path], T]) -> T:
        """`read` of the agent's disk's root (layers.py), as this broker mounts it; its errors one line."""
        name = agent.dir.name
        entry = self._acquire(agent)  # makes and mounts the disk on a first request
        try:
            root = entry.box.disk_root
            if root is None:
                raise BrokerError(f"{name}: its workspace has no disk (sandbox.disk: none): no wake is a transaction")
            return read(root)
        except (undo_folders.NoSuchWake, undo_folders.BadUndoFolder) as exc:
            raise BrokerError(f"{name}: {exc}") from None
        finally:
            self._release(entry)

    def _undo(self, agent: Agent, req: ops.Undo) -> replies.UndoAnswer:
        """Put back what wake req.run_id changed. The orchestrator holds the agent's wake lock
        (cli.py); a call in flight here means a wake runs all the same, and is refused."""
        name = agent.dir.name
        try:
            with self._layer_op(name, lambda: self._no_wake_open(name)):
                undone = self._on_disk(agent, lambda root: undo_folders.undo(root, req.run_id, req.force))
        except undo_folders.UndoRefused as exc:  # an answer, not a broken request: the CLI's exit 1
            return replies.UndoAnswer(refused=str(exc))
        self.log(f"{name}: undid wake {req.run_id}: {undone.changes} change(s) put back")
        return replies.UndoAnswer(undone)

    # -- a disk moving to another node (`wakeloop move`; broker/disk_move.py) -------------------

    def export(self, req: ops.Export, out: workspace_stream.Writes) -> workspace_stream.Summary:
        """Write the agent's workspace (its disk's files/, as committed) to `out` as a tar stream,
        no call or wake of it meanwhile; the tree's digest and entries."""
        agent, _ = self._disk_here(req.agent)
        name = agent.dir.name
        with self._layer_op(name, lambda: self._no_wake_open(name)):
            entry = self._acquire(agent)
            try:
                summary = workspace_stream.pack(self._held_disk(entry).files, out)
            finally:
                self._release(entry)
        self.log(f"{name}: exported its workspace, {summary.entries} entries, digest {summary.digest[:12]}")
        return summary

    def import_(self, req: ops.Import, receive: Callable[[int], workspace_stream.Reads]) -> workspace_stream.Summary:
        """Make the agent's disk here (or take the one it has), empty its files/ (and the wake history
        a disk it had here before keeps) and write into files/ the stream `receive(limit)` gives once
        the disk is ready: the tree's digest, read back. Refused for an agent placed on this node:
        its disk here is the one in use. The disk counts as in flight meanwhile (disk.flight): the
        writes are a call's, bounded by the disk's size."""
        agent = self._agent(req.agent)
        name, size = agent.dir.name, agent.policy.sandbox.disk
        if not size:
            raise BrokerError(f"{name}: sandbox.disk: none: its workspace is a folder of ROOT, no disk to import")
        self._placed_elsewhere(agent)
        with self._layer_op(name, lambda: self._no_wake_open(name)):
            entry = self._acquire(agent)  # made (from the folder's workspace/, cleared below) if new
            try:
                held = self._held_disk(entry)
                root, files = held.view, held.files
                disk.unmount_wake(held)
                with disk.flight(held.key, root):
                    for history in (layers.wakes(root), layers.undos(root)):  # of its life before here, if
                        if history.is_dir():  # it had one: a cut commit's recovery would replay it on these
                            workspace_stream.clear(history)
                    workspace_stream.clear(files)
                    summary = workspace_stream.unpack(receive(2 * size + STREAM_SLACK), files)
            except workspace_stream.StreamRefused as exc:
                raise BrokerError(f"{name}: import refused: {exc}") from None
            finally:
                self._release(entry)
        self.log(f"{name}: imported its workspace, {summary.entries} entries, digest {summary.digest[:12]}")
        return summary

    def drop(self, req: ops.Drop) -> replies.Dropped:
        """Delete the agent's disk here: its box closed, the disk released and its image removed.
        Only for an agent placed on another node (its disk there in use), between wakes."""
        agent, key = self._disk_here(req.agent)
        name, there = agent.dir.name, self._placed_elsewhere(agent)
        if there is None:
            raise BrokerError(f"{name}: it is placed on no node: its disk here is the only one")
        with self._layer_op(name, lambda: self._no_wake_open(name)):
            with self._lock:
                stale = self._retire(name) if name in self._boxes else None
            if stale:
                self._close_box(stale.box)
            if not disk.release(self.client, key, delete=True):
                raise BrokerError(f"{name}: its disk here is still held (a request in flight); try again")
        self.log(f"{name}: deleted its disk {key} here: it is placed on {there}")
        return replies.Dropped(key)

    def _disk_here(self, name: str) -> tuple[Agent, str]:
        """The agent and its disk's key, if it has a disk of its own and this node has one of its folder."""
        agent = self._agent(name)
        if not agent.policy.sandbox.disk:
            raise BrokerError(f"{name}: sandbox.disk: none: its workspace is a folder of ROOT, no disk to move")
        key = disk.lookup(agent.dir)
        if key is None:
            raise BrokerError(f"{name}: no disk of its folder on this node ({self.node or 'one host'})")
        return agent, key

    def _placed_elsewhere(self, agent: Agent) -> str | None:
        """The node the agent is placed on (None: none yet); refused if it is this one, or if this
        broker names no node (one host): its disk here is then the one in use."""
        there = placement.read_node(agent.state_dir)
        if not self.node or there == self.node:
            raise BrokerError(
                f"{agent.dir.name}: it is placed on this node ({self.node or 'one host'}): its disk here is in use"
            )
        return there

    @staticmethod
    def _held_disk(entry: _AgentBox) -> disk.Disk:
        held = entry.box.disk
        if held is None or held.hold is None:
            raise BrokerError(f"{entry.box.agent}: its disk is not attached here")
        return held

    # -- the three ops that make a container ------------------------------------------

    def _allowed(
        self, agent: Agent, req: ops.Run | ops.Write | ops.Edit | ops.Append
    ) -> Callable[[DockerSandbox], SandboxResult]:
        """The call the agent's policy allows, or BrokerError. Append is allowed whatever
        the tools policy says (a bash-less agent still gets its stub): ops.parse held it
        to one path shape and a size cap."""
        if isinstance(req, ops.Run):
            bash = agent.policy.tools.bash
            if not bash.enabled:
                raise BrokerError(f"{agent.dir.name}: the bash tool is disabled by this agent's policy")
            cap = min(bash.max_output_chars, req.max_output_chars or bash.max_output_chars)
            refusal = self._grant_refusal(agent, req.grant_hosts) if req.grant_hosts else ""
            if refusal:
                raise BrokerError(f"{agent.dir.name}: grant_hosts: {refusal}")
            grant = req.grant_hosts
            return lambda box: box.run(req.command, timeout_s=bash.timeout_s, max_output_chars=cap, grant_hosts=grant)
        if isinstance(req, ops.Edit):
            return edit_op.allowed(agent.dir.name, agent.policy, req)
        if isinstance(req, ops.Append):
            return lambda box: box.write(req.path, req.content, timeout_s=APPEND_TIMEOUT_S, append=True)
        tool = agent.policy.tools.write_file
        reason = tool.refusal(req.path, len(req.content))
        if reason:
            raise BrokerError(f"{agent.dir.name}: {reason}")
        return lambda box: box.write(req.path, req.content, timeout_s=tool.timeout_s, protect_git=tool.protect_git)

    def _grant_refusal(self, agent: Agent, hosts: tuple[str, ...]) -> str:
        """A person's approval reaches the broker as the hosts an orchestrator asks for: only those
        the agent's policy asks about (its network_host globs) and the ceiling's hosts admit."""
        refusal = network.grant_refusal(agent.policy.sandbox, hosts)
        if refusal or self.ceiling.hosts is None:
            return refusal
        outside = [h for h in hosts if not any(host_covers(a, h) for a in self.ceiling.hosts)]
        return f"{outside[0]} is not a host the broker allows (ceiling {self.ceiling.source})" if outside else ""


def _needs_new_box(box: _HostPathSandbox, place: Place, policy: SandboxPolicy) -> bool:
    """What update_policy cannot change: the mount and labels, the pool's size, and
    the egress set up when the box was made (an allowlist's proxy and netns holder)."""

    def fixed(p: SandboxPolicy) -> tuple[object, ...]:
        return p.pool, p.network, p.allow_hosts, p.credentials, p.http, p.max_egress_bytes_per_wake, p.ask_hosts

    return (box.workspace, box.host_workspace, box.agent, box.identity) != place or fixed(box.policy) != fixed(policy)


def cut_to_line(text: str, limit: int) -> str:
    """One line of at most `limit` characters (a planted YAML error can be many)."""
    text = " ".join(text.splitlines())
    return text if len(text) <= limit else text[: limit - 1] + "…"
