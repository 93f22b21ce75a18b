"""What a wake's transaction costs at its end: reading and committing its changes, undoing them,
and the disk room the undo data takes (sandbox/wakes/transaction.py, sandbox/wakes/undo_folders.py).

On a real overlayfs over a scratch filesystem made for the run (a sparse
ext4 image on a loop device, as an agent's disk is; or a tmpfs), for a wake
that rewrote 10 or 1,000 files of 1 MiB or 100 MiB in all (the worst case
for undo: every file it changed is kept whole, so the undo data is the
size of what it replaced). For each: the scan and check (what the wake
changed, read from its upper layer), the commit (renames into the
workspace, the replaced files into the undo folder), the undo (renames
back) and the undo folder's room on the disk (its blocks, from lstat,
links not followed). Medians over --runs runs, each on a fresh workspace;
the wake's own writes (through the overlay) are not timed.

    python -m bench.transaction [--runs 5] [--on ext4|tmpfs]

Not here: what the overlay costs per call (the overlay's own bench), the tests (tests/test_wake_undo.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.sandbox.disks import layers
from orchestrator.sandbox.wakes import transaction, undo_folders

MIB = 2**20
CASES = ((10, 1 * MIB), (1000, 1 * MIB), (5000, 5 * MIB), (10, 100 * MIB), (1000, 100 * MIB))  # (files, bytes in all)
SCRATCH_BYTES = 1024 * MIB  # the scratch disk: the largest case's workspace, its new files and its undo data, twice
RUNS = 5


@dataclass(frozen=True)
class Sample:
    scan_ms: float
    commit_ms: float
    undo_ms: float
    undo_bytes: int  # the undo folder's blocks on the disk, after the commit


@contextmanager
def scratch(on: str) -> Iterator[Path]:
    """A fresh filesystem for the run, mounted at a temporary folder; unmounted and removed after."""
    base = Path(tempfile.mkdtemp(prefix="wakeloop-bench-tx-"))
    mount = base / "disk"
    mount.mkdir()
    image = base / "disk.img"
    try:
        if on == "tmpfs":
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SCRATCH_BYTES}", "tmpfs", str(mount)], check=True)
        else:
            with open(image, "wb") as f:
                f.truncate(SCRATCH_BYTES)  # sparse, as disk.py makes an agent's
            subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
            subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)  # the loop device goes with it
        try:
            yield mount
        finally:
            subprocess.run(["umount", str(mount)], check=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def one_run(root: Path, files: int, total: int) -> Sample:
    """A workspace of `files` files, a wake that rewrote each, committed, undone: timed."""
    shutil.rmtree(root / layers.FILES, ignore_errors=True)
    shutil.rmtree(root / layers.META, ignore_errors=True)
    lower = layers.files(root)
    lower.mkdir()
    size = total // files
    for i in range(files):
        _write(lower / f"f{i:04d}.bin", size, b"o")
    run_id = uuid.uuid4().hex[:12]
    upper, work, merged = layers.upper(root, run_id), layers.work(root, run_id), root / layers.META / "merged"
    for folder in (upper, work, merged):
        folder.mkdir(parents=True)
    options = layers.overlay_options(lower, upper, work)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], check=True)
    try:
        for i in range(files):
            _write(merged / f"f{i:04d}.bin", size, b"n")  # the wake: every file rewritten
    finally:
        subprocess.run(["umount", str(merged)], check=True)
    os.sync()  # the wake's writes reach the disk before the clock starts
    undo = layers.undo(root, run_id)
    started = time.perf_counter()
    allowed, refused = transaction.check(transaction.scan(upper, lower))
    scanned = time.perf_counter()
    transaction.commit(upper, lower, undo, run_id, allowed)
    committed = time.perf_counter()
    assert not refused and len(allowed) == files
    room = _blocks(undo)
    undo_folders.undo(root, run_id)
    undone = time.perf_counter()
    assert (lower / "f0000.bin").read_bytes()[:1] == b"o"  # put back
    return Sample((scanned - started) * 1000, (committed - scanned) * 1000, (undone - committed) * 1000, room)


def _write(path: Path, size: int, fill: bytes) -> None:
    with open(path, "wb") as f:
        block = fill * min(size, MIB)
        left = size
        while left:
            left -= f.write(block[:left])


def _blocks(folder: Path) -> int:
    """Bytes of disk the folder takes: its files' and folders' blocks, no link followed."""
    total = 0
    for where, dirs, names in os.walk(folder):
        for name in dirs + names:
            total += os.lstat(Path(where) / name).st_blocks * 512
    return total + os.lstat(folder).st_blocks * 512


def _mib(n: float) -> str:
    return f"{n / MIB:,.1f} MiB" if n >= MIB / 10 else f"{n / 1024:,.0f} KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transaction", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="runs per case (the median is shown)")
    parser.add_argument("--on", choices=("ext4", "tmpfs"), default="ext4", help="the scratch filesystem")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.transaction: needs root (mount, a loop device)", file=sys.stderr)
        return 3
    rows = []
    with scratch(args.on) as root:
        for files, total in CASES:
            samples = [one_run(root, files, total) for _ in range(args.runs)]
            rows.append((files, total, samples))
            print(f"[{time.strftime('%H:%M:%S')}] {files} files, {_mib(total)}: done", file=sys.stderr, flush=True)
    print(f"a wake's transaction on {args.on} (overlayfs), medians of {args.runs} runs; each wake rewrote every file")
    head = ("files", 6), ("bytes", 10), ("scan+check", 11), ("commit", 9), ("undo", 9), ("undo data", 11), ("x", 9)
    print(" ".join(f"{name:>{width}}" for name, width in head))
    for files, total, samples in rows:
        med = {k: statistics.median(getattr(s, k) for s in samples) for k in Sample.__dataclass_fields__}
        print(
            f"{files:>6,} {_mib(total):>10} {med['scan_ms']:>8.1f} ms {med['commit_ms']:>6.1f} ms "
            f"{med['undo_ms']:>6.1f} ms {_mib(med['undo_bytes']):>11} {med['undo_bytes'] / total:>9.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
