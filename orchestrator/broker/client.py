"""The orchestrator's side of the broker, and the one place a backend is chosen.

BrokerClient speaks the typed wire: one method per op, one request per call,
its reply typed (ops.py in, replies.py out: nothing is taken apart here).
BrokerSandbox (a Sandbox like any other) and BrokerFiles (files.Files) wrap
it for one agent; the broker, not this process, reads the policy's timeouts
and caps. open_sandbox() decides, for `wake`, `serve` and `sandbox exec`
alike, whether an agent's calls go to the broker ($WAKELOOP_BROKER) or to
the local engine (sandbox/keeper.py's open_here; diff_here and undo_here for
`wakeloop diff` and `undo`).

Not here: the requests and replies (ops.py, replies.py), the line (wire.py),
serving (server.py, transport.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.broker import nodes, ops, replies, wire
from orchestrator.broker.ops import READ_TIMEOUT_S
from orchestrator.broker.replies import EngineRate
from orchestrator.broker.wire import BROKER_ENV, REPLY_MARGIN_S
from orchestrator.policy.agent import Agent
from orchestrator.sandbox import keeper
from orchestrator.sandbox.box import Sandbox, SandboxError, SandboxResult
from orchestrator.sandbox.change_set import Settled, WakeChanges
from orchestrator.sandbox.disks.workspace_reads import HostFiles
from orchestrator.sandbox.wakes.undo_folders import Undone, UndoRefused
from orchestrator.sandbox.wakes.wake_diff import WakeDiff

RATE_TIMEOUT_S = 120.0  # a few dozen cold calls on a loaded engine
WIND_DOWN_TIMEOUT_S = 10.0  # the hint's answer is immediate; a broker this slow is busy anyway
CHECK_TIMEOUT_S = 10.0
BEGIN_TIMEOUT_S = 300.0  # a first begin attaches the disk (mkfs) and may finish a cut commit
FINISH_TIMEOUT_S = 600.0  # a commit: renames, but a scan hashes every changed file
UNDO_TIMEOUT_S = 600.0  # renames, one per path: a wake that changed 100,000 files, on a slow disk

R = TypeVar("R")


class BrokerClient:
    """The broker at `socket_path`, one method per op."""

    def __init__(self, socket_path: str | Path, connect_wait_s: float = wire.CONNECT_WAIT_S):
        self.socket_path = str(socket_path)
        self.connect_wait_s = connect_wait_s  # for a broker that is starting (refusing connections)

    def _ask(self, req: ops.Request, kind: type[R], timeout_s: float) -> R:
        return ops.ask(self.socket_path, req, kind, timeout_s, self.connect_wait_s)

    def ping(self) -> replies.Standing:
        return self._ask(ops.Ping(), replies.Standing, 10)

    def rate(self) -> EngineRate:
        """The broker's engine's create-start-remove rate (sandbox/rate.py)."""
        return self._ask(ops.Rate(), EngineRate, RATE_TIMEOUT_S)

    def check(self, agent: str) -> None:
        self._ask(ops.Check(agent), replies.Checked, CHECK_TIMEOUT_S)

    def wind_down(self, agent: str) -> None:
        self._ask(ops.WindDown(agent), replies.WoundDown, WIND_DOWN_TIMEOUT_S)

    def call(self, op: ops.Run | ops.Write | ops.Edit | ops.Append, timeout_s: float) -> SandboxResult:
        """A call that makes a container; `timeout_s` is the call's own, the wait adds a margin."""
        return self._ask(op, SandboxResult, timeout_s + REPLY_MARGIN_S)

    def begin(self, agent: str, run_id: str) -> replies.Begun:
        return self._ask(ops.Begin(agent, run_id), replies.Begun, BEGIN_TIMEOUT_S)

    def finish(self, agent: str, run_id: str) -> replies.Finished:
        return self._ask(ops.Finish(agent, run_id), replies.Finished, FINISH_TIMEOUT_S)

    def read(self, agent: str, what: str, arg: str | None, kind: type[R]) -> R:
        """One workspace read (files.READS), as the reply `kind` it answers (replies.READ_REPLIES)."""
        return self._ask(ops.Read(agent, what, arg), kind, READ_TIMEOUT_S)

    def diff(self, agent: str, run_id: str | None) -> WakeDiff:
        """One wake's diff, read by the broker on the agent's disk (wake_diff.py)."""
        return self._ask(ops.Diff(agent, run_id), WakeDiff, READ_TIMEOUT_S)

    def undo(self, agent: str, run_id: str, force: bool) -> Undone:
        """Put back what one wake changed, on the agent's disk; UndoRefused as the broker says."""
        answer = self._ask(ops.Undo(agent, run_id, force), replies.UndoAnswer, UNDO_TIMEOUT_S)
        if answer.undone is None:
            raise UndoRefused(answer.refused or "")
        return answer.undone


