"""A busy host's mount namespaces: a process holding a copy of a disk's mount, and what a namespace mounts.

`hold_copy(device)` starts what a busy host has when a namespace is made while
a disk is mounted (a lab's node, `unshare -m`): a process in a mount namespace
of its own (`unshare -m --propagation private`) that keeps a copy of that
disk's mounts, so our detach of the disk waits for it in vain. It lets go of
every other loop device it copied at once, and of every overlay (another
test's or agent's disk is not this test's to hold), says so on stdout, then
waits for its stdin to close.
`mounts(pid)`: what a process's mount namespace has mounted, and where.

Not here: the namespaces' owner in the code (orchestrator/sandbox/disks/disk_holders.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

# Run inside the new namespace: drop every copied loop mount but those of `keep` (major:minor),
# and every overlay but the root (a wake's on another disk holds that disk), deepest first,
# lazily (a busy one goes when its last user does); then say so and wait.
_HOLDER = r"""
import subprocess, sys
keep = sys.argv[1]
for line in reversed(open("/proc/self/mountinfo").read().splitlines()):
    fields = line.split()
    kind, source = fields[fields.index("-") + 1 : fields.index("-") + 3]
    theirs = source.startswith("/dev/loop") and fields[2] != keep
    if theirs or (kind == "overlay" and fields[4] != "/"):
        target = fields[4].encode().decode("unicode_escape")
        subprocess.run(["umount", "-l", target], capture_output=True)
print("holding", flush=True)
sys.stdin.read()
"""


def hold_copy(device: str) -> subprocess.Popen:
    """A process in a mount namespace of its own holding a copy of `device`'s mounts, once it
    has said so. End it by closing its stdin (then wait): the namespace and the copy go with it."""
    rdev = os.stat(device).st_rdev
    numbers = f"{os.major(rdev)}:{os.minor(rdev)}"
    holder = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", _HOLDER, numbers],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    said = holder.stdout.readline()  # the namespace exists, with its copy, once it speaks
    assert said == "holding\n", f"the holder did not start: {said!r}"
    return holder


def let_go(holder: subprocess.Popen) -> None:
    """End a holder: its namespace, and the copy of the mounts, go with its last process."""
    if holder.stdin and not holder.stdin.closed:
        holder.stdin.close()
    holder.wait(timeout=30)


def mounts(pid: int | str = "self") -> list[tuple[str, str]]:
    """(source, mount point) of every mount in `pid`'s mount namespace."""
    found = []
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as table:
        for line in table.read().splitlines():
            fields = line.split()
            found.append((fields[fields.index("-") + 2], fields[4].encode().decode("unicode_escape")))
    return found
