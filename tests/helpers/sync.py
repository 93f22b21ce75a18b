"""Holding a process at a known point, without sleeps: the tests that stop a
wake mid-call park its sandbox call on a FIFO and release it only once the
process has said it took the signal; the tests that Ctrl-C `sandbox exec` start it
so that it can take SIGINT, and see its threads if it hangs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from tests.helpers.support import REPO, scrubbed_env


def release_fifo(fifo: Path, timeout_s: float) -> None:
    """Open the FIFO's write end and close it: its reader in the box reads EOF.
    From a thread, bounded: the open blocks until the reader is there."""
    fifo = as_the_box_sees(fifo)
    opener = threading.Thread(target=lambda: open(fifo, "wb").close(), daemon=True)
    opener.start()
    opener.join(timeout_s)
    assert not opener.is_alive(), "nothing in the box ever read the FIFO"


def read_until(proc: subprocess.Popen, stream: IO[str], text: str, timeout_s: float) -> str:
    """Lines of `stream` up to and including the first holding `text`; a process
    that never prints it is killed at the deadline, which ends the read."""
    seen, watchdog = [], threading.Timer(timeout_s, proc.kill)
    watchdog.start()
    try:
        while not any(text in line for line in seen):
            line = stream.readline()
            assert line, f"the process ended before printing {text!r}: {''.join(seen)}"
            seen.append(line)
    finally:
        watchdog.cancel()
    return "".join(seen)


def as_the_box_sees(path: Path) -> Path:
    """`path` in an agent's workspace as a running wake's boxes see it: through the wake's overlay
    (KEY.box, disk.py), whose inode for a FIFO is not the agent's files' (overlayfs gives a lower
    FIFO an inode, and so a pipe, of its own). Outside a wake, `path` itself."""
    from orchestrator.sandbox.disks import disk, disk_index, disk_mounts

    for folder in path.parents:
        if folder.name == "workspace":
            key = disk_index.lookup(folder.parent)
            if key and disk_mounts.wake_mounted(key):
                return disk.path_of(key, "box") / path.relative_to(folder)
            return path
    return path


def ctrl_c_default() -> None:
    """preexec_fn of a process the test will Ctrl-C: SIGINT back to its default there. A run
    started in the background of a non-interactive shell has SIGINT ignored, exec keeps
    that, and Python then installs no KeyboardInterrupt: the child would never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def exec_to_interrupt(agent_dir: Path, command: str) -> subprocess.Popen:
    """`wakeloop sandbox exec AGENT_DIR -- COMMAND` in a subprocess (text pipes, a scrubbed
    environment) that a test will Ctrl-C with interrupt()."""
    return subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "orchestrator", "sandbox", "exec", str(agent_dir), "--", command],
        cwd=REPO,
        env=scrubbed_env(),
        preexec_fn=ctrl_c_default,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def interrupt(proc: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    """Ctrl-C to a process started by exec_to_interrupt: (its exit code, its stderr).
    One still running at the deadline is made to print every thread's stack (SIGABRT, which
    faulthandler answers), and the assertion carries it: where it hung, not only that it did."""
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        raise AssertionError(f"still running {timeout_s:g} s after Ctrl-C; its threads then:\n{err}") from None
