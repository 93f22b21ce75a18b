"""A wake as a transaction on a real disk (sandbox/wakes/wake_layer.py, layers.py): real engine, loop device, overlay.

A wake's boxes see its changes as they go; files/ sees them only at
finish(), checked against the policy; the box sees the agent's files and
nothing of the disk's own (lost+found, .wakeloop/); an old disk is
arranged once, whatever instant a crash cuts it at; a wake that died
before its commit is discarded at the next begin. The first four run twice: on wakeloop's
own mounts and on the engine's (engine_mounts.py, compose on a private-mount host). Not here: the wake
loop's event and context (test_loop.py), the core's kills (test_transaction.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.policy.agent import load_agent
from orchestrator.records.event_types import WorkspaceChanges
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.sandbox.disks import disk, layers
from orchestrator.sandbox.disks import engine_mounts as engine_mounts_mod
from orchestrator.sandbox.engine import DockerSandbox
from orchestrator.testing.fakeapi import text, tool_use, turn
from orchestrator.wake.context import REFUSED_FILE
from tests.helpers import REPO, live_wake, run_cli, set_policy
from tests.helpers.recorded import first_user_text, result_text, tool_results

RUN, NEXT = "a1b2c3d4e5f6", "0123456789ab"


@pytest.fixture(params=[False, True], ids=["our-mounts", "engine-mounts"])
def engine_mounts(request, docker_client):
    """Both ways a box gets its disk: our mounts (KEY.box), or the engine's own (a broker in a
    container on a host whose / is private: engine_mounts.py). The engine's leave nothing."""
    yield request.param
    # This session's only: another worker's disks have keepers and wakes of their own.
    label, mine = engine_mounts_mod.DISK_LABEL, str(disk.disks_dir()) + "/"
    left = [
        c["Names"][0]
        for c in docker_client.api.containers(all=True, filters={"label": engine_mounts_mod.KEEPER_LABEL})
        if c["Labels"].get(label, "").startswith(mine)
    ]
    volumes = [
        v["Name"]
        for v in docker_client.api.volumes(filters={"label": engine_mounts_mod.WAKE_LABEL}).get("Volumes") or []
        if (v.get("Labels") or {}).get(label, "").startswith(mine)
    ]
    assert not left and not volumes, (left, volumes)


def open_box(agent_dir: Path, warm: int = 0, engine_mounts: bool = False) -> DockerSandbox:
    agent = load_agent(agent_dir)
    return DockerSandbox(
        agent.workspace, agent.policy.sandbox, agent=agent.name, warm=warm, engine_mounts=engine_mounts
    )


def run(box: DockerSandbox, command: str) -> str:
    result = box.run(command, 30, 10_000)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.docker
def test_find_in_the_box_prints_the_agents_files_and_nothing_of_the_disks_own(agent_dir, engine_mounts):
    (agent_dir / "workspace/notes.md").write_text("mine\n")
    with open_box(agent_dir, engine_mounts=engine_mounts) as box:
        box.begin(RUN)
        found = run(box, "find /workspace 2>&1")
        box.finish()
        outside = run(box, "find /workspace 2>&1")
        assert box.disk_root and sorted(os.listdir(box.disk_root)) == [".wakeloop", "files", "lost+found"]
        person = sorted(os.listdir(agent_dir / "workspace"))  # the person's view: the files, where they were
    for seen in (found, outside):
        assert "/workspace/notes.md" in seen
        assert "lost+found" not in seen and ".wakeloop" not in seen and "Permission denied" not in seen
    assert "notes.md" in person and "lost+found" not in person


