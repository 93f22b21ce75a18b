"""What every sandbox backend offers, and what a call returns.

The tools and the loop see only this: a Sandbox they can run a command in,
write or edit a file in, and close. Where the box lives (the local engine, the
broker) is the backend's business (engine.py, broker/client.py).

Not here: how a container is made (engine.py), which backend an agent gets
(broker/client.py's open_sandbox), what a wake changed (change_set.py), reading a
workspace on this host (workspace_reads.py's HostFiles).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from orchestrator.errors import EnvironmentFault
from orchestrator.sandbox.change_set import Settled, WakeChanges

WORKSPACE = "/workspace"  # where the agent's workspace is mounted in every box
TIMEOUT_EXIT = 124  # what `timeout(1)` returns; the model and scripts know it


class SandboxError(EnvironmentFault):
    """The box could not be used at all: one line for the human, with the fix."""


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int
    output: str  # stdout and stderr interleaved, cleaned, capped
    output_bytes: int  # everything the command printed, counted
    truncated: bool
    timed_out: bool
    oom_killed: bool
    duration_ms: int
    container_id: str
    stopped: bool = False  # killed because the fleet was stopped (records/stopswitch.py)
    no_room: str = ""  # the call did not start: the disks' filesystem lacked room (disk_room.py)
    asked_hosts: tuple[str, ...] = ()  # hosts the proxy asked a person about (approve.rules network_host)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def for_model(self) -> str:
        """The text a tool returns. The status is the first line, where output
        (which may print anything, a fake status line included) cannot come first."""
        status = f"[exit {self.exit_code}"
        if self.timed_out:
            status += ", timed out: killed at the deadline"
        if self.oom_killed:
            status += ", killed: out of memory"
        if self.stopped:
            status += ", killed: a person stopped every agent (`wakeloop stop`)"
        if self.truncated:
            status += f", output truncated from {self.output_bytes:,} bytes"
        return f"{status}]\n{self.output or '(no output)'}"


class Files(Protocol):
    """What the harness reads of a workspace: this host's (HostFiles), or the
    broker's under compose, where the workspace is on a disk only it mounts."""

    def read_text(self, rel: str) -> str: ...
    def read_text_or_none(self, rel: str) -> str | None: ...
    def journal_names(self) -> list[str]: ...
    def journal_size(self, day: str) -> int | None: ...


class Sandbox(Protocol):
    """What the tools need from a box, wherever it lives."""

    def run(
        self, command: str, timeout_s: float, max_output_chars: int, grant_hosts: tuple[str, ...] = ()
    ) -> SandboxResult:
        """grant_hosts: an approved call's hosts, allowed for it alone (egress_plan.granted)."""

    def write(
        self, path: str, content: bytes, timeout_s: float, append: bool = False, protect_git: bool = True
    ) -> SandboxResult:
        """protect_git: refuse, in the box, an embedded bare repository's config and hooks
        (programs.WRITE_SCRIPT). A broker applies its own copy of the policy's instead."""

    def edit(
        self,
        tool: str,
        args: dict[str, Any],
        timeout_s: float,
        max_bytes: int,
        max_chars: int,
        protect_git: bool = True,
    ) -> SandboxResult:
        """One call of Claude's text editor or memory tool (editor_request.py), in a fresh box: view,
        create, str_replace, insert (and the memory tool's delete, rename). A broker applies its own
        copy of the policy's caps instead of these."""

    def wind_down(self) -> None:
        """The wake expects no more calls but perhaps its journal's stub: make no
        containers ahead for it (each would be removed unused)."""

    def begin(self, run_id: str) -> Settled:
        """The wake `run_id` starts: what earlier wakes left is settled (a cut commit finished, a
        wake that died before its commit discarded), then its calls see a workspace of their own
        whose changes reach the agent's files only at finish (wake_layer.py)."""

    def finish(self, protect: tuple[str, ...], protect_git: bool) -> WakeChanges:
        """The wake ends, whatever its receipt: its changes checked against the policy
        (`workspace.protect`, protect_git, set-id bits), what passes committed, the rest dropped."""

    def egress_decisions(self) -> list[dict[str, Any]]:
        """The allowlist proxy's decisions during this wake (records/egress.py's lines), read
        after finish; [] without an allowlist."""

    def close(self) -> None:
        """Release what the box holds (warm containers, connections); idempotent."""

    def files(self) -> Files:
        """How the harness reads this workspace (Files): this host's folder or
        disk mount, or the broker's reading of it under compose."""


def refused(reason: str) -> SandboxResult:
    """A call answered before any container exists: exit 2, the reason as its output."""
    return SandboxResult(
        exit_code=2,
        output=f"refused: {reason}",
        output_bytes=0,
        truncated=False,
        timed_out=False,
        oom_killed=False,
        duration_ms=0,
        container_id="",
    )


def no_room(reason: str) -> SandboxResult:
    """A call the disk guard did not start (disk_room.flight): refused, and marked so that the wake
    records it and tells the operator (wake/loop.py)."""
    return replace(refused(reason), no_room=reason)
