"""A user in the docker group who is not root: every command that touches the disks says, in one
line and exit 3, what to do (root, compose, or `sandbox.disk: none`); none shows a traceback.

Run for real: the CLI in a process of uid and gid 65534 whose groups are the engine socket's group
(so it reaches the engine, as the engine's own error tells such a user to arrange), against a
$WAKELOOP_DISKS that is root's and 0700, as a real install's /var/lib/wakeloop/disks is. The
same user's `sandbox exec` under `sandbox.disk: none` then runs: the advice works.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.helpers.support import CLI_TIMEOUT_S, REPO, scrubbed_env, set_policy

NOBODY = 65534  # uid and gid: Debian's nobody and nogroup
# The three ways on, as every refusal of a disk names them.
WAYS_ON = ("root", "docker compose up", "sandbox.disk: none")


def _socket_group() -> int:
    """The group that may use the engine's socket: what `usermod -aG docker` gives a user."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return os.stat(urlparse(host).path).st_gid


def _as_nobody(groups: list[int]):
    def drop() -> None:  # preexec_fn: the child only, after fork, before exec
        os.setgroups(groups)
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return drop


# Where no Python is open to uid 65534 (this one under /root, a checkout under /root): a root
# process loads every module of ours first, then drops to that user before the command runs, so
# every file the command opens and the engine's socket are still met as that user.
DROP_THEN_RUN = f"""
import importlib, os, pkgutil, sys
import orchestrator
for found in pkgutil.walk_packages(orchestrator.__path__, "orchestrator."):
    if not found.name.endswith("__main__"):
        importlib.import_module(found.name)
os.setgroups([int(g) for g in sys.argv[1].split(",")])
os.setgid({NOBODY})
os.setuid({NOBODY})
from orchestrator.cli.wakeloop import main
sys.exit(main(sys.argv[2:]))
"""


def _command(env: dict, groups: list[int]) -> tuple[list[str], bool]:
    """(the argv before the CLI's own arguments, whether it starts as uid 65534): a Python of this
    version that user may run, with this checkout and its packages on PYTHONPATH; else this
    Python, started as root and dropping to that user itself (DROP_THEN_RUN)."""
    probe = f"import sys, docker, yaml, anthropic; sys.exit(sys.version_info[:2] != {tuple(sys.version_info[:2])})"
    for candidate in dict.fromkeys([sys.executable, shutil.which("python3") or "", "/usr/bin/python3"]):
        try:
            done = subprocess.run(
                [candidate, "-c", probe], env=env, preexec_fn=_as_nobody(groups), capture_output=True, timeout=60
            )
        except (PermissionError, FileNotFoundError):  # the exec itself: a folder on its path is closed
            continue
        if done.returncode == 0:
            return [candidate, "-m", "orchestrator"], True
    return [sys.executable, "-c", DROP_THEN_RUN, ",".join(map(str, groups))], False


class Nobody:
    """The CLI as uid 65534 in the engine socket's group, with a root-owned 0700 $WAKELOOP_DISKS."""

    def __init__(self, home: Path, disks: Path):
        self.home, self.disks = home, disks
        self.groups = [_socket_group()]
        self.env = scrubbed_env(
            {
                "HOME": str(home),
                "WAKELOOP_DISKS": str(disks),
                "PYTHONPATH": os.pathsep.join([str(REPO), *site.getsitepackages()]),
                "PYTHONDONTWRITEBYTECODE": "1",  # the checkout is root's
            }
        )
        self.argv, self.started_as_nobody = _command(self.env, self.groups)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.argv, *args],
            env=self.env,
            preexec_fn=_as_nobody(self.groups) if self.started_as_nobody else None,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            cwd=self.home,
        )


@pytest.fixture
def nobody() -> Iterator[Nobody]:
    # Not tmp_path: pytest's folders are root's and 0700, and this user must reach its agent.
    home = Path(tempfile.mkdtemp(prefix="wakeloop-nobody-"))
    try:
        os.chown(home, NOBODY, NOBODY)
        disks = home / "disks"
        disks.mkdir(mode=0o700)  # root's, as /var/lib/wakeloop/disks is
        yield Nobody(home, disks)
    finally:
        shutil.rmtree(home)


def one_line_saying_what_to_do(done: subprocess.CompletedProcess, *ways: str) -> str:
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert all(way in done.stderr for way in ways), done.stderr
    return done.stderr


def test_a_docker_group_user_who_is_not_root_is_told_what_to_do_by_every_command_that_touches_disks(nobody):
    assert nobody.run("init", "agent").returncode == 0
    agent = str(nobody.home / "agent")
    for command in (
        ("wake", agent),
        ("sandbox", "exec", agent, "--", "echo hi"),
        ("diff", agent),
        ("undo", agent, "--run", "0123456789ab"),
    ):
        said = one_line_saying_what_to_do(nobody.run(*command), *WAYS_ON)
        assert said.startswith("wakeloop: sandbox.disk: attaching a workspace disk needs root"), (command, said)
    for command in (("disk", "release", agent), ("disk", "rm", agent, "--yes"), ("disk", "list")):
        one_line_saying_what_to_do(nobody.run(*command), "root")
    one_line_saying_what_to_do(nobody.run("escapes", agent), "root", "--broker", "sandbox.disk: none")
    assert list(nobody.disks.iterdir()) == []  # refused before anything of root's was touched

    set_policy(Path(agent), {"version": 1, "sandbox": {"disk": "none", "pool": 0}})
    ran = nobody.run("sandbox", "exec", agent, "--", "id -u")
    assert ran.returncode == 0 and str(NOBODY) in ran.stdout.split(), (ran.stdout, ran.stderr)


def test_a_permission_error_on_the_disks_folder_that_no_check_foresaw_is_still_one_line(monkeypatch, capsys):
    from orchestrator.cli import record_commands, wakeloop
    from orchestrator.sandbox.disks import disk

    def denied(args) -> int:
        raise PermissionError(13, "Permission denied", str(disk.disks_dir() / "room.lock"))

    monkeypatch.setattr(record_commands, "cmd_status", denied)
    assert wakeloop.main(["status", "."]) == 3
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "Permission denied" in said and all(way in said for way in WAYS_ON), said

    def elsewhere(args) -> int:
        raise PermissionError(13, "Permission denied", "/etc/shadow")

    monkeypatch.setattr(record_commands, "cmd_status", elsewhere)
    with pytest.raises(PermissionError):  # not ours to explain: a bug, shown as one
        wakeloop.main(["status", "."])
