"""The orchestrator's side of the broker, and the one place a backend is chosen.

BrokerClient speaks the typed wire (wire.py): one method per op, one
request per call. BrokerSandbox (a Sandbox like any other) and BrokerFiles
(files.Files) wrap it for one agent; the broker, not this process, reads the
policy's timeouts and caps.
open_sandbox() decides, for `wake`, `serve` and `sandbox exec` alike, whether
an agent's calls go to the broker ($WAKELOOP_BROKER) or to the local engine.

Not here: the wire format (wire.py), serving (server.py, transport.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import docker.errors

from orchestrator.broker import nodes, wire
from orchestrator.broker.wire import BROKER_ENV, READ_TIMEOUT_S, REPLY_MARGIN_S, EngineRate
from orchestrator.policy.agent import Agent
from orchestrator.sandbox.policy_check import check_against_engine
from orchestrator.sandbox.box import Sandbox, SandboxError, SandboxResult
from orchestrator.sandbox.engine import DockerSandbox, connect
from orchestrator.sandbox.workspace_reads import HostFiles

RATE_TIMEOUT_S = 120.0  # a few dozen cold calls on a loaded engine
WIND_DOWN_TIMEOUT_S = 10.0  # the hint's answer is immediate; a broker this slow is busy anyway
CHECK_TIMEOUT_S = 10.0

T = TypeVar("T")


class BrokerClient:
    """The broker at `socket_path`, one method per op."""

    def __init__(self, socket_path: str | Path):
        self.socket_path = str(socket_path)

    def ping(self) -> wire.JSONObject:
        return wire.request(self.socket_path, wire.Ping(), 10)

    def rate(self) -> EngineRate:
        """The broker's engine's create-start-remove rate (sandbox/rate.py)."""
        result = wire.request(self.socket_path, wire.Rate(), RATE_TIMEOUT_S)
        try:
            return EngineRate(
                float(result["per_s"]), int(result["calls"]), float(result["seconds"]), float(result["latency_s"])
            )
        except (KeyError, TypeError, ValueError):
            raise SandboxError("the sandbox broker sent a malformed rate") from None

    def check(self, agent: str) -> None:
        wire.request(self.socket_path, wire.Check(agent), CHECK_TIMEOUT_S)

    def wind_down(self, agent: str) -> None:
        wire.request(self.socket_path, wire.WindDown(agent), WIND_DOWN_TIMEOUT_S)

    def call(self, op: wire.Run | wire.Write | wire.Append, timeout_s: float) -> SandboxResult:
        """A call that makes a container; `timeout_s` is the call's own, the wait adds a margin."""
        return wire.result_of(wire.request(self.socket_path, op, timeout_s + REPLY_MARGIN_S))

    def read(self, agent: str, what: str, arg: str | None = None) -> object:
        """The value of one workspace read (files.READS), as sent: BrokerFiles checks its type."""
        return wire.request(self.socket_path, wire.Read(agent, what, arg), READ_TIMEOUT_S).get("value")


class BrokerSandbox:
    """The orchestrator's Sandbox under compose: each call is one broker request.
    Timeouts and caps come from the broker's reading of the policy, not from us;
    a smaller output cap of ours is sent and kept."""

    def __init__(self, socket_path: str | Path, agent_name: str):
        self.broker = BrokerClient(socket_path)
        self.socket_path = self.broker.socket_path
        self.agent = agent_name
        self.warning: str | None = None

    def run(self, command: str, timeout_s: float, max_output_chars: int) -> SandboxResult:
        return self.broker.call(wire.Run(self.agent, command, max_output_chars), timeout_s)

    def write(
        self, path: str, content: bytes, timeout_s: float = 30, append: bool = False, protect_git: bool = True
    ) -> SandboxResult:
        # protect_git is not sent: the broker applies its own copy of the agent's policy.
        op = wire.Append if append else wire.Write
        return self.broker.call(op(self.agent, path, content), timeout_s)

    def files(self) -> "BrokerFiles":
        return BrokerFiles(self.socket_path, self.agent)

    def wind_down(self) -> None:
        """Tell the broker to make no more containers ahead for this agent. A hint:
        if the broker is busy or gone, the next call says so, not this."""
        try:
            self.broker.wind_down(self.agent)
        except SandboxError:
            pass

    def close(self) -> None:
        """Nothing to release: the broker keeps the agent's box and pool."""

    def check(self) -> None:
        """SandboxError now, before the wake starts, if the broker would refuse this
        agent as its policy stands (over the ceiling, say), rather than each call."""
        self.broker.check(self.agent)


class BrokerFiles:
    """files.Files under compose: the workspace is on a disk only the broker mounts,
    so the broker reads it, with the same no-follow functions, and sends the text."""

    def __init__(self, socket_path: str, agent: str):
        self.broker, self.agent = BrokerClient(socket_path), agent

    def _read(self, what: str, arg: str | None = None) -> object:
        return self.broker.read(self.agent, what, arg)

    def read_text(self, rel: str) -> str:
        return _expect(str, self._read("read_text", rel))

    def read_text_or_none(self, rel: str) -> str | None:
        value = self._read("read_text_or_none", rel)
        return None if value is None else _expect(str, value)

    def journal_names(self) -> list[str]:
        names = _expect(list, self._read("journal_names"))
        return [_expect(str, name) for name in names]

    def journal_size(self, day: str) -> int | None:
        value = self._read("journal_size", day)
        return None if value is None else _expect(int, value)


def _expect(kind: type[T], value: object) -> T:
    """`value` if the broker sent the type a read returns; SandboxError if not."""
    if not isinstance(value, kind):
        raise SandboxError("the sandbox broker sent a malformed read")
    return value


def open_files(agent: Agent, environ: Mapping[str, str] = os.environ) -> BrokerFiles | HostFiles:
    """How `agent`'s workspace is read, for a command that makes no box (`wakeloop
    context`): the broker's reading under compose, else the folder (or its disk's
    mount over it, which the agent's last wake left)."""
    path = broker_socket(environ)
    return BrokerFiles(nodes.address_for(agent.dir, path), agent.dir.name) if path else HostFiles(agent.workspace)


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
        brokered = BrokerSandbox(nodes.address_for(agent.dir, path), agent.dir.name)
        brokered.check()
        return brokered
    client = connect()
    check_against_engine(agent.policy, client)  # before any container starts
    box = DockerSandbox(
        agent.workspace, agent.policy.sandbox, agent=agent.name, run_id=run_id, client=client, warm=warm
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
    return box
