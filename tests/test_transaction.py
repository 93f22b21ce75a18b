"""A wake's changes as a transaction (orchestrator/sandbox/wakes/transaction.py), on a real overlayfs.

The fixture mounts an overlay as a wake's boxes will see it, changes it the
ways an agent can (write, rm -r, mv, links, hard links, chmod, a file that
becomes a folder), unmounts it, and the tests read its upper layer: the
change set, the policy's verdict, the commit, the undo, and a commit or an
undo cut short by SIGKILL at every step, then finished by recover().
Needs root (mount), as CI has.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import stat
import subprocess
import traceback
from functools import partial
from pathlib import Path

import pytest

from orchestrator.sandbox.disks import layers
from orchestrator.sandbox.wakes import transaction
from orchestrator.sandbox.wakes.transaction import check, commit, recover, scan, undo_run

PROTECT = ("deploy/**", "**/.github/**")
CHILD_WAIT_S = 30.0


def tree(root: Path) -> dict[str, tuple]:
    """Everything under `root` as (type, mode, content or link target), nothing followed."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            elif not stat.S_ISREG(st.st_mode):  # an upper layer's whiteout
                out[rel] = ("other", st.st_mode, st.st_rdev)
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return out


def sh(cwd: Path, script: str) -> None:
    subprocess.run(["sh", "-euc", script], cwd=cwd, check=True)


@pytest.fixture
def wake(tmp_path):
    """(lower, upper): a workspace, and what one wake did to it through an overlay."""
    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    for folder in (lower, upper, work, merged):
        folder.mkdir()
    sh(
        lower,
        """
        echo keep > keep.txt; echo old > edit.txt; echo bye > gone.txt; echo same > touched.txt
        mkdir -p dir/sub deploy .github/workflows tree; echo a > dir/a.txt; echo b > dir/sub/b.txt
        echo prod > deploy/prod.yaml; echo ci > .github/workflows/ci.yml; echo x > tree/x
        echo run > mode.sh; chmod 644 mode.sh; echo file > swap; mkdir moved; echo m > moved/m.txt
    """,
    )
    subprocess.run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            layers.overlay_options(lower, upper, work),
            str(merged),
        ],
        check=True,
    )
    try:
        sh(
            merged,
            """
            echo new > new.txt; echo changed > edit.txt; rm gone.txt; touch touched.txt; rm -r dir
            mkdir -p newdir/sub; echo n > newdir/sub/n.txt; ln -s /etc/passwd link; ln keep.txt hard.txt
            chmod 755 mode.sh; echo hacked > deploy/prod.yaml; echo evil > .github/workflows/evil.yml
            rm swap; mkdir swap; echo s > swap/s.txt; rm -r tree; echo now-a-file > tree
            mv moved renamed; echo sid > sid; chmod 4755 sid; mkdir -p .git/hooks; echo x > .git/hooks/pre-commit
        """,
        )
    finally:
        subprocess.run(["umount", str(merged)], check=True)
    return lower, upper


def test_the_upper_layer_is_read_as_what_the_wake_changed_and_nothing_else(wake):
    lower, upper = wake
    changes = {(c.path, c.kind, c.type) for c in scan(upper, lower)}
    assert changes == {
        ("new.txt", "added", "file"),
        ("edit.txt", "modified", "file"),
        ("gone.txt", "deleted", "file"),
        ("dir/a.txt", "deleted", "file"),
        ("dir/sub/b.txt", "deleted", "file"),
        ("dir/sub", "deleted", "dir"),
        ("dir", "deleted", "dir"),
        ("newdir", "added", "dir"),
        ("newdir/sub", "added", "dir"),
        ("newdir/sub/n.txt", "added", "file"),
        ("link", "added", "link"),
        ("hard.txt", "added", "file"),
        ("mode.sh", "modified", "file"),
        ("deploy/prod.yaml", "modified", "file"),
        (".github/workflows/evil.yml", "added", "file"),
        ("swap", "deleted", "file"),
        ("swap", "added", "dir"),
        ("swap/s.txt", "added", "file"),
        ("tree/x", "deleted", "file"),
        ("tree", "deleted", "dir"),
        ("tree", "added", "file"),
        ("moved/m.txt", "deleted", "file"),
        ("moved", "deleted", "dir"),
        ("renamed", "added", "dir"),
        ("renamed/m.txt", "added", "file"),
        ("sid", "added", "file"),
        (".git", "added", "dir"),
        (".git/hooks", "added", "dir"),
        (".git/hooks/pre-commit", "added", "file"),
    }  # touched.txt and keep.txt were copied up (touch, a hard link) but did not change
    link = next(c for c in scan(upper, lower) if c.path == "link")
    assert link.target == "/etc/passwd" and link.size == 0  # a link as a link, never followed


