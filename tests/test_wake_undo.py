"""`wakeloop diff` and `wakeloop undo`: one wake's changes read back and put back, on a real overlayfs.

Each wake here is made as the overlay slice's engine makes one: the disk's
layout (layers.py: files/, .wakeloop/wakes/RUN/{upper,work}) under a folder,
an overlay mounted over files/, a shell script run in it, unmounted, then
transaction.scan/check/commit. The reading and undoing (sandbox/wakes/wake_diff.py,
sandbox/wakes/undo_folders.py) are tested on that folder; the CLI end to end on an
agent's real disk, attached as `sandbox exec` attaches it. Needs root (mount).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator.broker.client import BrokerSandbox, open_sandbox
from orchestrator.broker.wire import BROKER_ENV
from orchestrator.console.app import Console, start
from orchestrator.console.auth import Access
from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.records.events import read_history
from orchestrator.records.state import WakeLock
from orchestrator.sandbox.disks import layers
from orchestrator.sandbox.engine import DockerSandbox
from orchestrator.sandbox.wakes import transaction, undo_folders, wake_diff
from orchestrator.views.diffview import render_text
from tests.helpers import run_cli, set_policy
from tests.helpers.console import TOKEN, Client
from tests.test_broker import raw_request, served
from tests.test_broker import view as broker_view
from tests.test_transaction import sh, tree

BINARY = bytes(range(256)) * 8  # 2 KiB with NULs: shown by size and hash
OLD_BLOB = b"\x00old"


def make_wake(root: Path, script: str, protect: tuple[str, ...] = ()) -> str:
    """Run `script` in an overlay over root/files as one wake, commit what passes; its run id."""
    run_id = uuid.uuid4().hex[:12]
    upper, work, merged = layers.upper(root, run_id), layers.work(root, run_id), root / layers.META / f"merged-{run_id}"
    for folder in (layers.files(root), upper, work, merged):
        folder.mkdir(parents=True, exist_ok=True)
    options = layers.overlay_options(layers.files(root), upper, work)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], check=True)
    try:
        sh(merged, script)
    finally:
        subprocess.run(["umount", str(merged)], check=True)
        merged.rmdir()
    allowed, _ = transaction.check(transaction.scan(upper, layers.files(root)), protect)
    transaction.commit(upper, layers.files(root), layers.undo(root, run_id), run_id, allowed)
    return run_id


def seed(root: Path) -> Path:
    """A workspace of a few files on the disk at `root`, as the wakes below find it."""
    layers.files(root).mkdir(parents=True, exist_ok=True)
    sh(
        layers.files(root),
        "echo keep > keep.txt; printf 'one\\ntwo\\nthree\\n' > edit.txt; echo bye > gone.txt; "
        "mkdir old; echo o > old/o",
    )
    (layers.files(root) / "blob.bin").write_bytes(OLD_BLOB)
    return root


@pytest.fixture
def root(tmp_path) -> Path:
    return seed(tmp_path / "disk")


def first_wake(root: Path) -> str:
    """Adds, modifies, deletes, makes a link, writes a binary file."""
    binary = root / layers.META / "binary"  # on the disk, beside the wakes' layers: gone with the disk
    binary.parent.mkdir(exist_ok=True)
    binary.write_bytes(BINARY)
    return make_wake(
        root,
        f"""
        echo new > new.txt; printf 'one\\n2\\nthree\\n' > edit.txt; rm gone.txt; rm -r old
        ln -s /etc/shadow link; cp {binary} blob.bin; mkdir made
        """,
    )


def test_a_wakes_diff_shows_what_it_added_modified_deleted_its_links_and_binaries(root):
    run = first_wake(root)
    diff = wake_diff.read(root)  # the last to commit
    assert diff.run_id == run and diff.state == "committed"
    text = render_text(diff)
    assert "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+new\n" in text
    assert "--- a/edit.txt\n+++ b/edit.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n" in text
    assert "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n" in text and "folder old: deleted" in text
    assert "+(link to '/etc/shadow', not followed)" in text and "folder made: added" in text
    sha = hashlib.sha256(BINARY).hexdigest()
    assert f"+(file, 2,048 bytes, sha256 {sha}, mode 644; binary)" in text
    assert f"-(file, 4 bytes, sha256 {hashlib.sha256(OLD_BLOB).hexdigest()}" in text
    assert "keep.txt" not in text


def test_a_path_a_later_wake_changed_says_so_rather_than_show_a_wrong_diff(root):
    run = first_wake(root)
    later = make_wake(root, "echo again > new.txt")
    text = render_text(wake_diff.read(root, run))
    assert f"added new.txt: changed since by wake {later}" in text and "+new\n" not in text
    assert "-two\n+2\n" in text  # a path no later wake touched is shown as before
    (layers.files(root) / "edit.txt").write_text("changed outside\n")
    assert "modified edit.txt: changed since outside any wake's commit" in render_text(wake_diff.read(root, run))


def test_undo_puts_the_workspace_back_to_the_byte(root):
    before = tree(layers.files(root))
    run = first_wake(root)
    assert tree(layers.files(root)) != before
    undone = undo_folders.undo(root, run)
    assert undone.changes == len(wake_diff.read(root, run).paths) and undone.forced_over == ()
    assert tree(layers.files(root)) == before
    assert wake_diff.read(root, run).state == "undone"
    with pytest.raises(undo_folders.UndoRefused, match="undone already"):
        undo_folders.undo(root, run)


def test_undo_is_refused_when_a_later_wake_changed_the_same_path_unless_forced(root):
    run = first_wake(root)
    later = make_wake(root, "echo later > edit.txt; echo other > other.txt")
    with pytest.raises(undo_folders.UndoRefused, match=f"later wake \\({later}\\) changed edit.txt too"):
        undo_folders.undo(root, run)
    assert (layers.files(root) / "edit.txt").read_text() == "later\n"  # nothing was touched
    assert undo_folders.undo(root, run, force=True).forced_over == (later,)
    assert (layers.files(root) / "edit.txt").read_text() == "one\ntwo\nthree\n"
    assert (layers.files(root) / "other.txt").read_text() == "other\n"  # the later wake's own path stays


def test_undoing_the_later_wake_first_frees_the_earlier_one(root):
    before = tree(layers.files(root))
    run = first_wake(root)
    later = make_wake(root, "echo later > edit.txt")
    undo_folders.undo(root, later)
    undo_folders.undo(root, run)  # the later wake is undone: no refusal
    assert tree(layers.files(root)) == before


def test_undoing_a_later_wake_after_an_earlier_one_was_forced_out_of_order_is_refused_unless_forced(root):
    run = first_wake(root)
    later = make_wake(root, "echo later > edit.txt; echo other > other.txt")
    undo_folders.undo(root, run, force=True)  # edit.txt: as before both wakes
    with pytest.raises(undo_folders.UndoRefused, match=f"an earlier wake \\({run}\\), undone after this one"):
        undo_folders.undo(root, later)  # it replaced the earlier wake's edit.txt: it would come back
    assert (layers.files(root) / "edit.txt").read_text() == "one\ntwo\nthree\n"  # nothing was touched
    undo_folders.undo(root, later, force=True)
    files = layers.files(root)
    assert (files / "edit.txt").read_text() == "one\n2\nthree\n" and not (files / "other.txt").exists()


def test_a_link_planted_in_the_undo_folder_is_never_followed(root, tmp_path):
    run = first_wake(root)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET\n")
    index = next(i for i, c in enumerate(undo_folders.wake(root, run).changes) if c.path == "edit.txt")
    kept = layers.undo(root, run) / transaction.OLD / str(index)
    kept.unlink()
    kept.symlink_to(secret)
    text = render_text(wake_diff.read(root, run))
    assert "TOP SECRET" not in text and f"-(link to {str(secret)!r}, not followed)" in text
    undo_folders.undo(root, run)  # renames: the link goes back as a link, its target never read or written
    assert (layers.files(root) / "edit.txt").is_symlink() and secret.read_text() == "TOP SECRET\n"
    undo_dir = layers.undo(root, run)
    moved = undo_dir.with_name("moved")
    undo_dir.rename(moved)
    undo_dir.symlink_to(moved)  # the wake's undo folder itself a link
    with pytest.raises(undo_folders.BadUndoFolder, match="a link is never followed"):
        wake_diff.read(root, run)
    assert undo_folders.wakes(root) == []  # in the list of wakes, skipped


def test_undo_folders_older_than_keep_undo_days_are_pruned(root):
    run = first_wake(root)
    later = make_wake(root, "echo later > later.txt")
    manifest = layers.undo(root, run) / transaction.MANIFEST
    aged = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**aged, "time": aged["time"] - 31 * undo_folders.DAY_S}))
    assert undo_folders.prune(root, keep_days=30) == [run]
    assert not layers.undo(root, run).exists() and layers.undo(root, later).exists()
    assert [w.run_id for w in undo_folders.wakes(root)] == [later]


# -- the CLI, end to end on an agent's real disk ----------------------------------------------------------


@contextmanager
def attached(agent_dir: Path, docker_client) -> Iterator[Path]:
    """The agent's own disk (64m), attached for the block: its root. While it is held, what the
    code under test attaches in this process is the same attachment (each attach and release of
    a loop device is work for udev, slow on a loaded host: a test makes as few as it needs)."""
    set_policy(agent_dir, {"version": 1, "sandbox": {"disk": "64m", "pool": 0}})
    agent = load_agent(agent_dir)
    with DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, client=docker_client, warm=0) as box:
        assert box.disk_root is not None
        yield box.disk_root


def two_wakes(root: Path) -> tuple[str, str, dict]:
    """(the first wake's run id, the second's, the workspace before them) on the disk at `root`."""
    seed(root)
    before = tree(layers.files(root))
    return first_wake(root), make_wake(root, "echo later > edit.txt"), before


@pytest.fixture
def disk_agent(agent_dir, docker_client):
    """(agent_dir, the first wake's run id, the second's, the workspace before them), its disk released."""
    with attached(agent_dir, docker_client) as root:
        return (agent_dir, *two_wakes(root))


def test_the_cli_diffs_and_undoes_a_wake_on_the_agents_disk_and_logs_the_undo(disk_agent, docker_client):
    agent_dir, first, second, before = disk_agent
    shown = run_cli("diff", str(agent_dir))
    assert shown.returncode == 0, shown.stderr
    assert f"wake {second}" in shown.stdout and "-two\n" not in shown.stdout and "+later\n" in shown.stdout
    as_json = run_cli("diff", str(agent_dir), "--run", first, "--json")
    changes = {(p["change"]["path"], p["change"]["kind"]) for p in json.loads(as_json.stdout)["paths"]}
    assert {("new.txt", "added"), ("edit.txt", "modified"), ("gone.txt", "deleted"), ("link", "added")} <= changes
    assert "text" not in as_json.stdout  # the change set, not the files
    refused = run_cli("undo", str(agent_dir), "--run", first)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert f"a later wake ({second}) changed edit.txt too" in refused.stderr
    for run in (second, first):
        done = run_cli("undo", str(agent_dir), "--run", run)
        assert done.returncode == 0 and f"undid wake {run}" in done.stdout, done.stderr
    agent = load_agent(agent_dir)
    box = DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, client=docker_client, warm=0)
    try:
        assert box.disk_root is not None and tree(layers.files(box.disk_root)) == before
    finally:
        box.close()
    undone = [e for e in read_history(agent.state_dir) if e.type == "workspace_undone"]
    assert [e.data["undone_run"] for e in undone] == [second, first]
    log = run_cli("log", str(agent_dir))
    assert f"workspace_undone undone_run={first}" in log.stdout


def test_a_wakes_start_prunes_undo_data_older_than_keep_undo_days(agent_dir, docker_client):
    said: list[str] = []
    with attached(agent_dir, docker_client) as root:
        first, second, _ = two_wakes(root)
        manifest = layers.undo(root, first) / transaction.MANIFEST
        aged = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**aged, "time": aged["time"] - 31 * undo_folders.DAY_S}))
        box = open_sandbox(load_agent(agent_dir), warm=0, fresh=True, say=said.append)  # as a wake opens its sandbox
        try:
            assert box.disk_root == root
        finally:
            box.close()
        assert [w.run_id for w in undo_folders.wakes(root)] == [second]
    assert "pruned the undo data of 1 wake(s) older than 30 days (workspace.keep_undo_days)" in said


def test_undo_is_refused_while_the_agent_wakes(agent_dir):
    lock = WakeLock(agent_dir / "state")
    assert lock.acquire() is None
    try:
        result = run_cli("undo", str(agent_dir), "--run", "0123456789ab")
    finally:
        lock.release()
    assert result.returncode == 1 and "is waking" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["undo", "diff"])
def test_a_bad_run_id_is_one_line_not_a_traceback(agent_dir, command):
    result = run_cli(command, str(agent_dir), "--run", "../../etc")
    assert result.returncode == 2 and "not a run id" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# -- under compose: the broker holds the disk, the orchestrator names no path -----------------------------


@pytest.mark.docker  # the broker attaches the agent's disk, and its boxes are the engine's
def test_under_compose_the_broker_diffs_and_undoes_and_refuses_what_it_does_not_know(tmp_path):
    agents = tmp_path / "agents"
    init_agent(agents / "alpha")
    set_policy(agents / "alpha", {"version": 1, "sandbox": {"disk": "64m", "pool": 0}})
    with served(agents) as sock:
        assert BrokerSandbox(sock, "alpha").files().read_text_or_none("x") is None  # the broker attaches the disk
        root = broker_view(agents, "alpha").parent  # the disk's root: files/ and .wakeloop/
        seed(root)
        before = tree(layers.files(root))
        first = first_wake(root)
        second = make_wake(root, "echo later > edit.txt")
        env = {BROKER_ENV: str(sock)}
        shown = run_cli("diff", str(agents / "alpha"), "--run", first, env=env)
        assert shown.returncode == 0 and "+new\n" in shown.stdout and "changed since by wake" in shown.stdout
        refused = run_cli("undo", str(agents / "alpha"), "--run", first, env=env)
        assert refused.returncode == 1 and f"a later wake ({second}) changed edit.txt too" in refused.stderr
        forced = run_cli("undo", str(agents / "alpha"), "--run", first, "--force", env=env)
        assert forced.returncode == 0 and f"over later wake(s) {second}" in forced.stdout, forced.stderr
        # Undone out of order (--force), the later wake would put back what it replaced: the earlier's
        # edit. Refused, unless forced too.
        again = run_cli("undo", str(agents / "alpha"), "--run", second, env=env)
        assert again.returncode == 1 and f"an earlier wake ({first}), undone after" in again.stderr, again.stderr
        assert run_cli("undo", str(agents / "alpha"), "--run", second, "--force", env=env).returncode == 0
        assert (layers.files(root) / "edit.txt").read_text() == "one\n2\nthree\n"
        assert tree(layers.files(root)) == {**before, "edit.txt": ("file", 0o644, b"one\n2\nthree\n")}
        for request, says in (
            ({"op": "diff", "agent": "beta", "run_id": first}, "beta"),  # no such agent folder
            ({"op": "diff", "agent": "alpha", "run_id": "../../beta"}, "run_id must be 12 hex digits"),
            ({"op": "undo", "agent": "alpha", "run_id": "0123456789ab"}, "no wake 0123456789ab"),
        ):
            reply = raw_request(sock, request)
            assert reply["ok"] is False and reply["refused"] is True and says in reply["error"], reply


# -- the console ---------------------------------------------------------------------------------------------

XSS = '<script>alert("x")</script>'
XSS_NAME = "<img src=x onerror=alert(1)>.txt"  # a file's name: no slash


def test_the_consoles_wake_diff_page_shows_the_same_diff_with_everything_the_agent_wrote_escaped(
    agent_dir, docker_client
):
    with attached(agent_dir, docker_client) as root:
        first, _, _ = two_wakes(root)
        third = make_wake(root, f"printf '%s\\n' '{XSS}' > '{XSS_NAME}'")
        listening = start(Console(agent_dir.parent, Access(TOKEN, True)), "127.0.0.1", 0)
        try:
            client = Client(listening.url)
            assert client.get(f"/agents/{agent_dir.name}/wakes/{third}/diff")[0] in (302, 303, 401)  # signed out
            client.sign_in()
            status, _, html = client.get(f"/agents/{agent_dir.name}/wakes/{third}/diff")
            assert status == 200 and "<script" not in html.lower() and "<img" not in html.lower()
            assert "+++ b/&lt;img src=x onerror=alert(1)&gt;.txt" in html
            assert "+&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
            status, _, html = client.get(f"/agents/{agent_dir.name}/wakes/{first}/diff")
            assert status == 200 and '<span class="add">+new</span>' in html
            assert client.get(f"/agents/{agent_dir.name}/wakes/..%2f..%2fx/diff")[0] == 404
        finally:
            listening.stop()