class BrokerSandbox:
    """The orchestrator's Sandbox under compose: each call is one broker request.
    Timeouts and caps come from the broker's reading of the policy, not from us;
    a smaller output cap of ours is sent and kept."""

    def __init__(self, socket_path: str | Path, agent_name: str, connect_wait_s: float = wire.CONNECT_WAIT_S):
        self.broker = BrokerClient(socket_path, connect_wait_s)
        self.socket_path = self.broker.socket_path
        self.agent = agent_name
        self.warning: str | None = None
        self.run_id: str | None = None  # the wake begun, until it is finished
        self._egress: list[dict[str, Any]] = []  # the proxy's decisions, from the wake's finish reply

    def run(
        self, command: str, timeout_s: float, max_output_chars: int, grant_hosts: tuple[str, ...] = ()
    ) -> SandboxResult:
        return self.broker.call(ops.Run(self.agent, command, max_output_chars, grant_hosts), timeout_s)

    def write(
        self, path: str, content: bytes, timeout_s: float = 30, append: bool = False, protect_git: bool = True
    ) -> SandboxResult:
        # protect_git is not sent: the broker applies its own copy of the agent's policy.
        op = ops.Append if append else ops.Write
        return self.broker.call(op(self.agent, path, content), timeout_s)

    def edit(
        self,
        tool: str,
        args: dict[str, Any],
        timeout_s: float,
        max_bytes: int,
        max_chars: int,
        protect_git: bool = True,
    ) -> SandboxResult:
        # Only the model's arguments are sent: the broker applies its own copy of the agent's policy.
        return self.broker.call(ops.Edit(self.agent, tool, json.dumps(args)), timeout_s)

    def files(self) -> BrokerFiles:
        return BrokerFiles(self.socket_path, self.agent, self.broker.connect_wait_s)

    def wind_down(self) -> None:
        """Tell the broker to make no more containers ahead for this agent. A hint:
        if the broker is busy or gone, the next call says so, not this."""
        try:
            self.broker.wind_down(self.agent)
        except SandboxError:
            pass

    def begin(self, run_id: str) -> Settled:
        """The broker settles what earlier wakes left and mounts this wake's overlay."""
        self.run_id = run_id
        begun = self.broker.begin(self.agent, run_id)
        return Settled(begun.lines, tuple(WakeChanges.from_record(record) for record in begun.discarded))

    def finish(self, protect: tuple[str, ...] = (), protect_git: bool = True) -> WakeChanges:
        """The broker checks the wake's changes against its own copy of the policy (protect and
        protect_git are not sent), commits what passes and drops the rest."""
        if self.run_id is None:
            return WakeChanges("")
        run_id, self.run_id = self.run_id, None
        finished = self.broker.finish(self.agent, run_id)
        self._egress = list(finished.egress)
        return WakeChanges.from_record(finished.changes)

    def egress_decisions(self) -> list[dict[str, Any]]:
        """What the broker's proxy decided during the wake, as its finish reply said (checked
        and cut where they are written: records/egress.py)."""
        return self._egress

    def close(self) -> None:
        """Nothing to release: the broker keeps the agent's box and pool."""

    def check(self) -> None:
        """SandboxError now, before the wake starts, if the broker would refuse this
        agent as its policy stands (over the ceiling, say), rather than each call."""
        self.broker.check(self.agent)