@pytest.mark.docker
@pytest.mark.parametrize("warm", [0, 1], ids=["cold", "pooled"])
def test_a_wakes_second_call_sees_its_first_calls_file_and_files_only_after_the_wake(agent_dir, warm, engine_mounts):
    with open_box(agent_dir, warm, engine_mounts) as box:
        box.begin(RUN)
        run(box, "echo draft > plan.md; chmod +x plan.md")
        assert run(box, "cat plan.md").endswith("draft\n")
        assert box.disk_root and not (layers.files(box.disk_root) / "plan.md").exists()
        assert box.files().read_text("plan.md") == "draft\n"  # the harness reads the wake's view
        changes = box.finish()
        assert not changes.error, changes.error
        landed = (layers.files(box.disk_root) / "plan.md").read_text()
        assert not (layers.wakes(box.disk_root) / RUN).exists()  # the layer is gone
    assert landed == "draft\n"
    assert [(c.path, c.kind) for c in changes.committed] == [("plan.md", "added")] and not changes.refused


@pytest.mark.docker
def test_a_protected_path_changed_by_bash_mv_and_a_hard_link_is_refused_at_commit(agent_dir, engine_mounts):
    with open_box(agent_dir, engine_mounts=engine_mounts) as box:
        run(box, "mkdir deploy; echo 'replicas: 1' > deploy/prod.yaml")  # outside a wake: straight to files/
        box.begin(RUN)
        run(
            box,
            "echo 'replicas: 99' > deploy/prod.yaml; mkdir -p .github/workflows; echo x > w.yml;"
            " mv w.yml .github/workflows/ci.yml; echo ok > ok.txt; ln ok.txt deploy/ok.txt",
        )
        changes = box.finish(protect=("deploy/**", "**/.github/**"))
        files = layers.files(box.disk_root) if box.disk_root else Path("/")
        kept = (files / "deploy/prod.yaml").read_text()
        assert not (files / ".github/workflows/ci.yml").exists() and not (files / "deploy/ok.txt").exists()
        assert (files / "ok.txt").read_text() == "ok\n"
    assert kept == "replicas: 1\n"
    refused = {r.change.path: r.rule for r in changes.refused}
    assert refused["deploy/prod.yaml"] == "deploy/**" and refused["deploy/ok.txt"] == "deploy/**"
    assert refused[".github/workflows/ci.yml"] == "**/.github/**"


@pytest.mark.docker
def test_a_wake_that_died_before_its_commit_is_discarded_at_the_next_begin(agent_dir, engine_mounts):
    with open_box(agent_dir, engine_mounts=engine_mounts) as box:
        box.begin(RUN)
        run(box, "echo half > half.md")
    # closed without finish: what a kill -9 leaves (the overlay's mount, if left, goes too)
    with open_box(agent_dir, engine_mounts=engine_mounts) as box:
        settled = box.begin(NEXT)
        assert box.disk_root and not (layers.files(box.disk_root) / "half.md").exists()
        assert "half.md" not in run(box, "ls")
        gone = not (layers.wakes(box.disk_root) / RUN).exists()
        box.finish()
    assert [(w.run_id, [c.path for c in w.discarded]) for w in settled.discarded] == [(RUN, ["half.md"])]
    assert gone


# -- an old disk's files moved into files/, once, cut anywhere ----------------------------------


def old_disk(root: Path) -> None:
    root.mkdir()
    (root / "lost+found").mkdir()
    (root / "notes.md").write_text("n\n")
    (root / "files").mkdir()  # the agent's own folder of that name
    (root / "files/x").write_text("x\n")
    (root / layers.STAGING).write_text("an agent's file of that name\n")
    os.chown(root, 1000, 1000)