def test_the_policy_refuses_protected_paths_git_and_set_id_by_any_tool_and_lands_the_rest(wake):
    lower, upper = wake
    before = tree(lower)
    allowed, refused = check(scan(upper, lower), PROTECT, protect_git=True)
    assert {(r.change.path, r.rule) for r in refused} == {
        ("deploy/prod.yaml", "deploy/**"),
        (".github/workflows/evil.yml", "**/.github/**"),
        ("sid", "set-id bit"),
        (".git", "protect_git"),
        (".git/hooks", "protect_git"),
        (".git/hooks/pre-commit", "protect_git"),
    }
    commit(upper, lower, lower.parent / "undo-1", "run-1", allowed)
    after = tree(lower)
    assert after["new.txt"][2] == b"new\n" and after["edit.txt"][2] == b"changed\n"
    assert "gone.txt" not in after and "dir" not in after and after["link"] == ("link", "/etc/passwd")
    assert after["mode.sh"][1] == 0o755 and after["swap"][0] == "dir" and after["tree"][2] == b"now-a-file\n"
    assert after["renamed/m.txt"][2] == b"m\n" and "moved" not in after
    assert after["hard.txt"][2] == b"keep\n"  # a hard link to a kept file: its own copy
    for kept in ("deploy/prod.yaml", ".github/workflows/ci.yml"):
        assert after[kept] == before[kept]  # refused: as before the wake
    assert ".github/workflows/evil.yml" not in after and "sid" not in after and ".git" not in after
    assert transaction.read_manifest(lower.parent / "undo-1")["state"] == "committed"


def test_a_hard_link_planted_in_the_upper_layer_to_a_file_outside_it_is_refused_not_landed(wake, tmp_path):
    lower, upper = wake
    os.link(lower / "keep.txt", upper / "planted-in.txt")  # past the box: to an unchanged file in files/
    (tmp_path / "elsewhere").write_text("not the agent's\n")
    os.link(tmp_path / "elsewhere", upper / "newdir/planted-out.txt")  # to a file on the disk, out of files/
    allowed, refused = check(scan(upper, lower), PROTECT, protect_git=True)
    shared = {r.change.path for r in refused if r.rule == transaction.SHARED}
    assert shared == {"planted-in.txt", "newdir/planted-out.txt"}
    assert "hard.txt" in {c.path for c in allowed}  # the wake's own `ln keep.txt hard.txt`: both names in it
    commit(upper, lower, lower.parent / "undo-1", "run-1", allowed)
    assert not (lower / "planted-in.txt").exists() and not (lower / "newdir/planted-out.txt").exists()
    assert os.lstat(lower / "keep.txt").st_nlink == 2  # its own name, and the planted one left in upper


def test_undo_puts_back_exactly_what_was_there_and_refuses_when_a_later_wake_changed_the_same_path(wake, tmp_path):
    lower, upper = wake
    before = tree(lower)
    allowed, _ = check(scan(upper, lower), PROTECT)
    commit(upper, lower, tmp_path / "undo-1", "run-1", allowed)
    later = tmp_path / "undo-2"  # a second wake that edits new.txt again
    second = tmp_path / "upper-2"
    second.mkdir()
    (second / "new.txt").write_text("newer\n")
    commit(second, lower, later, "run-2", check(scan(second, lower), PROTECT)[0])
    with pytest.raises(transaction.TransactionError, match="run-2.*new.txt"):
        undo_run(lower, tmp_path / "undo-1", [later])
    undo_run(lower, later, [])
    undo_run(lower, tmp_path / "undo-1", [later])  # the later wake is undone: allowed now
    assert tree(lower) == before


