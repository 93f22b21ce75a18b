"""Every surface probe of escapes/surfaces/approval_probes.py can fail: each reports ESCAPED
against wakeloop with one of its checks switched off (monkeypatch) or an
older design put back. COVERED names the probes shown able to fail here."""

from __future__ import annotations

import json
from dataclasses import replace

from orchestrator.console import approval_pages
from orchestrator.records import approval_links, approvals
from orchestrator.safeio import shown
from orchestrator.safeio.folder import Folder
from tests.helpers import must_escape

COVERED: set[str] = {
    "approvals_refuse_a_forged_or_borrowed_link",
    "approvals_link_decides_once",
    "approvals_the_model_cannot_approve_its_own_call",
    "approvals_show_the_call_as_it_runs",
}


escapes = must_escape  # by the probe's name (tests/helpers/support.py)


def _unsigned_verify(key, token, now=None):
    """A link read for what it says, its MAC never checked, and no nonce of the approval's to match."""
    raw = json.loads(approval_links._unb64(token.split(".")[0]))
    return approval_links.Link(raw["a"], raw["i"], raw["d"], int(raw["e"]), raw["n"])


def test_unsigned_links_are_forged(surface_lab, monkeypatch):
    monkeypatch.setattr(approval_links, "verify", _unsigned_verify)
    real_decide = approvals.decide
    monkeypatch.setattr(
        approvals,
        "decide",
        lambda sd, i, ok, by, reason="", nonce=None, now=None: real_decide(sd, i, ok, by, reason, None, now),
    )
    real_open = approval_pages.open_link

    def trusting_open(root, pages, token):
        link = _unsigned_verify(None, token)
        a = approvals.load(pages.agent_dir(link.agent) / "state", link.approval_id)
        return real_open.__globals__["Opened"](link, pages.agent_dir(link.agent), a)

    monkeypatch.setattr(approval_pages, "open_link", trusting_open)
    assert "b is approved" in escapes(surface_lab, "approvals_refuse_a_forged_or_borrowed_link")


def test_stateless_links_are_replayed(surface_lab, monkeypatch):
    """The design without state: a valid signature is enough, whatever became of the approval."""

    def stateless_open(root, pages, token):
        link = approval_links.verify(approval_links.load_key(root, create=False), token)
        agent_dir = pages.agent_dir(link.agent)
        return approval_pages.Opened(link, agent_dir, approvals.load(agent_dir / "state", link.approval_id))

    def last_word_wins(sd, approval_id, approve, by, reason="", nonce=None, now=None):
        a = replace(approvals.load(sd, approval_id), status="approved" if approve else "denied", decided_by=by)
        approvals._save(sd, a)
        return a

    monkeypatch.setattr(approval_pages, "open_link", stateless_open)
    monkeypatch.setattr(approvals, "decide", last_word_wins)
    assert "now denied" in escapes(surface_lab, "approvals_link_decides_once")


def test_approvals_kept_in_the_workspace_are_written_by_the_model(surface_lab, monkeypatch):
    """Approvals read from where the box writes (the workspace), not state/."""
    first = {}

    def in_workspace(state_dir):
        folder = Folder(state_dir.parent, ("workspace",))
        first.setdefault("planted", False)
        return folder if first["planted"] else Folder(state_dir.parent, ("state",))

    real_take = approvals.take

    def take_after_planting(*args, **kwargs):
        first["planted"] = True
        return real_take(*args, **kwargs)

    monkeypatch.setattr(approvals, "state_folder", in_workspace)
    monkeypatch.setattr(approvals, "take", take_after_planting)
    assert "approved" in escapes(surface_lab, "approvals_the_model_cannot_approve_its_own_call")


def test_a_call_shown_as_written_hides_what_runs(surface_lab, monkeypatch):
    """The one function that writes hidden characters out (safeio/shown.py) finding none:
    the CLI, the console and the notifications show what they are given."""
    monkeypatch.setattr(shown, "HIDDEN", frozenset())
    monkeypatch.setattr(shown, "BLANK", frozenset())
    observed = escapes(surface_lab, "approvals_show_the_call_as_it_runs")
    assert "'CLI table': ['U+200B', 'U+2060', 'U+2066', 'U+2067', 'U+2069']" in observed, observed
