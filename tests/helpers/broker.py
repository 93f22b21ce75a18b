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
