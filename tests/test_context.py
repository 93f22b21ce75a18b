"""Context assembly and host-side safety: the workspace is the agent's, so the host reading it is an attack surface.

One test per plant: a symlink to a host canary, a FIFO, a device node, a
100 GB sparse file, a symlinked directory, a symlinked journal when the stub
is written. A breach is: the canary text appears, the host blocks, memory
jumps, or a host file changes.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.policy.agent import load_agent
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.transcript import prompt_text
from orchestrator.sandbox.disks.workspace_reads import READ_CAP, journal_size, read_text
from orchestrator.testing.fakeapi import text, turn
from orchestrator.wake.context import build_context, system_prompt
from tests.helpers import live_wake, run_cli
from tests.helpers.recorded import first_user_text

CANARY = "CANARY-host-secret-5d41402abc4b2a76"
FIFO_DEADLINE_S = 2.0  # the bound for a context build facing a FIFO
SPARSE_SIZE = 100 * 2**30  # 100 GB, all holes
SPARSE_DEADLINE_S = 2.0
SPARSE_PEAK_BYTES = 8 * 2**20  # allocation bound while reading it: a few caps, not gigabytes


def host_canary(tmp_path: Path) -> Path:
    secret = tmp_path / "host-secret.txt"
    secret.write_text(f"{CANARY}\n")
    return secret


def plant(agent_dir: Path, rel: str) -> Path:
    path = agent_dir / "workspace" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    return path


def context_in_thread(agent, deadline_s: float) -> str:
    """Build the context in a thread; fail (not hang) if it takes longer than the deadline."""
    out: list[str] = []
    worker = threading.Thread(target=lambda: out.append(system_prompt(agent)), daemon=True)
    worker.start()
    worker.join(deadline_s)
    assert not worker.is_alive(), f"building the context blocked for more than {deadline_s}s"
    return out[0]


def test_core_md_symlink_to_host_canary_never_appears_in_context(agent_dir, tmp_path):
    secret = host_canary(tmp_path)
    plant(agent_dir, "memory/core.md").symlink_to(secret)
    plant(agent_dir, f"memory/journal/{datetime.now(UTC):%Y-%m-%d}.md").symlink_to(secret)
    proc = run_cli("context", str(agent_dir))
    assert proc.returncode == 0, proc.stderr
    assert CANARY not in proc.stdout
    assert "(unreadable: memory/core.md is a symlink" in proc.stdout


def test_symlinked_memory_directory_is_not_followed(agent_dir, tmp_path):
    host_dir = tmp_path / "hostdir"
    (host_dir / "journal").mkdir(parents=True)
    (host_dir / "core.md").write_text(CANARY)
    (host_dir / "journal/2026-01-01.md").write_text(CANARY)
    memory = agent_dir / "workspace/memory"
    os.rename(memory, agent_dir / "workspace/old-memory")
    memory.symlink_to(host_dir)
    text = context_in_thread(load_agent(agent_dir), FIFO_DEADLINE_S)
    assert CANARY not in text and "memory is a symlink" in text


def test_dangling_symlink_is_unreadable_not_an_error(agent_dir):
    plant(agent_dir, "memory/core.md").symlink_to("/nonexistent/nowhere")
    text = context_in_thread(load_agent(agent_dir), FIFO_DEADLINE_S)
    assert "(unreadable: memory/core.md is a symlink" in text


def test_core_md_fifo_returns_within_2s(agent_dir):
    os.mkfifo(plant(agent_dir, "memory/core.md"))
    started = time.monotonic()
    text = context_in_thread(load_agent(agent_dir), FIFO_DEADLINE_S)
    assert time.monotonic() - started < FIFO_DEADLINE_S
    assert "(unreadable: memory/core.md is a FIFO" in text


def test_core_md_fifo_through_the_cli(agent_dir):
    os.mkfifo(plant(agent_dir, "memory/core.md"))
    proc = run_cli("context", str(agent_dir))  # bounded by support.CLI_TIMEOUT_S: a hang fails the test
    assert proc.returncode == 0 and "is a FIFO" in proc.stdout


def test_device_node_is_not_opened(agent_dir):
    os.mknod(plant(agent_dir, "memory/core.md"), stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's
    text = context_in_thread(load_agent(agent_dir), FIFO_DEADLINE_S)
    assert "(unreadable: memory/core.md is a character device" in text


def test_100gb_sparse_core_md_is_fast_and_capped(agent_dir):
    path = plant(agent_dir, "memory/core.md")
    with open(path, "wb") as f:
        f.write(b"start of a huge file\n")
        f.truncate(SPARSE_SIZE)
    agent = load_agent(agent_dir)
    tracemalloc.start()
    started = time.monotonic()
    try:
        text = context_in_thread(agent, SPARSE_DEADLINE_S)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < SPARSE_DEADLINE_S
    assert peak < SPARSE_PEAK_BYTES, f"peak allocation {peak:,} bytes"
    assert "start of a huge file" in text
    assert f"only the first {READ_CAP:,} of {SPARSE_SIZE:,} bytes" in text
    assert len(text) < 2 * READ_CAP


def test_invalid_utf8_and_escapes_are_replaced(agent_dir):
    plant(agent_dir, "memory/core.md").write_bytes(b"ok \xff\xfe bad \x1b[31mred\x1b[0m\n")
    text = read_text(agent_dir / "workspace", "memory/core.md")
    assert text == "ok \ufffd\ufffd bad red\n"


def test_system_prompt_is_stable_and_first_message_carries_time_and_inbox(agent):
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    a = build_context(agent, wake=7, now=now, inbox="--- t\nhi there\n")
    b = build_context(agent, wake=8, now=now + timedelta(hours=5), inbox="")
    assert a.system == b.system and a.system_hash == b.system_hash
    assert "2026" not in a.system and "Wake #" not in a.system
    assert "Wake #7. UTC time: 2026-11-29T12:00:00Z" in a.first_user and "hi there" in a.first_user
    assert "(none)" in b.first_user
    assert a.system_blocks()[-1]["cache_control"] == {"type": "ephemeral"}
    assert "# Mandate" in a.system and "You are" in a.system


def test_last_three_journal_files_in_order(agent_dir):
    journal = agent_dir / "workspace/memory/journal"
    for day in ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"):
        (journal / f"{day}.md").write_text(f"entry {day}\n")
    (journal / "notes.txt").write_text("not a journal file")
    text = system_prompt(load_agent(agent_dir))
    assert "entry 2026-01-01" not in text and "not a journal" not in text
    assert text.index("entry 2026-01-02") < text.index("entry 2026-01-03") < text.index("entry 2026-01-04")


def test_journal_size_does_not_follow_symlinks(agent_dir, tmp_path):
    secret = host_canary(tmp_path)
    ws = agent_dir / "workspace"
    assert journal_size(ws, "2026-01-01") == 0
    plant(agent_dir, "memory/journal/2026-01-01.md").symlink_to(secret)
    assert journal_size(ws, "2026-01-01") is None


@pytest.mark.docker
def test_journal_symlink_to_host_file_stub_leaves_host_file_unchanged(agent_dir, tmp_path):
    secret = host_canary(tmp_path)
    os.chmod(secret, 0o666)  # writable by anyone: only not following the link protects it
    before = (secret.read_bytes(), secret.stat().st_mtime_ns)
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    plant(agent_dir, f"memory/journal/{day}.md").symlink_to(secret)
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "I forgot to journal."}]))
    proc = run_cli("wake", str(agent_dir), "--script", str(script))
    assert proc.returncode == 0, proc.stderr
    assert (secret.read_bytes(), secret.stat().st_mtime_ns) == before
    assert (agent_dir / f"workspace/memory/journal/{day}.md").is_symlink()
    stub = [e.data for e in read_events(agent_dir / "state" / EVENTS_FILE) if e.type == "journal_stub"]
    assert len(stub) == 1 and stub[0]["written"] is False and "refused" in stub[0]["detail"]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["journal"].startswith("stub not written")


def test_a_name_with_a_trailing_newline_or_non_ascii_digits_is_not_a_journal(agent_dir):
    from orchestrator.sandbox.disks.workspace_reads import journal_names

    journal = agent_dir / "workspace/memory/journal"
    (journal / "2026-01-05.md").write_text("real\n")
    (journal / "2026-01-06.md\n").write_text("trailing newline\n")
    (journal / "\u0662\u0660\u0662\u0666-\u0660\u0661-\u0660\u0667.md").write_text("arabic-indic digits\n")
    assert journal_names(agent_dir / "workspace") == ["2026-01-05.md"]


# -- `wakeloop context` is what the next wake sends ---------------------------------------------

STAMP = re.compile(r"UTC time: \S+\. Today's journal: memory/journal/\S+\.md")


def same_moment(first_user: str) -> str:
    """The first message with its time and journal day set aside: the only part that moves between
    `context` and the wake (which runs a moment later, perhaps past midnight)."""
    return STAMP.sub("UTC time: T. Today's journal: memory/journal/D.md", first_user)


def context_json(agent_dir: Path, *flags: str) -> dict:
    shown = run_cli("context", str(agent_dir), "--json", *flags)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def with_task_and_message(agent_dir: Path) -> None:
    assert run_cli("task", "add", str(agent_dir), "sort the notes by date").returncode == 0
    assert run_cli("send", str(agent_dir), "the notes are in notes/").returncode == 0
    (agent_dir / "workspace" / "memory" / "core.md").write_text("- the notes are mine to keep\n")


@pytest.mark.docker
def test_context_is_the_request_the_next_live_wake_makes_task_line_and_messages_included(agent_dir, fake_api):
    with_task_and_message(agent_dir)
    shown = context_json(agent_dir, "--live")
    assert (shown["live"], shown["task"], shown["wake"]) == (True, "t1", 1)
    api = fake_api([turn(text("Done."))])
    receipt = live_wake(agent_dir)
    assert receipt.task == "t1"
    sent = api.requests[0].body
    assert sent["system"][0]["text"] == shown["system"]
    assert same_moment(first_user_text(api.requests[0])) == same_moment(shown["first_user"])
    assert "Your task for this wake is t1: sort the notes by date" in shown["first_user"]
    assert "the notes are in notes/" in shown["first_user"]
    header = run_cli("context", str(agent_dir), "--live").stdout.splitlines()[0]
    assert header.startswith("===== the next wake: #2, live, model ")


@pytest.mark.docker
def test_context_of_a_dry_run_is_what_the_dry_run_sends_and_shows_no_message_it_holds_back(agent_dir):
    with_task_and_message(agent_dir)
    shown = context_json(agent_dir)  # agent.yaml says dry_run: true
    assert (shown["live"], shown["task"], shown["messages_waiting"]) == (False, "t1", 1)
    assert "the notes are in notes/" not in shown["first_user"] and "(none)" in shown["first_user"]
    text_out = run_cli("context", str(agent_dir)).stdout
    assert text_out.startswith("===== the next wake: #1, dry run (scripted model, no API call), model ")
    assert "1 message(s) from your human wait for the first live wake: not sent" in text_out
    done = run_cli("wake", str(agent_dir), "--dry-run", timeout=180)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in run_cli("transcript", str(agent_dir), "--json").stdout.splitlines()]
    system = next(line for line in lines if line["type"] == "system")
    first = next(line for line in lines if line["type"] == "user")
    assert prompt_text(agent_dir / "state", system["hash"]) == shown["system"]
    assert same_moment(first["text"]) == same_moment(shown["first_user"])