class BrokerFiles:
    """files.Files under compose: the workspace is on a disk only the broker mounts,
    so the broker reads it, with the same no-follow functions, and sends the text."""

    def __init__(self, socket_path: str, agent: str, connect_wait_s: float = wire.CONNECT_WAIT_S):
        self.broker, self.agent = BrokerClient(socket_path, connect_wait_s), agent

    def read_text(self, rel: str) -> str:
        return self.broker.read(self.agent, "read_text", rel, replies.Text).value

    def read_text_or_none(self, rel: str) -> str | None:
        return self.broker.read(self.agent, "read_text_or_none", rel, replies.MaybeText).value

    def journal_names(self) -> list[str]:
        return list(self.broker.read(self.agent, "journal_names", None, replies.Names).value)

    def journal_size(self, day: str) -> int | None:
        return self.broker.read(self.agent, "journal_size", day, replies.Size).value


def open_files(agent: Agent, environ: Mapping[str, str] = os.environ) -> BrokerFiles | HostFiles:
    """How `agent`'s workspace is read, for a command that makes no box (`wakeloop
    context`): the broker's reading under compose, else the folder (or its disk's
    mount over it, which the agent's last wake left)."""
    path = broker_socket(environ)
    return BrokerFiles(*_brokers_for(agent, path)) if path else HostFiles(agent.workspace)


def _brokers_for(agent: Agent, path: str) -> tuple[str, str, float]:
    """(address, agent name, connect wait) of the broker of `agent`'s node past one host
    (nodes.py), which may not answer. A node's broker that does not answer is more likely gone
    than starting: its agent's calls fail in NODE_CONNECT_WAIT_S, not in the CONNECT_WAIT_S (30 s
    refused, 10 s unanswered) each that a broker starting on one host is given."""
    address = nodes.address_for(agent.dir, path, agent.policy.sandbox.disk)
    return address, agent.dir.name, (wire.CONNECT_WAIT_S if address == path else nodes.NODE_CONNECT_WAIT_S)


def read_wake_diff(agent: Agent, run_id: str | None, environ: Mapping[str, str] = os.environ) -> WakeDiff:
    """One wake's diff (`wakeloop diff`, the console): the broker's reading under compose, else
    this host's, on the agent's disk attached as a wake attaches it."""
    path = broker_socket(environ)
    if path:
        return BrokerClient(path).diff(agent.dir.name, run_id)
    return keeper.diff_here(agent, run_id)


def undo_wake(agent: Agent, run_id: str, force: bool, environ: Mapping[str, str] = os.environ) -> Undone:
    """Put back what wake `run_id` changed: the broker does it under compose, else this host.
    The caller holds the agent's wake lock."""
    path = broker_socket(environ)
    if path:
        return BrokerClient(path).undo(agent.dir.name, run_id, force)
    return keeper.undo_here(agent, run_id, force)


def broker_socket(environ: Mapping[str, str] = os.environ) -> str | None:
    """The broker's socket when $WAKELOOP_BROKER names one; None: the local engine."""
    return environ.get(BROKER_ENV, "").strip() or None


def open_sandbox(
    agent: Agent,
    *,
    run_id: str | None = None,
    warm: int | None = None,
    fresh: bool = False,
    say: Callable[[str], None] = lambda line: None,
    environ: Mapping[str, str] = os.environ,
) -> Sandbox:
    """The Sandbox for `agent`'s calls: the broker's under compose, else the local
    engine's. Either is checked before it is returned (the broker: would it serve
    this agent; the engine: image and runtime), so a refusal is one line now, not
    an error on every call. `fresh` (a wake holding the agent's lock) also removes
    containers an earlier, interrupted run left for this workspace."""
    path = broker_socket(environ)
    if path:  # past one host: the broker of the agent's node (nodes.py), which may not answer
        brokered = BrokerSandbox(*_brokers_for(agent, path))
        brokered.check()
        return brokered
    return keeper.open_here(agent, run_id=run_id, warm=warm, fresh=fresh, say=say)