def test_an_old_disks_files_move_into_files_once_whatever_instant_a_crash_cuts_it(tmp_path, monkeypatch):
    renames = 0
    real = os.rename

    def counting(a, b):
        nonlocal renames
        renames += 1
        real(a, b)

    monkeypatch.setattr(os, "rename", counting)
    old_disk(tmp_path / "whole")
    layers.arrange(tmp_path / "whole")
    whole = renames
    assert layers.arranged(tmp_path / "whole")
    want = sorted(os.listdir(tmp_path / "whole/files"))
    assert want == [layers.STAGING, "files", "notes.md"]
    for cut in range(whole):
        root = tmp_path / f"cut{cut}"
        old_disk(root)
        done = 0

        def cut_at(a, b, cut=cut):
            nonlocal done
            if done == cut:
                raise SystemExit("killed")
            done += 1
            real(a, b)

        monkeypatch.setattr(os, "rename", cut_at)
        with pytest.raises(SystemExit):
            layers.arrange(root)
        monkeypatch.setattr(os, "rename", real)
        layers.arrange(root)
        assert layers.arranged(root), cut
        assert sorted(n for n in os.listdir(root)) == [
            ".wakeloop",
            "files",
            "lost+found",
        ], cut
        assert sorted(n for n in os.listdir(root / "files")) == want, cut
        assert (root / "files/files/x").read_text() == "x\n" and os.lstat(root / "files").st_uid == 1000


def test_an_agent_cannot_forge_the_marker_that_says_a_disk_is_arranged(tmp_path):
    root = tmp_path / "disk"
    old_disk(root)
    (root / layers.META).mkdir()
    (root / layers.META / layers.LAYOUT).write_text("1\n")
    os.chown(root / layers.META, 1000, 1000)
    os.chown(root / layers.META / layers.LAYOUT, 1000, 1000)
    assert not layers.arranged(root)
    layers.arrange(root)
    assert layers.arranged(root) and (root / "files" / layers.META / layers.LAYOUT).exists()


def test_a_lost_found_the_agent_replaced_with_a_link_is_never_followed_by_the_arranging(tmp_path):
    # On an old disk the agent could write the root, so lost+found may be its link: the arranging
    # stages in a lost+found of root's own, and keeps the agent's as one of its files.
    root, elsewhere = tmp_path / "disk", tmp_path / "elsewhere"
    old_disk(root)
    elsewhere.mkdir()
    (root / "lost+found").rmdir()
    (root / "lost+found").symlink_to(elsewhere)
    layers.arrange(root)
    assert layers.arranged(root) and os.listdir(elsewhere) == []
    assert (root / "files" / "lost+found.agent").is_symlink() and (root / "files" / "notes.md").exists()


# -- whole wakes (the wake loop against the fake Messages API) ---------------------------------


def changes_events(agent_dir: Path) -> list[WorkspaceChanges]:
    return [e.record for e in read_events(agent_dir / "state" / EVENTS_FILE) if e.type == WorkspaceChanges.TYPE]


@pytest.mark.docker
def test_a_protected_path_written_by_bash_is_refused_at_the_wakes_end_recorded_and_told_to_the_next_wake(
    agent_dir, fake_api, disk_view
):
    set_policy(agent_dir, {"workspace": {"protect": ["deploy/**"]}})
    api = fake_api(
        [
            turn(tool_use("bash", {"command": "mkdir -p deploy; echo 9 > deploy/prod.yml; echo ok > ok.txt"})),
            turn(tool_use("bash", {"command": "cat deploy/prod.yml ok.txt"})),
            turn(text("Done.")),
            turn(text("Nothing to do.")),
        ]
    )
    live_wake(agent_dir)
    assert result_text(tool_results(api.requests[2])[0]).endswith("9\nok\n")  # the wake saw its own changes
    event = changes_events(agent_dir)[-1]
    assert event.outcome == "committed"
    assert dict(zip(event.refused, event.rules, strict=True)) == {"deploy": "deploy/**", "deploy/prod.yml": "deploy/**"}
    assert "ok.txt" in event.paths and event.sizes[event.paths.index("ok.txt")] == 3
    assert (disk_view(agent_dir) / "ok.txt").read_text() == "ok\n"
    assert not (disk_view(agent_dir) / "deploy/prod.yml").exists()
    transcript = "".join(p.read_text() for p in (agent_dir / "state/transcripts").rglob("*.jsonl"))
    assert '"workspace_changes"' in transcript and "deploy/prod.yml" in transcript

    live_wake(agent_dir)
    told = first_user_text(api.requests[3])
    assert "NOT kept" in told and "deploy/prod.yml: refused by deploy/**" in told
    assert changes_events(agent_dir)[-1].refused == ()  # the second wake changed nothing protected
    assert not (agent_dir / "state" / REFUSED_FILE).exists()  # ...so the third is told nothing


