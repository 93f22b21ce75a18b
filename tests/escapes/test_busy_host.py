"""`wakeloop escapes` on a busy host: a disk another mount namespace holds does not end the run.

A probe of the test's own mounts its trial's disk (one call), then starts a
process in a mount namespace of its own that keeps a copy of that disk's
mounts (tests/helpers/mounts.py), as a lab's node started meanwhile does. The
trial's cleanup then cannot detach the disk. The run must go on to the next
probe, that probe must be INCONCLUSIVE and say what it left and how to release
it, and the report must be written (stdout, the kept report, the console's
page, the text card). The test then does what the report says, and nothing is
left. Any other cleanup step that raises (a box's close) is reported the same way.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

import docker.errors
import pytest

from orchestrator.console.app import Console, start
from orchestrator.console.auth import Access
from orchestrator.escapes import ALL_PROBES, HELD, INCONCLUSIVE, by_name, command, run_suite
from orchestrator.escapes.lab import Outcome, Probe, Trial, held
from orchestrator.escapes.report import text_report
from orchestrator.records import escape_reports
from orchestrator.sandbox.disks import disk, disk_index, disk_survey
from orchestrator.sandbox.engine import DockerSandbox
from tests.helpers import run_cli
from tests.helpers.console import TOKEN, Client
from tests.helpers.mounts import hold_copy, let_go

# serial: the holder (unshare -m) copies every mount of the host at its start, other tests' disks
# included, until it drops them; beside another worker's disk test that copy makes its release fail.
pytestmark = [pytest.mark.docker, pytest.mark.serial]

NEXT = "blocks_mount"  # a quick probe that runs after the busy one


@pytest.fixture
def holders():
    """hold(device): a holder of a copy of the device's mounts (hold_copy), ended after the test
    whatever happened."""
    started: list[subprocess.Popen] = []

    def hold(device: str) -> subprocess.Popen:
        started.append(hold_copy(device))
        return started[-1]

    yield hold
    for holder in started:
        let_go(holder)


def test_a_disk_another_namespace_holds_is_reported_and_the_run_goes_on(
    runtime, holders, tmp_path, monkeypatch, capsys
):
    held_by: list[subprocess.Popen] = []

    def mount_then_be_held(t: Trial) -> str:
        t.run("true")  # the trial's box, and its disk mounted
        assert t.box.disk is not None, "the default policy gives the trial a disk"
        held_by.append(holders(t.box.disk.device))
        return held("the disk's mounts copied into another mount namespace")

    busy = Probe("leaves_a_disk_a_busy_host_holds", "filesystem", "the run goes on", mount_then_be_held)
    monkeypatch.setattr(command, "ALL_PROBES", (busy, *ALL_PROBES))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the lab's folder: where this session's checks look
    monkeypatch.setenv(escape_reports.REPORTS_ENV, str(tmp_path / "reports"))

    code = command.run(None, None, runtime, as_json=True, only=[busy.name, NEXT])

    said = capsys.readouterr()
    report = json.loads(said.out)
    assert code == command.EXIT_ESCAPED and report["escaped"] is True
    outcomes = {o["probe"]: o for o in report["probes"]}
    assert list(outcomes) == [busy.name, NEXT], said.err[-2000:]
    assert outcomes[NEXT]["verdict"] == HELD and outcomes[NEXT]["left"] == ""  # the run went on
    left, holder = outcomes[busy.name], held_by[0]
    assert left["verdict"] == INCONCLUSIVE, left
    assert left["observed"].startswith("its cleanup failed: releasing its disk failed: DiskError: sandbox.disk: ")
    assert "still open 10 s after detaching" in left["observed"]
    assert left["left"].startswith(f"the disk {disk.disks_dir()}/escapes-"), left["left"]
    assert f"in the mount namespace of pid {holder.pid} (python" in left["left"], left["left"]
    assert f"`nsenter -t {holder.pid} -m umount -l " in left["left"], left["left"]
    assert report["counts"]["filesystem"] == {"HELD": 1, "ESCAPED": 0, "INCONCLUSIVE": 1}

    # The report is written: kept for the console, shown there and on the text card.
    assert escape_reports.latest()[0]["probes"] == report["probes"]
    assert "kept " in said.err and "a disk of theirs is left" in said.err
    card = text_report([Outcome(**o) for o in report["probes"]], [], "card")
    assert f"  INCONCLUSIVE: {busy.name}: its cleanup failed" in card and f"    left: {left['left']}" in card
    (tmp_path / "agents").mkdir()
    listening = start(Console(tmp_path / "agents", Access(TOKEN, True)), "127.0.0.1", 0, ())
    try:
        page = Client(listening.url).sign_in().get("/escapes")[2]
    finally:
        listening.stop()
    assert "left on this host: " in page and f"nsenter -t {holder.pid} -m umount -l" in page

    # What the report says to do releases it: the holder ended, then `wakeloop disk rm` and rm.
    found = re.search(r"`wakeloop disk rm (\S+) --yes` and `rm -r (\S+)`", left["left"])
    assert found and found[1] == found[2], left["left"]
    folder = Path(found[1])
    key = disk_index.lookup(folder)
    assert folder.is_dir() and key and disk_survey.devices(key), "the folder and its disk are kept"
    let_go(holder)
    done = run_cli("disk", "rm", str(folder), "--yes")
    assert done.returncode == 0, done.stderr
    subprocess.run(["rm", "-r", str(folder)], check=True)
    assert not disk.path_of(key, "img").exists() and not disk_survey.devices(key)
    labs = [p for p in tmp_path.iterdir() if p.name.startswith("wakeloop-escapes-")]
    assert [list(lab.iterdir()) for lab in labs] == [[]], labs  # the lab's folder, empty now


class _CloseFails(DockerSandbox):
    """A box whose close raises once it has closed: an engine that stopped answering mid-cleanup."""

    def close(self) -> None:
        super().close()
        raise docker.errors.APIError("the engine went away while closing")


def test_a_cleanup_step_that_raises_is_reported_and_the_run_goes_on(make_lab):
    lab = make_lab(sandbox_class=_CloseFails)
    try:
        outcomes = run_suite(lab, [by_name("blocks_mount"), by_name("blocks_chroot")])
    finally:
        lab.close()
    assert [o.verdict for o in outcomes] == [INCONCLUSIVE, INCONCLUSIVE], outcomes
    failed = "closing its boxes failed: APIError: the engine went away while closing"
    for o in outcomes:
        assert o.observed == f"its cleanup failed: {failed}"
        assert o.left.startswith(f"{failed}; `docker ps -a --filter label=wakeloop.workspace="), o.left
    assert not lab.kept and not lab.base.exists()  # no disk left: every folder went