def kill_at(step: int, action) -> bool:
    """Run `action` in a forked child that SIGKILLs itself at its `step`-th rename; True if it
    finished before that step. An exception in the child fails the test (exit 1), never passes."""
    pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        code = 1
        try:
            calls = [0]
            real = os.rename

            def rename(src, dst):
                if calls[0] == step:
                    os.kill(os.getpid(), signal.SIGKILL)
                calls[0] += 1
                real(src, dst)

            os.rename = rename
            action()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    # Waited for with a deadline: a child forked from a process with threads could, at worst, hang.
    pidfd = os.pidfd_open(pid)
    try:
        if not select.select([pidfd], [], [], CHILD_WAIT_S)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the child killed at step {step} hung")
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return False
    assert os.WEXITSTATUS(status) == 0, f"the child failed at step {step} (its traceback is above)"
    return True


def test_a_commit_or_an_undo_killed_at_any_step_is_finished_at_the_next_start(wake, tmp_path):
    lower, upper = wake
    before = tree(lower)
    allowed, _ = check(scan(upper, lower), PROTECT)
    template = tmp_path / "template"
    template.mkdir()
    subprocess.run(["cp", "-a", str(lower), str(upper), str(template)], check=True)  # whiteouts, xattrs kept
    whole = tmp_path / "whole"
    subprocess.run(["cp", "-a", str(template), str(whole)], check=True)
    commit(whole / "upper", whole / "lower", whole / "undo", "run-1", allowed)
    reference = tree(whole / "lower")  # what an uninterrupted commit leaves
    steps = 0
    while True:  # every step of the commit, then every step of the undo that follows it
        trial = tmp_path / f"trial-{steps}"
        subprocess.run(["cp", "-a", str(template), str(trial)], check=True)
        t_lower, t_upper, undo = trial / "lower", trial / "upper", trial / "undo"
        finished = kill_at(steps, partial(commit, t_upper, t_lower, undo, "run-1", allowed))
        recover(t_lower, undo)
        committed = tree(t_lower)
        begun = (undo / transaction.MANIFEST).exists()  # killed before its manifest: nothing to undo
        undone = kill_at(steps, partial(undo_run, t_lower, undo, [])) if begun else True
        recover(t_lower, undo)
        assert tree(t_lower) == before, f"killed at step {steps}: the undo did not put it all back"
        # Before its manifest lands (step 0) the wake has not begun to commit: as before it, whole.
        assert committed == (before if steps == 0 else reference), f"killed at step {steps}: half a commit"
        if finished and undone:
            break
        steps += 1
    assert steps > 20  # a commit of this wake is that many renames: each was a place to die


def fail_once_at(step: int, monkeypatch) -> None:
    """The commit's `step`-th step (a rename, a folder made, the manifest's last write) fails
    with ENOSPC, as on a disk the wake filled; every other step, the rollback's included, works."""
    calls = [0]

    def failing(real):
        def step_of_the_commit(*args):
            calls[0] += 1
            if calls[0] - 1 == step:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*args)

        return step_of_the_commit

    for name in ("_move", "_mkdir", "_set_state"):
        monkeypatch.setattr(transaction, name, failing(getattr(transaction, name)))


def test_a_commit_that_fails_at_any_step_is_rolled_back_whole_at_once(wake, tmp_path, monkeypatch):
    """ENOSPC at each step of the commit in turn: the agent's files are as before the wake, the
    wake's layer as it was (the next start discards it and says what it changed), no undo
    folder left. Before, a commit that failed half way stayed half until the next start."""
    lower, upper = wake
    allowed, _ = check(scan(upper, lower), PROTECT)
    template = tmp_path / "template"
    template.mkdir()
    subprocess.run(["cp", "-a", str(lower), str(upper), str(template)], check=True)  # whiteouts, xattrs kept
    before, layer = tree(lower), tree(upper)
    step = 0
    while True:
        trial = tmp_path / f"trial-{step}"
        subprocess.run(["cp", "-a", str(template), str(trial)], check=True)
        with monkeypatch.context() as patched:
            fail_once_at(step, patched)
            try:
                commit(trial / "upper", trial / "lower", trial / "undo", "run-1", allowed)
                failed = False
            except OSError:
                failed = True
        if not failed:
            break
        assert tree(trial / "lower") == before, f"failed at step {step}: half a commit left"
        assert tree(trial / "upper") == layer, f"failed at step {step}: the wake's layer not whole again"
        assert not (trial / "undo").exists(), f"failed at step {step}: its undo folder left"
        step += 1
    assert step > 20  # a commit of this wake is that many steps: each was a place to fail


