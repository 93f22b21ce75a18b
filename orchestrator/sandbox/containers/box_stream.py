"""A box's attached stream: the launcher's first line awaited, stdin sent and half-closed.

Attached before the container starts, so no output is lost; read as the
engine's frames (stdout and stderr multiplexed).

Not here: reading a call's output to its end (engine.py's
DockerSandbox._attach_and_wait, output.py), the launcher (programs.py).
"""

from __future__ import annotations

import socket
from typing import cast

import docker
from docker.utils.socket import frames_iter

from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.containers.deadline import Deadline

LAUNCHER_UP_S = 30  # a warm container's launcher to say it listens
# (two interpreters under a loaded gVisor)

ATTACH_PARAMS = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}

# What the SDK's attach_socket gives: a SocketIO over the engine's socket (unix, tcp),
# the socket itself over TLS.
Attached = socket.SocketIO | socket.socket


def await_line(api: docker.APIClient, cid: str, sock: Attached, line: bytes) -> None:
    """Read the attached stream up to `line`, the container's first output; a box that
    says anything else, ends, or says nothing for LAUNCHER_UP_S is not made."""
    deadline = Deadline(api, cid, raw_socket(sock), LAUNCHER_UP_S)
    deadline.start()
    seen = b""
    try:
        for _stream, data in frames_iter(sock, tty=False):
            seen += data
            if not line.startswith(seen[: len(line)]) or seen == line:
                break
    finally:
        deadline.cancel()
    if seen != line:
        raise SandboxError(f"the pool's launcher said {seen[:200]!r}, not that it listens")


def raw_socket(sock: Attached) -> socket.socket:
    """The socket under an attached stream: shut down at its deadline, closed with it.
    (typeshed does not name a SocketIO's socket, `_sock`.)"""
    return cast(socket.socket, getattr(sock, "_sock", sock))


def send_stdin(raw: socket.socket, data: bytes) -> None:
    """Send all of stdin, then half-close so the process reads EOF (stdin_once).
    A process that exits without reading closes the pipe: its output still counts."""
    try:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass
