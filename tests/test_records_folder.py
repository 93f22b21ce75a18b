"""The files wakeloop keeps in an agent folder, attacked by whoever may write that
folder (docs/security.md's actor D): links in every component, FIFOs, devices, hard links,
huge sparse files. Every planted target is a canary under tmp_path.

A reader that could block runs in a thread judged by whether it returns within
HANG_S; a blocked one is released afterwards (the FIFO opened for writing), so
nothing is left behind.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.escapes.surfaces.records import fifo_releaser, returns_within
from orchestrator.policy.agent import AgentError, init_agent, load_agent
from orchestrator.records import retention
from orchestrator.records import state as st
from orchestrator.records import transcript as tr
from orchestrator.records.events import EventLog, read_history
from orchestrator.records.retention import Retention, enforce
from orchestrator.safeio.folder import Folder, Refused, TooBig, capped_lines, state_folder
from orchestrator.wake.context import NO_MANDATE, build_context
from tests.helpers import REPO

HANG_S = 3.0  # a reader that has not returned by then is blocked (ours take ms)
CANARY = "canary-e5b1c0ffee"
SPARSE = 100 * 2**30  # bytes: a 100 GB sparse file costs no disk
NOW = datetime(2026, 6, 1, tzinfo=UTC)
LINK_HOLD_S = 0.0005  # the race below: with links followed, 100 rounds reach outside every time


@pytest.fixture
def agent_dir(tmp_path):
    return init_agent(tmp_path / "root" / "a")


@pytest.fixture
def canary(tmp_path) -> Path:
    """A file outside the agent folder that no reader may see and no writer may touch."""
    path = tmp_path / "elsewhere" / "secret.txt"
    path.parent.mkdir()
    path.write_text(f"{CANARY}\n")
    return path


# -- the module itself ------------------------------------------------------------


def test_folder_refuses_a_link_in_any_component(tmp_path, canary):
    root = tmp_path / "a"
    (root / "state").mkdir(parents=True)
    (root / "state" / "link").symlink_to(canary.parent)
    (root / "state" / "file").symlink_to(canary)
    folder = state_folder(root / "state")
    for rel in ("link/secret.txt", "file"):
        with pytest.raises(Refused):
            folder.read_bytes(rel, 100)
    with pytest.raises(Refused):
        folder.append("link/new.txt", b"x")
    assert not folder.unlink("file") and not folder.unlink("link/secret.txt")
    assert canary.read_text() == f"{CANARY}\n" and sorted(os.listdir(canary.parent)) == ["secret.txt"]


def test_state_itself_a_link_is_refused_by_the_folder_and_by_load_agent(agent_dir, tmp_path):
    elsewhere = tmp_path / "other-state"
    elsewhere.mkdir()
    (agent_dir / "state").rmdir()
    (agent_dir / "state").symlink_to(elsewhere)
    with pytest.raises(Refused):
        state_folder(agent_dir / "state").append("events.jsonl", b"{}\n")
    with pytest.raises(AgentError, match="state is a symlink"):
        load_agent(agent_dir)
    assert os.listdir(elsewhere) == []


def test_a_hard_link_to_a_file_elsewhere_is_neither_read_nor_written(tmp_path, canary):
    (tmp_path / "a" / "state").mkdir(parents=True)
    os.link(canary, tmp_path / "a" / "state" / "events.jsonl")
    log = EventLog(tmp_path / "a" / "state" / "events.jsonl", "r1", secrets=())
    with pytest.raises(Refused):
        log.emit("wake_started", wake=1)
    assert canary.read_text() == f"{CANARY}\n"
    assert list(read_history(tmp_path / "a" / "state")) == []


def test_capped_lines_skip_a_giant_line_and_stop_at_the_total(tmp_path):
    import io

    data = b"a\n" + b"x" * 100 + b"\nb\n" + b"c" * 50
    assert list(capped_lines(io.BytesIO(data), 10, 10_000)) == [b"a\n", b"b\n"]  # the 50-byte tail is over 10
    assert list(capped_lines(io.BytesIO(b"a\nb\nc\n"), 10, 3)) == [b"a\n"]


# -- mandate.md, agent.yaml, policies --------------------------------------------


def test_mandate_md_a_link_to_a_canary_is_never_read(agent_dir, canary):
    (agent_dir / "mandate.md").unlink()
    (agent_dir / "mandate.md").symlink_to(canary)
    ctx = build_context(load_agent(agent_dir), wake=1, now=NOW, inbox="")
    assert CANARY not in ctx.system and NO_MANDATE in ctx.system


def test_mandate_md_a_fifo_does_not_hang_the_wake(agent_dir):
    mandate = agent_dir / "mandate.md"
    mandate.unlink()
    os.mkfifo(mandate)
    agent = load_agent(agent_dir)
    done, ctx = returns_within(
        lambda: build_context(agent, wake=1, now=NOW, inbox=""), release=fifo_releaser(mandate), bound=HANG_S
    )
    assert done, "building the context blocked on a FIFO mandate.md"
    assert NO_MANDATE in ctx.system


def test_mandate_md_hard_linked_to_a_canary_is_not_read(agent_dir, canary):
    (agent_dir / "mandate.md").unlink()
    os.link(canary, agent_dir / "mandate.md")
    assert CANARY not in build_context(load_agent(agent_dir), wake=1, now=NOW, inbox="").system


def test_agent_yaml_a_link_is_refused(agent_dir, tmp_path):
    real = tmp_path / "elsewhere.yaml"
    real.write_text((agent_dir / "agent.yaml").read_text())
    (agent_dir / "agent.yaml").unlink()
    (agent_dir / "agent.yaml").symlink_to(real)
    with pytest.raises(AgentError, match="symlink"):
        load_agent(agent_dir)


def test_a_policy_file_in_the_folder_that_is_a_link_is_refused(agent_dir, tmp_path):
    outside = tmp_path / "outside.yaml"
    outside.write_text("budget: {max_steps: 3}\n")
    (agent_dir / "p.yaml").symlink_to(outside)
    text = (agent_dir / "agent.yaml").read_text().replace("policy: {}", "policy: p.yaml")
    (agent_dir / "agent.yaml").write_text(text)
    with pytest.raises(Exception, match="symlink"):
        load_agent(agent_dir)


# -- state/ --------------------------------------------------------------------------


@pytest.mark.serial  # a wall-clock bound: alone, not beside another worker
def test_a_100gb_sparse_state_json_is_capped_and_rebuilt(agent_dir):
    with open(agent_dir / "state" / "state.json", "wb") as f:
        f.truncate(SPARSE)
    started = time.monotonic()
    state, warning = st.load_state(agent_dir / "state")
    assert time.monotonic() - started < 1.0
    assert state.wake == 0 and "rebuilt" in warning


def test_a_fifo_state_json_and_inbox_do_not_hang(agent_dir):
    sd = agent_dir / "state"
    for name in ("state.json", "inbox.txt", "outbox.txt"):
        os.mkfifo(sd / name)
    done, value = returns_within(
        lambda: (st.load_state(sd), st.read_outbox(sd), st.peek_inbox(sd)),
        release=fifo_releaser(sd / "state.json"),
        bound=HANG_S,
    )
    assert done and not isinstance(value, BaseException), value


@pytest.mark.serial  # a wall-clock bound: alone, not beside another worker
def test_a_100gb_sparse_events_log_is_dropped_quickly_and_read_capped(agent_dir, monkeypatch):
    sd = agent_dir / "state"
    with open(sd / "events.jsonl", "wb") as f:
        f.truncate(SPARSE)
    monkeypatch.setattr(retention, "FILE_CAP", 4 * 2**20)  # the read cap, scaled down for the test's time
    started = time.monotonic()
    assert list(read_history(sd)) == []
    done = enforce(sd, Retention())
    assert time.monotonic() - started < 2.0, done
    assert any("not one of ours" in line for line in done), done
    assert not [n for n in os.listdir(sd) if n.startswith("events")]


def someone_elses(tmp_path: Path, name: str, text: str) -> Path:
    """A folder not the agent's, holding one file dated 1970: what a link out of state/ points at."""
    elsewhere = tmp_path / "someone-elses"
    elsewhere.mkdir()
    (elsewhere / name).write_text(text)
    os.utime(elsewhere / name, (1, 1))
    return elsewhere


def test_prompts_a_link_out_nothing_deleted_or_written_there(agent_dir, tmp_path):
    sd = agent_dir / "state"
    elsewhere = someone_elses(tmp_path, "old.txt", "keep me")
    (sd / "transcripts").mkdir()
    (sd / "transcripts" / "prompts").symlink_to(elsewhere)
    t = tr.Transcript(sd, "run1", 2**20, ())
    t.system("the system prompt", "abc123")
    t.end()
    tr.prune(sd, max_agent_bytes=2**20, retention_days=1, keep="run1")
    assert sorted(os.listdir(elsewhere)) == ["old.txt"]
    assert t.error and "prompts" in t.error


def test_transcripts_a_link_out_nothing_deleted_there(agent_dir, tmp_path):
    sd = agent_dir / "state"
    elsewhere = someone_elses(tmp_path, "old.jsonl", "{}\n")
    (sd / "transcripts").symlink_to(elsewhere)
    tr.prune(sd, max_agent_bytes=1, retention_days=1)
    enforce(sd, Retention(keep_size=1, keep_days=0.001))
    assert sorted(os.listdir(elsewhere)) == ["old.jsonl"]


def test_retention_deletes_only_its_own_segments_never_a_link(agent_dir, canary):
    sd = agent_dir / "state"
    (sd / "events-20200101T000000000000Z.jsonl").symlink_to(canary)
    (sd / "mine.txt").write_text("not a segment")
    os.utime(sd / "mine.txt", (1, 1))
    enforce(sd, Retention(keep_size=1, keep_days=0.001))
    assert canary.exists() and (sd / "mine.txt").exists()
    assert (sd / "events-20200101T000000000000Z.jsonl").is_symlink()  # left alone, not followed


def test_the_unread_outbox_is_under_retention_too(agent_dir):
    sd = agent_dir / "state"
    for wake in range(40):
        st.append_outbox(sd, "x" * 200, wake)
    size = (sd / "outbox.txt").stat().st_size
    done = enforce(sd, Retention(rotate_size=4096, compress=False))
    assert any("unread" in line for line in done), done
    assert not (sd / "outbox.txt").exists()
    segs = retention.segments(sd, retention.KINDS["outbox.txt"])
    assert len(segs) == 1 and segs[0].stat().st_size == size
    enforce(sd, Retention(keep_size=1))
    assert retention.segments(sd, retention.KINDS["outbox.txt"]) == []


def test_notify_done_jsonl_is_rotated_and_expired_by_the_one_rule(agent_dir):
    from orchestrator.notify import queue

    sd = agent_dir / "state"
    (sd / "notify").mkdir()
    (sd / "notify" / "done.jsonl").write_text('{"id": "x", "at": 1}\n' * 400)
    done = enforce(sd, Retention(rotate_size=1024, compress=True))
    assert any("notify/done.jsonl" in line for line in done), done
    kind = retention.KINDS[f"{queue.NOTIFY_DIR}/{queue.DONE_FILE}"]
    assert [p.name.endswith(".jsonl.gz") for p in retention.segments(sd, kind)] == [True]
    enforce(sd, Retention(keep_size=1), now=datetime.now(UTC) + timedelta(days=1))
    assert retention.segments(sd, kind) == []


def test_a_device_in_state_is_never_opened(agent_dir):
    sd = agent_dir / "state"
    try:
        os.mknod(sd / "state.json", 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    done, value = returns_within(lambda: st.load_state(sd), bound=HANG_S)
    assert done and "rebuilt" in value[1]
    with pytest.raises(Refused, match="character device"):
        state_folder(sd).read_bytes("state.json", 10)


def test_read_bytes_past_the_cap_is_too_big(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 11)
    with pytest.raises(TooBig):
        Folder(tmp_path).read_bytes("f", 10)
    assert len(Folder(tmp_path).head("f", 10)) == 11


# -- JSON nested a hundred thousand deep --------------------------------------------

NEST_BOMB = "[" * 200_000  # json.loads raises RecursionError on it, which no reader expected


def test_a_json_nesting_bomb_in_any_state_file_is_a_corrupt_file_not_a_crash(agent_dir):
    from orchestrator.notify import queue
    from orchestrator.records import ledger, tasks

    sd = agent_dir / "state"
    for name in ("state.json", "tasks.json", "ledger.json"):
        (sd / name).write_text(NEST_BOMB)
    (sd / "events.jsonl").write_text(NEST_BOMB + "\n")
    (sd / "notify" / "queue").mkdir(parents=True)
    (sd / "notify" / "queue" / "1.json").write_text(NEST_BOMB)
    (sd / "notify" / "done.jsonl").write_text(NEST_BOMB + "\n")
    (sd / "transcripts").mkdir()
    (sd / "transcripts" / "r.jsonl").write_text(NEST_BOMB + "\n")
    assert "rebuilt" in st.load_state(sd)[1]
    with pytest.raises(tasks.TaskError, match="nested too deep"):
        tasks.load_tasks(sd)
    with pytest.raises(ledger.LedgerError, match="nested too deep"):
        ledger.read_book(sd)
    assert list(read_history(sd)) == [] and queue.pending(sd) == [] and queue.done(sd) == []
    assert list(tr.read_lines(sd / "transcripts" / "r.jsonl")) == []
    enforce(sd, Retention(rotate_days=0.0001))  # reads the live logs' first lines


def test_the_console_mandate_reader_never_opens_a_fifo(agent_dir):
    from orchestrator.console import pages

    (agent_dir / "mandate.md").unlink()
    os.mkfifo(agent_dir / "mandate.md")
    agent = load_agent(agent_dir)
    done, value = returns_within(
        lambda: pages._mandate(agent), release=fifo_releaser(agent_dir / "mandate.md"), bound=HANG_S
    )
    assert done and "unreadable" in value


def test_notify_sender_lock_and_markers_never_go_through_a_link(agent_dir, tmp_path):
    from orchestrator.notify import outcomes, sender

    elsewhere = tmp_path / "elsewhere-notify"
    elsewhere.mkdir()
    (agent_dir / "state" / "notify").symlink_to(elsewhere)
    with pytest.raises(Refused), sender._SenderLock(agent_dir / "state" / "notify"):
        pass
    with pytest.raises(Refused):
        outcomes._first_today(agent_dir / "state", "blocked")
    assert os.listdir(elsewhere) == []


def test_prompts_swapped_for_a_link_in_a_race_never_lets_a_wake_reach_outside(agent_dir, tmp_path):
    """A writer of the folder flips state/transcripts/prompts between a folder and a link
    out as fast as it can while wakes store prompts and prune: each step is walked anew
    from a descriptor, so there is no check-then-use window to win."""
    sd = agent_dir / "state"
    outside = tmp_path / "someone-elses"
    outside.mkdir()
    (outside / "old.txt").write_text("keep me")
    prompts, aside = sd / "transcripts" / "prompts", sd / "transcripts" / "aside"
    prompts.mkdir(parents=True)
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            try:
                os.rename(prompts, aside)
                os.symlink(outside, prompts)
                time.sleep(LINK_HOLD_S)  # the attacker keeps its link up a moment (not a synchronisation)
                os.unlink(prompts)
                os.rename(aside, prompts)
            except OSError:
                if not prompts.exists() and aside.exists():
                    try:
                        os.rename(aside, prompts)
                    except OSError:
                        pass

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        for i in range(100):
            t = tr.Transcript(sd, f"run{i}", 2**20, ())
            t.system(f"prompt {i}", f"{i:016x}")
            t.end()
            tr.prune(sd, max_agent_bytes=2**20, retention_days=1, keep=f"run{i}", now=time.time() + 86400 * 2)
    finally:
        stop.set()
        flipper.join(HANG_S)
    assert sorted(os.listdir(outside)) == ["old.txt"]


def test_workspace_a_link_out_is_refused_before_anything_reads_or_mounts_it(agent_dir, tmp_path, canary):
    elsewhere = tmp_path / "elsewhere-ws"
    (elsewhere / "memory").mkdir(parents=True)
    (elsewhere / "memory" / "core.md").write_text(CANARY)
    import shutil

    shutil.rmtree(agent_dir / "workspace")
    (agent_dir / "workspace").symlink_to(elsewhere)
    with pytest.raises(AgentError, match="workspace is a symlink"):
        load_agent(agent_dir)


def test_an_outbox_over_the_read_cap_shows_its_newest_messages_and_no_forged_mark(agent_dir, monkeypatch):
    sd = agent_dir / "state"
    monkeypatch.setattr(st, "BOX_CAP", 1000)
    st.append_outbox(sd, "old " + "x" * 2000 + "\n--- forged entry", 1)  # a body line: indented, never a mark
    st.mark_outbox_read(sd)
    for n in range(3):
        st.append_outbox(sd, f"new {n}", 2)
    shown = st.split_messages(st.read_outbox(sd))
    assert [m["text"] for m in shown][-3:] == ["new 0", "new 1", "new 2"]
    assert not any("forged" in m["header"] for m in shown)
    assert st.unread_outbox(sd) == 3
    st.mark_outbox_read(sd)
    assert st.unread_outbox(sd) == 0


def test_a_policy_path_outside_the_folder_that_is_not_a_policy_is_refused_unquoted(agent_dir, tmp_path, canary):
    leak = tmp_path / "leak.yaml"
    leak.write_text(f"{CANARY}: 1\nbudget: {{max_steps: {CANARY}}}\n")
    for target in (leak, canary):
        text = (agent_dir / "agent.yaml").read_text()
        (agent_dir / "agent.yaml").write_text(
            text.replace("policy: {}", f"policy: {target}").replace(f"policy: {leak}", f"policy: {target}")
        )
        with pytest.raises(AgentError) as caught:
            load_agent(agent_dir)
        assert CANARY not in str(caught.value) and "policy check" in str(caught.value)


def test_a_shared_policy_outside_the_folder_is_still_used(agent_dir):
    shipped = REPO / "policies" / "strict.yaml"
    text = (agent_dir / "agent.yaml").read_text()
    (agent_dir / "agent.yaml").write_text(text.replace("policy: {}", f"policy: {shipped}"))
    assert not load_agent(agent_dir).policy.tools.bash.enabled