@pytest.mark.docker
def test_a_file_name_that_is_not_utf8_lands_and_the_wake_ends_with_its_receipt(agent_dir, fake_api, disk_view):
    # scan gives such a name with lone surrogates, which no UTF-8 log takes: the record shows U+FFFD,
    # the file lands under its own bytes, and the wake is not cut short before its receipt.
    fake_api([turn(tool_use("bash", {"command": "touch $'bad\\xff.txt'"})), turn(text("Done."))])
    receipt = live_wake(agent_dir)
    assert receipt.status == "done", receipt
    assert "bad\ufffd.txt" in changes_events(agent_dir)[-1].paths  # beside the journal's stub
    assert b"bad\xff.txt" in os.listdir(os.fsencode(disk_view(agent_dir)))


def _killed_mid_wake(agent_dir: Path, command: str) -> None:
    """A wake (RUN) that ran `command` in its overlay, then died by SIGKILL: no finish, no close."""
    script = (
        "import sys; from orchestrator.policy.agent import load_agent\n"
        "from orchestrator.sandbox.engine import DockerSandbox\n"
        "agent = load_agent(sys.argv[1])\n"
        "box = DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0)\n"
        "box.begin(sys.argv[2]); assert box.run(sys.argv[3], 30, 100).exit_code == 0\n"
        "print('ready', flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(agent_dir), RUN, command],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    finally:
        child.kill()  # SIGKILL: the overlay stays mounted where boxes look, the disk attached
        child.wait()


@pytest.mark.docker
def test_a_call_after_a_killed_wake_sees_the_workspace_as_before_it_and_what_it_writes_is_kept(agent_dir):
    """`sandbox exec` between a killed wake and the next: a wake of its own, which settles the dead
    one first (discarded, recorded), so it reads the committed files and its write lands."""
    notes = agent_dir / "workspace" / "notes.md"
    notes.write_text("before\n")
    notes.chmod(0o666)  # the operator's file, which the box's user may rewrite
    _killed_mid_wake(agent_dir, "echo killed > notes.md && echo dead > dead.md")
    shown = run_cli("sandbox", "exec", str(agent_dir), "--", "cat notes.md; ls; echo fix > fix.md")
    assert shown.returncode == 0, shown.stderr
    assert "before" in shown.stdout and "killed" not in shown.stdout and "dead.md" not in shown.stdout
    assert f"discarded wake {RUN}" in shown.stderr
    changes = changes_events(agent_dir)
    assert (changes[0].outcome, changes[0].of_run, set(changes[0].paths)) == ("discarded", RUN, {"notes.md", "dead.md"})
    assert (changes[1].outcome, changes[1].paths) == ("committed", ("fix.md",))
    after = run_cli("sandbox", "exec", str(agent_dir), "--", "cat fix.md notes.md")
    assert after.returncode == 0 and after.stdout.split()[-2:] == ["fix", "before"], after.stdout


@pytest.mark.docker
def test_a_wake_killed_with_sigkill_mid_wake_is_discarded_at_the_next_start_before_any_call(agent_dir, fake_api):
    _killed_mid_wake(agent_dir, "echo half > half.md")
    api = fake_api([turn(tool_use("bash", {"command": "ls"})), turn(text("Done."))])
    live_wake(agent_dir)
    first, last = changes_events(agent_dir)
    assert (first.outcome, first.of_run, first.paths) == ("discarded", RUN, ("half.md",))
    assert "half.md" not in result_text(tool_results(api.requests[1])[0])
    assert last.outcome == "committed" and last.of_run != RUN
