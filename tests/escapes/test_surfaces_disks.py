"""Every surface probe of escapes/surfaces/disks.py can fail: each reports ESCAPED
against wakeloop with one of its checks switched off (monkeypatch) or an
older design put back. COVERED names the probes shown able to fail here."""

from __future__ import annotations

import pytest

from orchestrator.escapes.surfaces import disks as probes
from orchestrator.sandbox.disks import disk_attach, disk_index
from tests.helpers import must_escape

pytestmark = pytest.mark.docker

COVERED: set[str] = {
    "disks_one_per_folder_through_renames",
    "disks_released_after_a_one_shot_call",
    "disks_never_handed_to_a_folder_made_in_a_deleted_ones_place",
    "disks_broker_box_follows_the_folder_not_the_name",
    "disks_import_writes_only_inside_the_new_disk",
}


def path_keyed(folder, *, agent, host_workspace, host_folder, within=None, identity=None) -> str:
    """The design before issue 20: a disk named by the agent's name and its workspace's path."""
    return disk_index.legacy_key(agent, host_workspace)


escapes = must_escape  # tests/helpers/support.py


def test_renames_multiply_disks_when_a_disk_is_named_by_its_path(surface_lab, monkeypatch):
    monkeypatch.setattr(disk_index, "claim", path_keyed)
    assert "4 disk images and 4 loop devices" in escapes(surface_lab, probes.disks_one_per_folder_through_renames)


def test_a_one_shot_call_leaves_its_disk_attached_when_closing_does_not_release_it(surface_lab, monkeypatch):
    kept = []
    monkeypatch.setattr(disk_attach, "let_go", lambda client, held: kept.append(held))  # the box lets go of nothing
    try:
        assert "still attached" in escapes(surface_lab, probes.disks_released_after_a_one_shot_call)
    finally:
        for held in kept:  # the hold the weakened box kept: dropped, so no later test sees it held
            if held.hold:
                held.hold.drop()


def test_a_new_folder_in_a_deleted_ones_place_gets_its_disk_when_named_by_its_path(surface_lab, monkeypatch):
    monkeypatch.setattr(disk_index, "claim", path_keyed)
    observed = escapes(surface_lab, probes.disks_never_handed_to_a_folder_made_in_a_deleted_ones_place)
    assert "got the deleted agent's disk" in observed


def test_the_broker_reuses_a_renamed_agents_box_for_a_newcomer_without_the_identity_check(surface_lab, monkeypatch):
    from orchestrator.sandbox import keeper

    before = keeper._needs_new_box
    monkeypatch.setattr(
        keeper, "_needs_new_box", lambda box, place, policy: before(box, (*place[:3], box.identity), policy)
    )
    assert "newcomer's calls ran" in escapes(surface_lab, probes.disks_broker_box_follows_the_folder_not_the_name)


def test_an_import_extracted_as_tar_does_by_default_writes_outside_the_disk(surface_lab, monkeypatch):
    import tarfile

    from orchestrator.sandbox.disks import workspace_stream

    def extract_all(stream, root):  # what `tar -x` (and tarfile before its filters) would do
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            tar.extractall(root, filter="fully_trusted")
        return workspace_stream.digest(root)

    monkeypatch.setattr(workspace_stream, "unpack", extract_all)
    assert "wrote outside it (absolute, dotdot, through-a-link)" in escapes(
        surface_lab, probes.disks_import_writes_only_inside_the_new_disk
    )
