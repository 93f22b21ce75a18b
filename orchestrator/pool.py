"""A few fresh containers, created and started ahead of the call that uses them.

Creating and starting a container is most of a sandbox call's cost; handing
a command to one that is already running costs about as much as an exec. So
each DockerSandbox keeps `pool` containers made from exactly the settings a
cold call would get, each idling in a tiny launcher that waits on stdin for
its one command, runs it as its child, reports its status in-band, and is
then removed. Single use: no container ever sees a second call, so nothing
in /tmp, no process and no state carries over.

Not here: what runs in the box or how its output is read (sandbox.py). The
pool only makes, hands out, and disposes of containers, and it never hands
out one made under settings other than the current ones.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .seccomp import boot


# Runs in the pooled container as LAUNCH_ARGV, its source in $WAKELOOP_LAUNCHER
# (seccomp.boot says why), which it pops before the command. It reads an 8-byte
# length and that many bytes of JSON {argv, cwd, stdin, end} from fd 0 with
# os.read, which never reads past what it asks for: whatever follows on stdin
# is left for the command (write_file's content). Without stdin the command
# gets /dev/null, as a cold call's does; its stderr joins its stdout.
#
# The launcher stays as the command's parent and, when the command exits,
# writes its status on stdout after the command's last byte: the caller then
# returns at once instead of waiting ~100-200 ms for the engine to notice the
# exit. Before it writes, it kills every other process in the box but init, so
# the call ends as a cold call does: nothing it started outlives it. The line
# carries the call's 128-bit nonce, which the command cannot learn: it arrived
# before the command existed, and the launcher makes itself non-dumpable first,
# so a process of the same uid can neither ptrace it nor read its memory
# through /proc. Output that merely looks like the line is output. The OOM
# count is the container's own cgroup's (read-only in the box); "?" where the
# runtime shows no cgroup files (gVisor).
LAUNCHER = r"""
import ctypes, json, os
if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:   # PR_SET_DUMPABLE 0
    os._exit(125)
def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            os._exit(125)
        data += chunk
    return data
def ooms():
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return "1" if int(line.split()[1]) else "0"
        except (OSError, ValueError):
            pass
    return "?"
spec = json.loads(read_exact(int.from_bytes(read_exact(8), "big")))
os.chdir(spec["cwd"])
pid = os.fork()   # not posix_spawn: its clone3 gets EPERM, not ENOSYS, under gVisor's seccomp
if pid == 0:
    try:
        os.dup2(1, 2)
        if not spec["stdin"]:
            os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
        os.execvp(spec["argv"][0], spec["argv"])
    finally:
        os._exit(127)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
code = 128 - code if code < 0 else code
try:
    os.kill(-1, 9)   # what the command left running ends before the caller hears it is done
except ProcessLookupError:
    pass
os.set_blocking(1, True)   # the command may have left the shared pipe non-blocking
os.write(1, b"\0wakeloop:%s:%03d:%s\n" % (spec["end"].encode(), code, ooms().encode()))
"""

LAUNCHER_ENV = "WAKELOOP_LAUNCHER"
LAUNCH_ARGV = ["python3", "-I", "-c", boot(LAUNCHER_ENV)]

MAKERS = 2             # containers made at once: a runsc create and start takes 0.5-0.9 s
IDLE_CHECK_S = 30       # a container idle longer than this is checked before use (engine restarts)
_STOP = object()        # ends a pool thread's job queue


def handoff(argv: list[str], cwd: str, stdin: bool, end: str) -> bytes:
    """The bytes that hand a pooled container its command; `end` is the call's nonce."""
    spec = json.dumps({"argv": argv, "cwd": cwd, "stdin": stdin, "end": end}).encode()
    return len(spec).to_bytes(8, "big") + spec


class EndLine:
    """Finds the launcher's status line in the output stream and keeps it out of the output.

    feed() returns the bytes that are surely output. It holds back a short tail,
    since the line may arrive split across reads; flush() returns that tail when
    the stream ends without the line (the launcher was killed: the engine then
    tells the status). Bytes after the line (a background process still
    printing) are dropped, as a cold call's end drops them.
    """

    _TAIL = len(":000:?\n")

    def __init__(self, nonce: str):
        self.needle = b"\0wakeloop:" + nonce.encode() + b":"
        self.exit_code: int | None = None
        self.oom: str | None = None          # "1", "0", or "?" (unknown)
        self._held = b""

    @property
    def found(self) -> bool:
        return self.exit_code is not None

    def feed(self, data: bytes) -> bytes:
        buf = self._held + data
        at = buf.find(self.needle)
        if at < 0:
            keep = min(len(buf), len(self.needle) + self._TAIL)
            self._held = buf[len(buf) - keep:]
            return buf[:len(buf) - keep]
        line = buf[at + len(self.needle):]
        if len(line) >= self._TAIL - 1 and b"\n" in line:
            fields = line.split(b"\n", 1)[0].split(b":")
            if len(fields) == 2 and fields[0].isdigit():
                self.exit_code, self.oom = int(fields[0]), fields[1].decode("ascii", "replace")
            self._held = b""
        else:
            self._held = buf[at:]
        return buf[:at]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held


