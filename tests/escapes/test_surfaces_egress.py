"""Every surface probe of escapes/surfaces/egress_probes.py can fail: each reports ESCAPED
against wakeloop with one of its checks switched off (monkeypatch). COVERED names the
probes shown able to fail here."""

from __future__ import annotations

import os
import re

import jinja2

from tests.helpers import must_escape

COVERED: set[str] = {
    "egress_log_shows_planted_lines_inert",
    "egress_wake_page_shows_planted_lines_inert",
    "egress_metrics_count_no_planted_number",
    "egress_record_never_follows_a_link",
}

escapes = must_escape  # by the probe's name (tests/helpers/support.py)


def test_a_log_that_keeps_control_characters_prints_the_escape_sequence(surface_lab, monkeypatch):
    from orchestrator.records import egress
    from orchestrator.views import egressview

    monkeypatch.setattr(egress, "CONTROL", re.compile(r"(?!)"))  # the record's cleaning off
    monkeypatch.setattr(egressview, "clean", lambda text: text)  # and the view's
    assert "terminal escape" in escapes(surface_lab, "egress_log_shows_planted_lines_inert")


def test_a_log_without_a_line_cap_prints_the_ten_megabyte_line(surface_lab, monkeypatch):
    from orchestrator.records import egress

    monkeypatch.setattr(egress, "READ_LINE_CAP", 64 * 2**20)
    monkeypatch.setattr(egress, "PATH_CAP", 64 * 2**20)
    assert "10 MB line" in escapes(surface_lab, "egress_log_shows_planted_lines_inert")


def test_a_console_that_does_not_escape_shows_the_planted_markup(surface_lab, monkeypatch):
    unescaped = jinja2.Environment

    def environment(**kwargs):
        return unescaped(**{**kwargs, "autoescape": False})

    monkeypatch.setattr(jinja2, "Environment", environment)
    assert "as markup" in escapes(surface_lab, "egress_wake_page_shows_planted_lines_inert")


def test_a_reader_taking_any_integer_books_the_planted_bytes(surface_lab, monkeypatch):
    from orchestrator.records import egress

    monkeypatch.setattr(egress, "_bytes", lambda value: value if isinstance(value, int) else None)
    assert "planted counts were added" in escapes(surface_lab, "egress_metrics_count_no_planted_number")


def test_an_egress_record_that_follows_links_writes_into_the_canary(surface_lab, monkeypatch):
    from orchestrator.safeio import folder

    monkeypatch.setattr(folder, "DIR_FLAGS", folder.DIR_FLAGS & ~os.O_NOFOLLOW)
    monkeypatch.setattr(folder, "FILE_FLAGS", folder.FILE_FLAGS & ~os.O_NOFOLLOW)
    monkeypatch.setattr(folder, "_require_regular", lambda mode, shown: None)
    assert "into the host canary" in escapes(surface_lab, "egress_record_never_follows_a_link")
