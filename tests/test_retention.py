"""state/ stays bounded: the event log rotates by size and age, rotated files are
gzipped and dropped past the retention, and every reader reads across them.
No engine needed: retention is files in state/ and nothing else."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.policy.agent import load_agent
from orchestrator.policy.ceiling import Ceiling
from orchestrator.policy.load import parse_policy
from orchestrator.policy.schema import PolicyError
from orchestrator.records import retention
from orchestrator.records.events import EVENTS_FILE, EventLog, read_history
from orchestrator.records.retention import Retention, enforce, segments
from orchestrator.records.state import OUTBOX_FILE, STATE_FILE, load_state
from orchestrator.views.agent_status import agent_status
from tests.helpers import REPO

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def log_wakes(state_dir: Path, first: int, count: int, pad: int = 0) -> None:
    for wake in range(first, first + count):
        log = EventLog(state_dir / EVENTS_FILE, f"run{wake:05d}", secrets=())
        log.emit("wake_started", wake=wake, pad="x" * pad)
        log.emit("wake_finished", tokens=10, receipt={"wake": wake, "status": "done"})


def wakes_read(state_dir: Path) -> list[int]:
    return [e.data["wake"] for e in read_history(state_dir) if e.type == "wake_started"]


def test_the_event_log_rotates_past_its_size_and_is_read_across_segments(tmp_path):
    rules = Retention(rotate_size=4096)
    for batch in range(3):
        log_wakes(tmp_path, batch * 20 + 1, 20, pad=100)
        done = enforce(tmp_path, rules, NOW + timedelta(seconds=batch))
        assert any("rotated events.jsonl" in line and "size" in line for line in done), done
    found = segments(tmp_path, retention.KINDS[EVENTS_FILE])
    assert len(found) == 3 and all(p.name.endswith(".jsonl.gz") for p in found)
    assert not (tmp_path / EVENTS_FILE).exists()  # the next wake's first line makes it anew
    log_wakes(tmp_path, 61, 1)
    assert wakes_read(tmp_path) == list(range(1, 62))
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in found)


def test_a_small_young_log_is_left_alone(tmp_path):
    log_wakes(tmp_path, 1, 3)
    before = (tmp_path / EVENTS_FILE).read_bytes()
    assert enforce(tmp_path, Retention(), datetime.now(UTC)) == []
    assert (tmp_path / EVENTS_FILE).read_bytes() == before


def test_the_event_log_rotates_once_its_first_line_is_older_than_rotate_days(tmp_path):
    log_wakes(tmp_path, 1, 2)
    first = json.loads((tmp_path / EVENTS_FILE).read_text().splitlines()[0])
    then = datetime.fromisoformat(first["timestamp"].replace("Z", "+00:00"))
    assert enforce(tmp_path, Retention(rotate_days=1), then + timedelta(hours=23)) == []
    done = enforce(tmp_path, Retention(rotate_days=1), then + timedelta(hours=25))
    assert any("age" in line for line in done), done
    assert wakes_read(tmp_path) == [1, 2]


def test_rotated_files_are_dropped_after_keep_days(tmp_path):
    rules = Retention(rotate_size=1, keep_days=30)
    log_wakes(tmp_path, 1, 1)
    enforce(tmp_path, rules, NOW - timedelta(days=40))
    (old,) = segments(tmp_path, retention.KINDS[EVENTS_FILE])
    forty_days = (NOW - timedelta(days=40)).timestamp()
    os.utime(old, (forty_days, forty_days))
    log_wakes(tmp_path, 2, 1)
    done = enforce(tmp_path, rules, NOW)
    assert not old.exists() and any("dropped 1" in line for line in done), done
    assert wakes_read(tmp_path) == [2]


def test_the_oldest_rotated_files_go_first_past_keep_size(tmp_path):
    rules = Retention(rotate_size=1, keep_size=2000, compress=False)
    for wake in range(1, 11):
        log_wakes(tmp_path, wake, 1, pad=300)
        enforce(tmp_path, rules, NOW + timedelta(seconds=wake))
    kept = segments(tmp_path, retention.KINDS[EVENTS_FILE])
    assert sum(p.stat().st_size for p in kept) <= 2000
    assert wakes_read(tmp_path) == list(range(11 - len(kept), 11))  # the newest survive, in order


def test_a_registered_folder_is_compressed_and_expired_by_the_same_rules(tmp_path, monkeypatch):
    monkeypatch.setitem(retention.KINDS, "transcripts", retention.Kind("transcripts", folder=True))
    folder = tmp_path / "transcripts"
    folder.mkdir()
    for i in range(5):
        (folder / f"wake-{i}.jsonl").write_text(json.dumps({"i": i, "pad": "y" * 500}) + "\n")
        os.utime(folder / f"wake-{i}.jsonl", (1_000_000 + i, 1_000_000 + i))  # oldest first
    enforce(tmp_path, Retention(keep_days=36500, keep_size=150), NOW)  # each gzipped: 43 bytes
    left = sorted(p.name for p in folder.iterdir())
    assert left and all(name.endswith(".jsonl.gz") for name in left) and len(left) < 5
    assert "wake-4.jsonl.gz" in left  # the newest is kept
    with gzip.open(folder / "wake-4.jsonl.gz", "rt") as f:
        assert json.loads(f.read())["i"] == 4


def test_state_rebuilt_from_a_rotated_log_counts_every_retained_wake(tmp_path):
    log_wakes(tmp_path, 1, 30, pad=200)
    enforce(tmp_path, Retention(rotate_size=1024), NOW)
    log_wakes(tmp_path, 31, 2)
    state, warning = load_state(tmp_path)  # no state.json: rebuilt from the history
    assert (state.wake, state.tokens_lifetime) == (32, 320) and "rebuilt from the event log" in warning
    assert state.last_receipt is not None and (state.last_receipt.wake, state.last_receipt.status) == (32, "done")


def test_wakeloop_log_reads_across_rotated_segments(agent_dir):
    state_dir = agent_dir / "state"
    log_wakes(state_dir, 1, 5, pad=100)
    enforce(state_dir, Retention(rotate_size=1), NOW)
    log_wakes(state_dir, 6, 1)
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "log", str(agent_dir), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    started = [
        json.loads(line)["data"]["wake"]
        for line in proc.stdout.splitlines()
        if json.loads(line)["type"] == "wake_started"
    ]
    assert started == [1, 2, 3, 4, 5, 6]


def test_status_of_an_agent_with_a_year_of_history_is_fast(agent_dir):
    """A year at one wake a minute, rotated daily: 365 segments, a full live log, an
    hourly message in the outbox. status reads state.json, never the event history,
    and sums state/ by listing it."""
    state_dir = agent_dir / "state"
    day = gzip.compress(
        b'{"run_id": "r", "type": "tool_call", "timestamp": "2026-01-01T00:00:00Z", "data": {}}\n' * 2000
    )
    for n in range(365):
        (state_dir / f"events-{(NOW - timedelta(days=365 - n)).strftime(retention.STAMP)}.jsonl.gz").write_bytes(day)
    log_wakes(state_dir, 525_000, 2000, pad=1000)  # ~3 MiB live
    (state_dir / OUTBOX_FILE).write_text(
        "".join(f"--- 2026-01-01T00:00:00Z #{n}\n  an hourly report, one line of it\n" for n in range(365 * 24))
    )
    (state_dir / STATE_FILE).write_text(
        json.dumps({"wake": 525_600, "tokens_lifetime": 5_256_000, "last_receipt": {"wake": 525_600, "status": "done"}})
    )
    agent = load_agent(agent_dir)
    with files_opened() as opened:  # what it reads, not how long it takes: the bench times it
        status = agent_status(agent)
    assert status["wakes"] == 525_600 and status["state"]["bytes"] > 2 * 2**20
    assert status["outbox_messages"] == 365 * 24
    history = [path for path in opened if Path(path).name.startswith("events")]
    assert not history, f"status read the event history: {history[:3]}"


_opened: list[str] | None = None  # while files_opened() is on: every path this process opens


def _audit(event: str, args) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


@contextmanager
def files_opened():
    """The paths opened (builtins.open, os.open, io) inside the block, by Python's audit hook
    (installed once: a hook cannot be removed, and it does nothing while off)."""
    global _opened
    if not getattr(files_opened, "installed", False):
        sys.addaudithook(_audit)
        files_opened.installed = True  # type: ignore[attr-defined]  # a function's own flag
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


def test_state_keys_are_checked_and_bounded_by_the_ceiling():
    policy = parse_policy("state: {rotate_size: 100m, keep_days: 7}\n", "p.yaml")
    assert policy.state.rotate_size == 100 * 2**20 and policy.state.keep_days == 7
    over = Ceiling(max={"rotate_size": 64 * 2**20}, source="ceiling.yaml").refusal(policy)
    assert over is not None and "state.rotate_size" in over and "p.yaml:1" in over
    assert (
        Ceiling(max={"rotate_size": 64 * 2**20, "keep_days": 3650}).refusal(
            parse_policy("state: {rotate_size: 4m}\n", "p.yaml")
        )
        is None
    )
    with pytest.raises(PolicyError, match=r"p.yaml:1: state.keep_days: must be greater than zero"):
        parse_policy("state: {keep_days: 0}\n", "p.yaml")
    with pytest.raises(PolicyError, match=r"state.rotate_size: expected a size"):
        parse_policy("state: {rotate_size: lots}\n", "p.yaml")
    with pytest.raises(PolicyError, match=r"state.rotate_size: '1g' is over 128m: retention reads no log past"):
        parse_policy("state: {rotate_size: 1g}\n", "p.yaml")  # over it, a file is taken for a planted one


def test_the_outbox_keeps_what_is_unread_and_what_was_read_becomes_a_segment(tmp_path):
    from orchestrator.records.state import append_outbox, mark_outbox_read, read_outbox, split_messages, unread_outbox

    sd = tmp_path / "state"
    sd.mkdir()
    for wake in range(1, 41):
        append_outbox(sd, f"report {wake}: " + "x" * 200, wake)
    mark_outbox_read(sd)  # a person has seen all 40
    append_outbox(sd, "not yet read", 41)
    rules = Retention(rotate_size=4096, compress=True)
    done = enforce(sd, rules)
    assert any("already read" in line for line in done), done
    assert [m["text"] for m in split_messages(read_outbox(sd))] == ["not yet read"]
    assert unread_outbox(sd) == 1
    kept = segments(sd, retention.KINDS[OUTBOX_FILE])
    assert len(kept) == 1 and kept[0].name.endswith(".txt.gz")
    with retention.open_text(kept[0]) as f:
        assert "".join(f).count("report ") == 40
    assert enforce(sd, rules) == []  # nothing read since, below the size: nothing to do
    assert enforce(sd, Retention(keep_size=0)) and not segments(sd, retention.KINDS[OUTBOX_FILE])


def test_a_transcript_is_never_read_through_a_linked_state_folder(tmp_path):
    """The console's wake page reads a transcript without load_agent (which refuses a linked
    state/): the walk itself must not follow `state` to another agent's transcripts."""
    from orchestrator.records.transcript import read_lines, transcript_path

    other = tmp_path / "other" / "state" / "transcripts"
    other.mkdir(parents=True)
    (other / "abcdef123456.jsonl").write_text(json.dumps({"type": "wake", "secret": "other's"}) + "\n")
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "state").symlink_to(tmp_path / "other" / "state")
    assert list(read_lines(transcript_path(tmp_path / "other" / "state", "abcdef123456")))  # its own: read
    assert list(read_lines(transcript_path(tmp_path / "evil" / "state", "abcdef123456"))) == []
