"""The transaction probes (orchestrator/escapes/transaction_probes.py) each report ESCAPED
when their defence is switched off with monkeypatch: the commit's policy check that passes
everything, a commit that copies (following links) instead of renaming, a scan that does
not count a file's hard links, the wire's run-id check gone, a broker that serves calls
while a wake commits, a failed commit not rolled back; and where the engine mounts the
disk itself (engine_mount_probes.py), the same controls, and a box that binds the disk's
root instead of its files/. COVERED names them for test_weakened.py's
every-probe-has-a-control check.
"""

from __future__ import annotations

import os
import shutil

import pytest
from docker.types import Mount

from orchestrator.broker import ops
from orchestrator.escapes import ESCAPED, by_name
from orchestrator.escapes.lab import run_probe
from orchestrator.sandbox.box import WORKSPACE
from orchestrator.sandbox.disks import disk, layers
from orchestrator.sandbox.wakes import transaction

COVERED = {
    "transaction_refuses_protected_paths_by_bash",
    "transaction_never_follows_links_across_layers",
    "transaction_refuses_setid_bits_at_commit",
    "broker_refuses_run_ids_that_walk_out",
    "broker_serves_nothing_while_a_wake_commits",
    "transaction_whole_on_a_full_disk",
    "engine_mounts_show_a_box_only_its_files",
    "engine_mounts_refuse_protected_paths_by_bash",
    "engine_mounts_never_follow_links_across_layers",
    "engine_mounts_refuse_setid_bits_at_commit",
}


def _passes_everything(changes, protect=(), protect_git=True):
    return list(changes), []


_rename = transaction._move


def _copy_following_links(source, target):
    """A commit built the way we refused: a link to a file copied in, followed; the rest renamed."""
    if os.path.islink(source) and os.path.isfile(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)
        os.unlink(source)
    else:
        _rename(source, target)


@pytest.mark.parametrize(
    "probe_name, says",
    [
        ("transaction_refuses_protected_paths_by_bash", "protected paths changed on the disk"),
        ("transaction_refuses_setid_bits_at_commit", "set-id files landed in files/"),
        ("engine_mounts_refuse_protected_paths_by_bash", "protected paths changed on the disk"),
        ("engine_mounts_refuse_setid_bits_at_commit", "set-id files landed in files/"),
    ],
)
def test_commit_probes_escape_a_check_that_passes_everything(probe_name, says, make_lab, monkeypatch):
    monkeypatch.setattr(transaction, "check", _passes_everything)
    outcome = run_probe(make_lab(), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"check off: {probe_name} said {outcome.verdict}: {outcome.observed}"
    assert says in outcome.observed, outcome.observed


@pytest.mark.parametrize(
    "probe_name", ["transaction_never_follows_links_across_layers", "engine_mounts_never_follow_links_across_layers"]
)
def test_the_links_probes_escape_a_commit_that_follows_links(probe_name, make_lab, monkeypatch):
    monkeypatch.setattr(transaction, "_move", _copy_following_links)
    outcome = run_probe(make_lab(), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "copied what a link names" in outcome.observed or "did not land as the same links" in outcome.observed


@pytest.mark.parametrize(
    "probe_name", ["transaction_never_follows_links_across_layers", "engine_mounts_never_follow_links_across_layers"]
)
def test_the_links_probes_escape_a_scan_that_does_not_count_hard_links(probe_name, make_lab, monkeypatch):
    monkeypatch.setattr(transaction, "_links_outside", lambda upper, changes: changes)
    outcome = run_probe(make_lab(), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "a hard link planted in the upper layer" in outcome.observed


def test_the_run_id_probe_escapes_a_broker_without_its_id_check(make_lab, monkeypatch):
    monkeypatch.setattr(ops, "_run_id", lambda run_id: run_id)  # the wire's check and the layout's, both off
    monkeypatch.setattr(layers, "run_id_ok", lambda run_id: run_id)
    outcome = run_probe(make_lab(), by_name("broker_refuses_run_ids_that_walk_out"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "not for its run id" in outcome.observed or "the broker served it" in outcome.observed


def test_the_commit_race_probe_escapes_a_broker_that_serves_calls_during_a_finish(make_lab, monkeypatch):
    from orchestrator.sandbox.keeper import Keeper

    monkeypatch.setattr(Keeper, "_not_layering", lambda self, name: None)
    outcome = run_probe(make_lab(), by_name("broker_serves_nothing_while_a_wake_commits"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "served while the wake's changes were committed" in outcome.observed


@pytest.mark.serial  # as its probe (tests/conftest.py SERIAL_PROBES)
def test_the_full_disk_probe_escapes_a_commit_that_is_not_rolled_back(make_lab, monkeypatch):
    monkeypatch.setattr(transaction, "_roll_back", lambda *args: None)
    outcome = run_probe(make_lab(), by_name("transaction_whole_on_a_full_disk"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "half a commit on the disk" in outcome.observed


def test_the_engine_mounts_probe_escapes_a_box_that_binds_the_disks_root(make_lab, monkeypatch):
    mount = disk.Disk.mount

    def binds_the_root(self, wake=None):
        if self.engine_root is not None and not wake:
            return Mount(target=WORKSPACE, source=str(self.engine_root), type="bind")
        return mount(self, wake)

    monkeypatch.setattr(disk.Disk, "mount", binds_the_root)
    outcome = run_probe(make_lab(), by_name("engine_mounts_show_a_box_only_its_files"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "the box sees the disk's own" in outcome.observed and "lost+found" in outcome.observed
