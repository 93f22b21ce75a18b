"""The sandbox broker: the one process under compose that talks to Docker, and what it decides.

The Docker API is root on the host, so the process that reads model output
(the orchestrator) must not hold it. The broker holds the socket and answers
fifteen ops over a local unix socket or mutual TLS (ops.py, replies.py,
wire.py; docs/architecture.md §5). Each request goes one way: parsed (ops.py),
checked here against the agent folder, its policy, the ceiling, the caps and
the fleet's switch, then done by the keeper (sandbox/keeper.py: the agent's
kept box, disk, egress and wake's layer, and the engine's rate), its typed
reply given back (replies.py).

Three ops make a container: `run` a command and `write` a file, in agent X's
workspace, under agent X's policy, and `append` to today's journal, the
harness's stub when a wake ends unjournaled. Seven make none: `diff` and
`undo` (one wake's changes, read or put back on X's disk), `check` (would
X be served? asked at each wake's start, so a refusal is one line then, not
an error on every call), `read` (X's memory and journal for the wake's
context), `wind_down` (X's pool makes no more ahead), `rate` (the engine's
rate, for `serve`'s choice of how many wakes at once) and `ping`. Two frame a
wake: `begin` and `finish`. Three move X's disk to another node (`wakeloop
move`, past one host; broker/disk_move.py): `export` streams its files out,
`import` streams them into X's disk here, `drop` deletes X's disk here once X
is placed on another node; the import is read as hostile
(workspace_stream.py). A request names the agent (its folder name under
ROOT) and the command, the path and the content, or a run id: nothing else.

The broker loads X's policy itself from ROOT on every request, refuses it
above the ceiling (ceiling.py), takes the timeout and output cap from it,
refuses what it disables, and has every container made by the keeper, from
its own fixed settings. Append is allowed whatever the tools policy says
(a bash-less agent still gets its stub) and so is held to one exact path shape
and a size cap. So a compromised orchestrator can at worst run what the agent
itself could, plus append a bounded note to the agent's journal, read what
one of its wakes changed and put that back (`diff`, `undo`: a run id of 12
hex digits names an undo folder; no path is ever taken from the wire), read
X's files (`export`, as `run` could), replace them (`import`, with what a box
could write: no device, set-id bit, hard link or name outside the disk), and
delete X's disk on a node X is not placed on (`drop`: a copy, not the one in use).

Against an orchestrator taken over (which plants files in ROOT and holds the
socket): an agent name must be a real folder directly under ROOT; agent.yaml
and its policy file are read as untrusted (regular files only, capped, no YAML
aliases: safeio/yamlfile.py); a request line must arrive whole within
REQUEST_READ_S (transport.py); calls in flight, agents with a box, and open
connections are capped, and a request past a cap is refused at once, never
queued; log lines are cut short.

The fleet's switch (ROOT/STOP, records/stopswitch.py) is read from ROOT on
every request that could start a container or a wake (`check`, `run`,
`write`, `append`, `begin`): while it is there each is refused (a BrokerError,
so `refused: true`); and every DockerSandbox kills its call in flight within
POLL_S of it appearing. The file survives the broker's restart, so a stop
holds until `wakeloop start ROOT` removes it.

It holds no API key and never parses model output: it passes the sandbox's
result back as data. A path-prefix proxy in front of docker.sock could not
give this guarantee: it lets any body through on container create.

Not here: what is kept for each agent (its box, disk, egress, wake's layer)
and how (sandbox/keeper.py); the model, tools' schemas, the event log (all
orchestrator-side); the orchestrator's client (client.py); the sockets, TLS,
threads and `wakeloop broker`'s start and stop (transport.py).
"""

from __future__ import annotations

import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import assert_never

import docker

from orchestrator.broker import edit_op, nodes, ops, replies, wire
from orchestrator.broker.ops import APPEND_TIMEOUT_S
from orchestrator.broker.wire import BrokerError
from orchestrator.policy.agent import Agent, AgentError, load_agent
from orchestrator.policy.ceiling import Ceiling, host_covers
from orchestrator.policy.schema import PolicyError
from orchestrator.records import placement, stopswitch
from orchestrator.sandbox import keeper
from orchestrator.sandbox.box import SandboxResult
from orchestrator.sandbox.disks.workspace_stream import Reads, Summary, Writes
from orchestrator.sandbox.egress.egress_plan import grant_refusal

# The broker's capacity when the ceiling does not say (max.calls, max.calls_per_agent, max.agents):
# a request past them is refused at once, never queued, so a flood cannot pile up threads.
DEFAULT_MAX_CALLS = 32  # sandbox calls in flight across all agents
DEFAULT_MAX_CALLS_PER_AGENT = 8  # in flight for one agent (a wake makes one at a time)
DEFAULT_MAX_AGENTS = 64  # agents holding a sandbox (a pool, an allowlist proxy) at once
LOG_LINE_CHARS = 300  # a log line (and a refusal's reason in it) is cut to this


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


