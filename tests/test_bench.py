"""bench/run.py still runs (`python -m bench.run`, as the README says): the smallest bench,
end to end, on the real engine. What it measures is reported by the bench itself, never asserted here."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_the_bench_prints_its_whole_table_and_leaves_nothing_behind():
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--calls", "2", "--runtimes", "runc", "--agents", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in (
        "bash true: wakeloop call at agent pace",
        "write_file 1 KiB: docker exec",
        "back-to-back sandbox calls",
        "idle pool holds",
        "orchestrator overhead per step",
        "saving on input",
        "scale: 2 agents due at once, finished",
    ):
        assert row in proc.stdout, f"no row {row!r} in:\n{proc.stdout}"
    assert "2/2 ok" in proc.stdout
    assert proc.stdout.rstrip().endswith("(removed now): 0")


def test_the_fleet_bench_runs_in_process_and_via_the_broker_and_leaves_nothing_behind():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.fleet",
            "--agents",
            "1",
            "--modes",
            "inproc,broker",
            "--max-concurrent",
            "2",
            "--pace",
            "0.2",
            "--rate-calls",
            "2",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| after |")]
    assert [row.split(" | ")[1] for row in rows] == ["inproc", "broker"], proc.stdout
    [header] = [line for line in proc.stdout.splitlines() if line.startswith("| code |")]
    failures = header.split(" | ").index("failures")
    assert all(row.split(" | ")[failures] == "0" for row in rows), proc.stdout
    assert "left behind" not in proc.stderr
