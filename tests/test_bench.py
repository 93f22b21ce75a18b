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


def test_the_api_limit_benches_run_and_the_gated_fleet_ends_with_no_dead_letter():
    """bench/fleet_limits.py, bench/wrapup_cache.py and bench/cache_floor.py print their tables (no
    container: the stand-in sandbox). Timing is reported, not asserted; a dead letter is a failure."""
    for args in (
        ["bench.fleet_limits", "--agents", "8", "--modes", "gate"],
        ["bench.wrapup_cache", "--runs", "1"],
        ["bench.cache_floor"],
    ):
        proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = proc.stdout.splitlines()
        if args[0] == "bench.fleet_limits":
            row = next(line.split() for line in lines if line.startswith("gate "))
            assert row[5] == "0", proc.stdout  # dead letters
        if args[0] == "bench.wrapup_cache":
            kept, before = (next(line for line in lines if line.startswith(k)) for k in ("kept", "none"))
            assert int(kept.split()[2].replace(",", "")) < int(before.split()[2].replace(",", "")), proc.stdout
        if args[0] == "bench.cache_floor":
            assert any(line.startswith("billed / floor") for line in lines), proc.stdout


def test_the_editing_bench_leaves_the_same_files_both_ways_and_nothing_behind():
    """bench/editing.py: one wake with write_file, one with the text editor, real boxes. The bench itself
    fails on end files that differ from the expected ones; here, that its table and ratio are printed."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.editing", "--runs", "1"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split(" | ")[0]: line.split(" | ") for line in proc.stdout.splitlines() if line.startswith("| ")}
    write, editor = rows["| write_file"], rows["| text editor"]
    assert write[-1] == editor[-1], proc.stdout  # the end files' digest
    assert "| write_file / editor" in rows, proc.stdout
    assert proc.stdout.rstrip().endswith("(removed now): 0")
