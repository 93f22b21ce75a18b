"""A hundred agents on the default policy, on a host whose disks' filesystem has 70 GB free.

The disks' filesystem is made for the run: a sparse file of FS_SIZE, ext4
with nothing zeroed ahead (lazy inode tables and journal, noinit_itable), so
statvfs says ~70 GB free while the host holds a few hundred MB of it. Then,
for AGENTS agents made by `wakeloop init` (policy {}: a 2 GiB disk each),
THREADS at a time as serve's wakes would: open the agent's DockerSandbox
(makes the disk), run one call that writes 1 MiB and syncs it, close it.
Counted: disks made, calls run, calls refused, what was refused and why,
the filesystem's free space at the end, seconds.

Run it against any checkout (--code DIR, e.g. one `git archive` of the
commit before, to see the old guard refuse) with the same filesystem:

    python -m bench.thin_disks [--agents 100] [--threads 4] [--code DIR]

What the guard costs a call: `--per-call N` times N calls (`true`, warm
pool) of one agent with the guard and N with it replaced by nothing,
interleaved call by call, and prints the medians and p90s side by side.

Needs root (losetup, mount) and the sandbox image. Leaves nothing behind.

Not here: the guard itself (orchestrator/sandbox/disks/disk.py), its tests
(tests/test_disk.py, on a 300 MiB filesystem).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

FS_SIZE = "67G"  # ext4 on it leaves ~70 GB (10^9) free, as the host
AGENTS = 100
THREADS = 4  # serve's wakes at once on a 2-core machine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=AGENTS)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--code", help="the checkout whose orchestrator/ to run (default: the one installed)")
    parser.add_argument(
        "--per-call",
        type=int,
        default=0,
        metavar="N",
        help="instead: N calls with the guard and N without, interleaved",
    )
    args = parser.parse_args()
    if args.code:  # before anything imports orchestrator: that checkout's, not the installed one
        sys.path.insert(0, str(Path(args.code).resolve()))
    if args.per_call:
        with tempfile.TemporaryDirectory(prefix="wakeloop-thin-") as tmp:
            return per_call(Path(tmp), args.per_call)
    with tempfile.TemporaryDirectory(prefix="wakeloop-thin-") as tmp:
        tmp = Path(tmp)
        backing, place = tmp / "fs.img", tmp / "disks"
        subprocess.run(["truncate", "-s", FS_SIZE, str(backing)], check=True)
        subprocess.run(
            ["mkfs.ext4", "-q", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(backing)], check=True
        )
        place.mkdir()
        subprocess.run(["mount", "-o", "loop,noinit_itable", str(backing), str(place)], check=True)
        os.environ["WAKELOOP_DISKS"] = str(place)
        try:
            return measure(tmp, place, args.agents, args.threads)
        finally:
            subprocess.run(["umount", str(place)], check=True)  # its loop device goes with it


def measure(tmp: Path, place: Path, agents: int, threads: int) -> int:
    import orchestrator
    from orchestrator.policy.agent import init_agent, load_agent
    from orchestrator.sandbox.containers.engine_client import connect
    from orchestrator.sandbox.disks import disk_attach, disk_survey
    from orchestrator.sandbox.engine import DockerSandbox

    client = connect()
    st = os.statvfs(place)
    print(f"code: {Path(orchestrator.__file__).parent.parent}")
    print(
        f"disks' filesystem: {st.f_blocks * st.f_frsize / 1e9:.1f} GB, {st.f_bavail * st.f_frsize / 1e9:.1f} GB "
        f"free; {agents} agents, policy {{}}, {threads} at a time"
    )
    todo = list(range(agents))
    outcome: dict[int, str] = {}
    lock = threading.Lock()

    def one(n: int) -> str:
        agent = load_agent(init_agent(tmp / "agents" / f"a{n:03d}"))
        try:
            box = DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0)
        except Exception as exc:  # the old guard's refusal is a DiskError: recorded, not raised
            return f"disk refused: {str(exc).split(':', 2)[1].strip()[:60]}"
        try:
            result = box.run("head -c 1m /dev/urandom > f && sync -f f && echo ok", timeout_s=60, max_output_chars=1000)
        finally:
            box.close()
        if getattr(result, "no_room", ""):
            return "call refused: no room"
        return "ran" if result.ok and result.output.strip() == "ok" else f"call failed: {result.output[:60]}"

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                n = todo.pop(0)
            outcome[n] = one(n)

    started = time.monotonic()
    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.monotonic() - started
    st = os.statvfs(place)
    made = len(list(place.glob("*.img")))
    print(f"disks made: {made} of {agents}; outcomes: {dict(Counter(outcome.values()).most_common())}")
    print(
        f"promised: {made * 2} GiB; the filesystem has {st.f_bavail * st.f_frsize / 1e9:.1f} GB free "
        f"after; {seconds:.0f} s"
    )
    if hasattr(disk_survey, "filesystem"):  # what `wakeloop disk list` says of them all, before they go
        from orchestrator.views.diskview import render_disks

        print("disk list:", render_disks(disk_survey.survey(), place, disk_survey.filesystem()).splitlines()[-1])
    for key in disk_survey.keys():
        disk_attach.release(client, key, delete=True, force=True)
    return 0


def guard_alone(place: Path, times: int) -> list[float]:
    """The guard's check and mark, then its landing, on a disks' folder of 100 images
    (the lock files of each made by one flight first): what every call pays for it."""
    from orchestrator.sandbox.disks import disk, disk_room

    place.mkdir()
    before = os.environ.get(disk.DISKS_ENV)
    os.environ[disk.DISKS_ENV] = str(place)
    try:
        for n in range(100):
            (place / f"d{n:03d}.img").write_bytes(b"")
            with disk_room.flight(f"d{n:03d}"):
                pass
        xs = []
        for _ in range(times):
            started = time.perf_counter()
            with disk_room.flight("d000"):
                pass
            xs.append((time.perf_counter() - started) * 1000)
        return xs
    finally:
        os.environ[disk.DISKS_ENV] = before or ""


def per_call(tmp: Path, calls: int) -> int:
    import contextlib
    import statistics

    from orchestrator.policy.agent import init_agent, load_agent
    from orchestrator.sandbox.disks import disk_room
    from orchestrator.sandbox.engine import DockerSandbox

    agent = load_agent(init_agent(tmp / "agent"))
    guarded = disk_room.flight
    samples = {"guard": [], "none": []}
    with DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name) as box:
        for i in range(calls * 2):
            kind = "guard" if i % 2 == 0 else "none"
            disk_room.flight = guarded if kind == "guard" else (lambda *a, **k: contextlib.nullcontext())
            box.pool.wait_ready(box.pool.want, 60)  # the warm path, as bench/disk.py
            started = time.perf_counter()
            result = box.run("true", timeout_s=30, max_output_chars=100)
            samples[kind].append((time.perf_counter() - started) * 1000)
            if not result.ok:
                raise SystemExit(f"bench: a call failed: {result.for_model()}")
    disk_room.flight = guarded
    samples["guard alone, 100 disks"] = guard_alone(tmp / "many", calls * 5)
    for kind, xs in samples.items():
        p90 = statistics.quantiles(xs, n=10)[-1]
        name = {"guard": "call, with the guard", "none": "call, no guard"}.get(kind, kind)
        print(f"{name}: median {statistics.median(xs):.1f} ms, p90 {p90:.1f} ms ({len(xs)} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
