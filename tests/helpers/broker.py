"""A broker served in this process for a test (broker/transport.py's serve, in a thread)."""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from orchestrator.broker.transport import serve
from orchestrator.policy.ceiling import Ceiling

START_S = 30  # the broker's start: engine ping, leftover sweep


@contextmanager
def served(root: Path, ceiling: Ceiling | None = None):
    """A broker serving ROOT on a short socket path (unix paths are capped at 108 bytes),
    stopped (its pools closed) on leaving the block."""
    sock_dir = Path(tempfile.mkdtemp(prefix="wlb-"))
    sock = sock_dir / "broker.sock"
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(root, sock, ready, stop, ceiling), daemon=True)
    thread.start()
    try:
        assert ready.wait(START_S), "the broker did not start"
        yield sock
    finally:
        stop.set()
        thread.join(timeout=START_S)
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert not thread.is_alive(), "the broker did not stop"


@contextmanager
def served_tls(root: Path, certs: Path, capsys, stop: threading.Event | None = None):
    """`wakeloop broker --listen tls://127.0.0.1:0`: the port the kernel gave is in its first line.
    `stop` set stops it before the block ends (a node lost mid-wake)."""
    ready, stop = threading.Event(), stop or threading.Event()
    thread = threading.Thread(
        target=serve, args=(root, "tls://127.0.0.1:0", ready, stop), kwargs={"tls_dir": certs}, daemon=True
    )
    thread.start()
    try:
        assert ready.wait(START_S), "the broker did not start"
        said = capsys.readouterr().out
        address = re.search(r"on (tls://127\.0\.0\.1:[1-9][0-9]*) \(mutual TLS", said).group(1)
        yield address
    finally:
        stop.set()
        thread.join(timeout=START_S)
    assert not thread.is_alive(), "the broker did not stop"


@contextmanager
def node_process(root: Path, certs: Path, node: str, disks: Path):
    """`wakeloop broker ROOT --listen tls://127.0.0.1:0` as a process of its own, as node `node` with
    its own $WAKELOOP_DISKS: two nodes on one engine, each with its own disks (the disks' index
    and record locks are a process's environment's). Stopped (SIGTERM: its disks let go) at the end."""
    import subprocess
    import sys

    from tests.helpers.support import REPO, scrubbed_env

    env = scrubbed_env({"WAKELOOP_NODE": node, "WAKELOOP_DISKS": str(disks), "PYTHONUNBUFFERED": "1"})
    argv = [sys.executable, "-m", "orchestrator", "broker", str(root), "--listen", "tls://127.0.0.1:0"]
    proc = subprocess.Popen(
        [*argv, "--tls-dir", str(certs)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    said: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # its first lines: the leftover sweep, then where it listens
            said.append(line)
            found = re.search(r"on (tls://127\.0\.0\.1:[1-9][0-9]*) \(mutual TLS", line)
            if found:
                break
        else:
            raise AssertionError(f"the broker of {node} did not start: {''.join(said)}")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # or its log would fill the pipe
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=START_S)
