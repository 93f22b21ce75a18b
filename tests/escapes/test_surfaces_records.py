"""Every surface probe of escapes/surfaces/records.py can fail: each reports ESCAPED
against wakeloop with one of its checks switched off (monkeypatch) or an
older design put back. COVERED names the probes shown able to fail here."""

from __future__ import annotations

import os

import pytest

from orchestrator.escapes.surfaces import records as probes
from tests.helpers import must_escape

COVERED: set[str] = {
    "mandate_link_is_never_followed",
    "mandate_fifo_never_hangs_a_wake",
    "agent_yaml_link_is_refused",
    "event_log_never_follows_a_link",
    "sparse_state_files_are_read_capped",
    "retention_never_deletes_through_a_link",
    "send_message_is_capped",
    "ceiling_refuses_an_unbounded_number",
    "planted_huge_numbers_read_as_unknown",
}


escapes = must_escape  # tests/helpers/support.py


@pytest.fixture
def old_mandate_reader(monkeypatch):
    """The design before issue 20: mandate.md opened by path, "the human's and trusted"."""
    from orchestrator.wake import context

    def _mandate(agent):
        try:
            with open(agent.mandate_path, "rb") as f:
                data = f.read(context.MANDATE_CAP + 1)
        except OSError:
            return context.NO_MANDATE
        return data[: context.MANDATE_CAP].decode("utf-8", "replace").strip() or context.NO_MANDATE

    monkeypatch.setattr(context, "_mandate", _mandate)


def test_mandate_read_by_path_follows_the_link(surface_lab, old_mandate_reader):
    assert "followed" in escapes(surface_lab, probes.mandate_link_is_never_followed)


def test_mandate_read_by_path_blocks_on_the_fifo(surface_lab, old_mandate_reader):
    assert "blocked" in escapes(surface_lab, probes.mandate_fifo_never_hangs_a_wake)


def test_agent_yaml_read_without_the_folder_walk_is_loaded(surface_lab, monkeypatch):
    from orchestrator.policy import agent
    from orchestrator.safeio import yamlfile

    read_by_path = yamlfile.read_config  # the design before: agent.yaml opened by its path, links followed
    monkeypatch.setattr(agent, "read_config", lambda path, what="policy": read_by_path(os.fspath(path), what))
    assert "was loaded" in escapes(surface_lab, probes.agent_yaml_link_is_refused)


@pytest.fixture
def links_followed(monkeypatch):
    """folder.py with O_NOFOLLOW and the regular-file check switched off."""
    from orchestrator.safeio import folder

    monkeypatch.setattr(folder, "DIR_FLAGS", folder.DIR_FLAGS & ~os.O_NOFOLLOW)
    monkeypatch.setattr(folder, "FILE_FLAGS", folder.FILE_FLAGS & ~os.O_NOFOLLOW)
    monkeypatch.setattr(folder, "_require_regular", lambda mode, shown: None)


def test_an_event_log_that_follows_links_writes_into_the_canary(surface_lab, links_followed):
    assert "into the host canary" in escapes(surface_lab, probes.event_log_never_follows_a_link)


def test_a_walk_that_follows_links_writes_and_deletes_outside(surface_lab, monkeypatch):
    from orchestrator.safeio import folder

    monkeypatch.setattr(folder, "DIR_FLAGS", folder.DIR_FLAGS & ~os.O_NOFOLLOW)
    assert "changed that folder" in escapes(surface_lab, probes.retention_never_deletes_through_a_link)


def test_an_uncapped_outbox_reader_takes_the_whole_sparse_file(surface_lab, monkeypatch):
    from orchestrator.records import state

    monkeypatch.setattr(state, "BOX_CAP", 2**40)
    monkeypatch.setattr(probes, "SPARSE_BYTES", probes.READ_LIMIT + 2**20)  # not 100 GB: the test must end
    assert "took" in escapes(surface_lab, probes.sparse_state_files_are_read_capped)


def test_an_uncut_send_message_lands_whole(surface_lab, monkeypatch):
    from orchestrator.wake import tools

    monkeypatch.setattr(tools, "cut_message", lambda text, max_chars: (text, ""))
    assert "landed" in escapes(surface_lab, probes.send_message_is_capped)


def test_a_ceiling_without_a_bound_for_max_output_chars_lets_it_pass(surface_lab, monkeypatch):
    from orchestrator.policy import ceiling

    monkeypatch.setattr(ceiling, "NOT_A_LIMIT", ("version", "max_output_chars"))
    assert "let a policy ask" in escapes(surface_lab, probes.ceiling_refuses_an_unbounded_number)


def test_numbers_read_with_a_plain_float_crash_on_a_planted_huge_one(surface_lab, monkeypatch):
    from orchestrator.records import event_types, receipt

    def plain(value):  # the reader before json_float: float() of whatever JSON number is there
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    monkeypatch.setattr(receipt, "json_float", plain)
    monkeypatch.setattr(event_types, "json_float", plain)
    assert "crashed a reader" in escapes(surface_lab, probes.planted_huge_numbers_read_as_unknown)
