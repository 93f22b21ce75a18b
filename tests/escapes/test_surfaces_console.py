"""Every surface probe of escapes/surfaces/console.py can fail: each reports ESCAPED
against wakeloop with one of its checks switched off (monkeypatch) or an
older design put back. COVERED names the probes shown able to fail here."""

from __future__ import annotations

import hmac
import os
import secrets

import jinja2

from orchestrator import metrics
from orchestrator.console import auth
from orchestrator.console.hosts import Hosts
from tests.helpers import must_escape

COVERED: set[str] = {
    "console_refuses_foreign_host",
    "console_reading_needs_the_token_on_loopback",
    "console_refuses_a_pre_made_token_file",
    "console_refuses_a_forged_form_with_a_valid_cookie",
    "console_csrf_holds_whatever_authorization_says",
    "console_shows_agent_text_inert",
    "console_metrics_bounded_against_invented_tools",
}


escapes = must_escape  # by the probe's name (tests/helpers/support.py)


def test_console_answering_any_host_is_rebound(surface_lab, monkeypatch):
    monkeypatch.setattr(Hosts, "answers", lambda self, host: True)
    assert "rebind.example" in escapes(surface_lab, "console_refuses_foreign_host")


def test_console_open_for_reading_on_loopback_is_read(surface_lab, monkeypatch):
    """The old rule: reading open on a loopback listener."""
    monkeypatch.setattr(
        auth.Access, "may_read", lambda self, cookies, headers: self.loopback or self.signed_in(cookies, headers)
    )
    assert "without the token: 200" in escapes(surface_lab, "console_reading_needs_the_token_on_loopback")


def _old_load_token(root, environ=os.environ):
    """load_token before issue 20: a kept file read whatever its owner and mode; a short one
    overwritten in place (O_TRUNC, no O_EXCL)."""
    path = root / auth.TOKEN_FILE
    try:
        kept = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        kept = ""
    if len(kept) >= auth.MIN_TOKEN_CHARS:
        return kept, f"token in {path}"
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, f"token generated, kept in {path}: {token}"


def test_console_token_file_used_as_found_is_taken_over(surface_lab, monkeypatch):
    monkeypatch.setattr(auth, "load_token", _old_load_token)
    observed = escapes(surface_lab, "console_refuses_a_pre_made_token_file")
    assert "used as is" in observed


def test_console_without_the_csrf_check_acts_on_a_forged_form(surface_lab, monkeypatch):
    monkeypatch.setattr(auth.Access, "csrf_ok", lambda self, form: True)
    assert "paused=True" in escapes(surface_lab, "console_refuses_a_forged_form_with_a_valid_cookie")


def _old_why_not_act(self, cookies, headers, form, own_origin):
    """why_not_act before issue 20: the CSRF field skipped whenever any Authorization header came."""
    if not self.actions_allowed:
        return "actions are off"
    if not self.signed_in(cookies, headers):
        return "sign in with the console token first"
    origin = headers.get("origin")
    if origin and origin != own_origin:
        return f"refused: a request from {origin}"
    if "authorization" not in headers and not hmac.compare_digest(form.get("csrf", "").encode(), self.csrf.encode()):
        return "refused: the form's CSRF token is missing or wrong"
    return None


def test_console_skipping_csrf_for_any_authorization_header_acts(surface_lab, monkeypatch):
    monkeypatch.setattr(auth.Access, "why_not_act", _old_why_not_act)
    assert "Authorization 'garbage'" in escapes(surface_lab, "console_csrf_holds_whatever_authorization_says")


def test_console_without_autoescaping_runs_the_agents_script(surface_lab, monkeypatch):
    unescaped = jinja2.Environment

    def environment(**kwargs):
        return unescaped(**{**kwargs, "autoescape": False})

    monkeypatch.setattr(jinja2, "Environment", environment)
    assert "<script> is in the page" in escapes(surface_lab, "console_shows_agent_text_inert")


def test_metrics_taking_any_tool_name_mint_series(surface_lab, monkeypatch):
    monkeypatch.setattr(metrics, "tool_label", lambda name: str(name))
    assert "new series" in escapes(surface_lab, "console_metrics_bounded_against_invented_tools")