def test_a_cut_commit_that_cannot_be_finished_is_rolled_back_at_the_next_start(wake, tmp_path, monkeypatch):
    lower, upper = wake
    before = tree(lower)
    allowed, _ = check(scan(upper, lower), PROTECT)
    undo = tmp_path / "undo"
    assert not kill_at(10, partial(commit, upper, lower, undo, "run-1", allowed))  # killed half way
    assert tree(lower) != before
    fail_once_at(0, monkeypatch)  # the disk full at the next start: the first step of finishing it fails
    said = recover(lower, undo)
    assert said is not None and said.startswith("rolled back wake run-1's cut commit"), said
    assert tree(lower) == before and not undo.exists()


def overlay_wake(lower: Path, tmp_path: Path, script: str) -> Path:
    """Run `script` in an overlay over `lower`, as one wake; its upper layer."""
    upper, work, merged = (tmp_path / n for n in ("up", "work", "merged"))
    for folder in (upper, work, merged):
        folder.mkdir(parents=True)
    options = layers.overlay_options(lower, upper, work)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], check=True)
    try:
        sh(merged, script)
    finally:
        subprocess.run(["umount", str(merged)], check=True)
    return upper


def test_a_link_in_the_agents_files_is_never_followed_by_a_scan_a_commit_or_an_undo(tmp_path):
    # The agent's own links, committed by an earlier wake, point out of the workspace: a scan must not
    # list what lies beyond (x -> outside, then rm x; mkdir x; touch x/.ssh), and an undo must not chmod
    # through a folder since replaced by a link (a taken-over orchestrator can plant one between wakes).
    outside, lower = tmp_path / "outside", tmp_path / "lower"
    sh(tmp_path, "mkdir -p outside/.ssh lower/d; echo key > outside/.ssh/id_rsa; echo v > victim; chmod 600 victim")
    (lower / "x").symlink_to(outside)
    os.chmod(lower / "d", 0o777)
    upper = overlay_wake(lower, tmp_path / "w1", "rm x; mkdir x; touch x/.ssh; chmod 700 d")
    changes = scan(upper, lower)
    assert not [c for c in changes if "id_rsa" in c.path or c.path.startswith("x/.ssh/")], changes
    commit(upper, lower, tmp_path / "undo-1", "run-1", check(changes, PROTECT)[0])
    assert tree(outside) == {".ssh": ("dir", 0o755), ".ssh/id_rsa": ("file", 0o644, b"key\n")}
    os.rename(lower / "d", tmp_path / "d-moved")
    (lower / "d").symlink_to(tmp_path / "victim")  # the folder the wake chmodded, now a link
    undo_run(lower, tmp_path / "undo-1", [])
    assert stat.S_IMODE(os.stat(tmp_path / "victim").st_mode) == 0o600  # not chmodded through the link


def test_an_undo_refuses_a_path_whose_folder_became_a_link_since(tmp_path):
    lower = tmp_path / "lower"
    sh(tmp_path, "mkdir -p lower/d elsewhere")
    upper = overlay_wake(lower, tmp_path / "w1", "echo f > d/f")
    commit(upper, lower, tmp_path / "undo-1", "run-1", check(scan(upper, lower), PROTECT)[0])
    os.rename(lower / "d", tmp_path / "d-moved")
    (lower / "d").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(transaction.TransactionError, match="undone but for d/f: a link stands on the way"):
        undo_run(lower, tmp_path / "undo-1", [])
    assert os.listdir(tmp_path / "elsewhere") == []  # nothing moved through the link