@dataclass(frozen=True)
class _Warm:
    cid: str
    key: str            # the settings it was made under
    made: float         # time.monotonic() when it was started


class WarmPool:
    """Keeps up to `size` started containers for the settings named by `key()`.

    `make(key)` creates and starts one container and returns its id;
    `remove(cid)` removes one. They run on threads of their own (MAKERS
    makers, one remover), so a call never waits for a refill or a removal,
    and a burst of calls (several tool_use blocks in one turn) is not
    refilled behind its own removals.
    """

    def __init__(self, size: int, key: Callable[[], str], make: Callable[[], str],
                 remove: Callable[[str], None], alive: Callable[[str], bool]):
        self.size, self._key, self._make, self._remove, self._alive = size, key, make, remove, alive
        self._ready: list[_Warm] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._makes: queue.Queue = queue.Queue()
        self._trash: queue.Queue = queue.Queue()
        self._closed = False
        self._making = 0
        self._makers = [threading.Thread(target=self._serve, args=(self._makes, self._make_one),
                                         name="wakeloop-pool-make", daemon=True) for _ in range(MAKERS)]
        self._threads = [*self._makers,
                         threading.Thread(target=self._serve, args=(self._trash, self._remove_quietly),
                                          name="wakeloop-pool-remove", daemon=True)]
        for thread in self._threads:
            thread.start()
        self._refill()

    def take(self) -> str | None:
        """A started container no call has used, made under the current settings; or None."""
        key = self._key()
        while True:
            with self._lock:
                if not self._ready:
                    warm = None
                else:
                    warm = self._ready.pop(0)
            if warm is None:
                self._refill()
                return None
            if warm.key != key or (time.monotonic() - warm.made > IDLE_CHECK_S
                                   and not self._alive(warm.cid)):
                self.discard(warm.cid)
                continue
            self._refill()
            return warm.cid

    def discard(self, cid: str) -> None:
        """Remove a container on the pool's remover thread (used or stale)."""
        self._trash.put(cid)

    def drain(self) -> None:
        """Drop every idle container (the settings changed) and refill."""
        with self._lock:
            stale, self._ready = self._ready, []
        for warm in stale:
            self.discard(warm.cid)
        self._refill()

    def close(self) -> None:
        """Remove every container the pool made or was given; returns when done."""
        with self._lock:
            self._closed = True
            stale, self._ready = self._ready, []
        for warm in stale:
            self.discard(warm.cid)
        for _ in self._makers:
            self._makes.put(_STOP)
        self._trash.put(_STOP)  # after the removals queued above: they run first
        for thread in self._threads:
            thread.join()

    def idle(self) -> list[str]:
        with self._lock:
            return [w.cid for w in self._ready]

    def wait_ready(self, count: int, timeout_s: float) -> bool:
        """Block until `count` containers are idle (benchmarks and tests), or the timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._ready) >= count, timeout_s)

    def _refill(self) -> None:
        with self._lock:
            missing = self.size - len(self._ready) - self._making
            self._making += max(missing, 0)
        for _ in range(max(missing, 0)):
            self._makes.put(None)

    @staticmethod
    def _serve(jobs: queue.Queue, handle: Callable) -> None:
        while (job := jobs.get()) is not _STOP:
            handle(job)

    def _remove_quietly(self, cid: str) -> None:
        # The remover must outlive any one failure, or every later removal is lost.
        try:
            self._remove(cid)
        except Exception:
            pass  # the container is labelled: the next wake's cleanup_leftovers finds it

    def _make_one(self, _job=None) -> None:
        key = self._key()
        try:
            cid = None if self._closed else self._make()
        except Exception:
            cid = None  # the next call goes cold and says why if the engine is really gone
        with self._lock:
            self._making -= 1
            keep = cid is not None and not self._closed and key == self._key()
            if keep:
                self._ready.append(_Warm(cid, key, time.monotonic()))
                self._changed.notify_all()
        if cid is not None and not keep:
            self._remove_quietly(cid)