@contextmanager
def _refusals() -> Iterator[None]:
    """What the keeper will not do as things stand (busy, a wake open) is the broker's refusal."""
    try:
        yield
    except keeper.Refused as exc:
        raise BrokerError(str(exc)) from None


class Broker:
    """Turns one request into one decision and, if served, one ask of the keeper for one agent under ROOT."""

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
        # Cut to LOG_LINE_CHARS: a planted reason cannot flood the log.
        self.log: Callable[[str], None] = lambda line: log(cut_to_line(line, LOG_LINE_CHARS))
        self._lock = threading.Lock()  # the server runs each request on a thread
        self._calls: dict[str, int] = {}  # sandbox calls in flight, by agent: max.calls, max.calls_per_agent
        capacity = self.ceiling.max
        self.max_calls = int(capacity.get("calls", DEFAULT_MAX_CALLS))
        self.max_calls_per_agent = int(capacity.get("calls_per_agent", DEFAULT_MAX_CALLS_PER_AGENT))
        self.keeper = keeper.Keeper(
            self.root,
            client,
            self.log,
            node=self.node,
            max_agents=int(capacity.get("agents", DEFAULT_MAX_AGENTS)),  # the keeper makes room, or refuses
            overcommit=capacity.get("disk_overcommit"),  # thin disks' bound (None: disk.py's)
        )

    def handle(self, raw: object) -> wire.JSONObject:
        """One request line's JSON value, its reply's (in the ok envelope); BrokerError if refused."""
        return wire.ok(replies.to_json(self.serve(ops.parse(raw))))

    def serve(self, req: ops.Request) -> replies.Reply:
        """One request, its reply (replies.py); BrokerError if refused. The transport encodes it."""
        with _refusals():
            match req:
                case ops.Ping():  # node, rate and room: for placement past one host (nodes.py)
                    return self._standing()
                case ops.Rate():  # serve fits its K to the engine it cannot see
                    rate = self.keeper.rate()
                    return replies.EngineRate(rate.per_s, rate.calls, rate.seconds, rate.latency_s)
                case ops.WindDown():  # a hint that costs nothing to obey: no policy read, no box made
                    self.keeper.pace(req.agent, "wind_down")
                    return replies.WoundDown()
                case ops.Finish():  # whatever ended the wake, a stop of the fleet included
                    changes, egress = self.keeper.finish(self._agent(req.agent), req.run_id)
                    return replies.Finished(changes.record(), tuple(egress))
                case ops.Drop():  # a move's last step: it starts nothing
                    return self._drop(req)
                case ops.Export() | ops.Import():
                    raise BrokerError(f"{req.op} streams frames: the transport serves it, over a connection of its own")
                case ops.Read():  # reads and undos start nothing: served while the fleet is stopped
                    return self._read(self._agent(req.agent), req)
                case ops.Diff():
                    return self.keeper.diff(self._agent(req.agent), req.run_id)
                case ops.Undo():
                    undone = self.keeper.undo(self._agent(req.agent), req.run_id, req.force)
                    # refused: an answer, not a broken request (the CLI's exit 1)
                    return replies.UndoAnswer(refused=undone) if isinstance(undone, str) else replies.UndoAnswer(undone)
                case ops.Check():  # loaded, inside ROOT, within the ceiling: calls will not be refused for that
                    agent = self._startable(req.agent)
                    self.keeper.pace(agent.dir.name, "rearm")  # a wake starts: its kept pool makes one ahead again
                    return replies.Checked(agent.dir.name)
                case ops.Begin():
                    settled = self.keeper.begin(self._startable(req.agent), req.run_id)
                    return replies.Begun(settled.lines, tuple(w.record() for w in settled.discarded))
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
            result = self.keeper.call(agent, call, lambda user: self._within_ceiling(agent, user))
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
        measured = self.keeper.measured_rate()
        return replies.Standing(str(self.root), self.node, measured.per_s if measured else None, self.keeper.room())

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
            user = self.keeper.user_of(agent.policy.sandbox, workspace)  # "auto" is bounded as resolved
        except OSError as exc:
            raise BrokerError(f"{name}: cannot stat its workspace: {exc.strerror}") from None
        self._within_ceiling(agent, user)
        if agent.policy.sandbox.disk and self.keeper.no_disks:
            raise BrokerError(
                f"{name}: sandbox.disk needs loop devices, which a swarm service cannot be given "
                f"(moby/moby#35028): run the broker with --plain-container, as compose.yaml does "
                f"on a swarm, or set `sandbox.disk: none`"
            )
        return agent

    def _within_ceiling(self, agent: Agent, user: str) -> None:
        """Refuse the agent's policy if it asks for more than the ceiling, run as `user`."""
        over = self.ceiling.refusal(agent.policy, user=user)
        if over:
            raise BrokerError(f"{agent.dir.name}: {over}")

    def _take_call_slot(self, name: str) -> None:
        """Count a call in flight, or refuse it at once: never queued, so a flood of
        `sleep 30`s holds at most max.calls threads and containers."""
        with self._lock:
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

    def _read(self, agent: Agent, req: ops.Read) -> replies.ReadReply:
        """files.Files, read at the agent's disk as the keeper mounts it (or its folder)."""
        if req.what == "journal_names":
            return replies.Names(tuple(self.keeper.read(agent, lambda files: files.journal_names())))
        value = self.keeper.read(agent, lambda files: getattr(files, req.what)(req.arg))
        return replies.READ_REPLIES[req.what](value)

    def sweep(self) -> None:
        """Between requests: the keeper closes idle boxes (keeper.Keeper.sweep)."""
        self.keeper.sweep()

    def close(self) -> None:
        """At shutdown: every agent's box closed and its disk released (keeper.Keeper.close)."""
        self.keeper.close()

    # -- a disk moving to another node (`wakeloop move`; broker/disk_move.py) -------------------

    def export(self, req: ops.Export, out: Writes) -> Summary:
        """Write the agent's workspace (its disk's files/, as committed) to `out` as a tar stream,
        no call or wake of it meanwhile; the tree's digest and entries."""
        agent = self._agent(req.agent)
        with _refusals():
            self.keeper.disk_here(agent)
            summary = self.keeper.export(agent, out)
        self.log(f"{agent.dir.name}: exported its workspace, {summary.entries} entries, digest {summary.digest[:12]}")
        return summary

    def import_(self, req: ops.Import, receive: Callable[[int], Reads]) -> Summary:
        """Make the agent's disk here (or take the one it has), empty it and write the stream
        `receive(limit)` gives into it (keeper.Keeper.import_): the tree's digest, read back.
        Refused for an agent placed on this node: its disk here is the one in use."""
        agent = self._agent(req.agent)
        name = agent.dir.name
        if not agent.policy.sandbox.disk:
            raise BrokerError(f"{name}: sandbox.disk: none: its workspace is a folder of ROOT, no disk to import")
        self._placed_elsewhere(agent)
        with _refusals():
            summary = self.keeper.import_(agent, receive)
        self.log(f"{name}: imported its workspace, {summary.entries} entries, digest {summary.digest[:12]}")
        return summary

    def _drop(self, req: ops.Drop) -> replies.Dropped:
        """Delete the agent's disk here: its box closed, the disk released and its image removed.
        Only for an agent placed on another node (its disk there in use), between wakes."""
        agent = self._agent(req.agent)
        key = self.keeper.disk_here(agent)
        name, there = agent.dir.name, self._placed_elsewhere(agent)
        if there is None:
            raise BrokerError(f"{name}: it is placed on no node: its disk here is the only one")
        self.keeper.drop(agent, key)
        self.log(f"{name}: deleted its disk {key} here: it is placed on {there}")
        return replies.Dropped(key)

    def _placed_elsewhere(self, agent: Agent) -> str | None:
        """The node the agent is placed on (None: none yet); refused if it is this one, or if this
        broker names no node (one host): its disk here is then the one in use."""
        there = placement.read_node(agent.state_dir)
        if not self.node or there == self.node:
            raise BrokerError(
                f"{agent.dir.name}: it is placed on this node ({self.node or 'one host'}): its disk here is in use"
            )
        return there

    # -- the three ops that make a container ------------------------------------------

    def _allowed(self, agent: Agent, req: ops.Run | ops.Write | ops.Edit | ops.Append) -> keeper.Call:
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
            e = edit_op.allowed(agent.dir.name, agent.policy, req)
            return lambda box: box.edit(
                e.tool, e.args, e.timeout_s, e.max_bytes, e.max_characters, protect_git=e.protect_git
            )
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
        refusal = grant_refusal(agent.policy.sandbox, hosts)
        if refusal or self.ceiling.hosts is None:
            return refusal
        outside = [h for h in hosts if not any(host_covers(a, h) for a in self.ceiling.hosts)]
        return f"{outside[0]} is not a host the broker allows (ceiling {self.ceiling.source})" if outside else ""


def cut_to_line(text: str, limit: int) -> str:
    """One line of at most `limit` characters (a planted YAML error can be many)."""
    text = " ".join(text.splitlines())
    return text if len(text) <= limit else text[: limit - 1] + "…"
