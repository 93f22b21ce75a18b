"""Every surface probe of escapes/surfaces/notify.py can fail: each reports ESCAPED
against wakeloop with one of its checks switched off (monkeypatch) or an
older design put back. COVERED names the probes shown able to fail here."""

from __future__ import annotations

import urllib.request
from email import message_from_string

import pytest

from orchestrator.escapes.lab import ESCAPED, run_probe
from orchestrator.escapes.surfaces import notify as probes
from orchestrator.notify import channels, config

COVERED: set[str] = {
    "notify_slack_markup_arrives_inert",
    "notify_target_never_carries_a_secret",
    "notify_refuses_command_from_agent_yaml",
    "notify_email_headers_are_ours",
    "notify_does_not_follow_redirects",
}


pytestmark = pytest.mark.usefixtures("no_ceiling")  # conftest: none of the machine's


def outcome_of(lab, name: str):
    [probe] = [p for p in probes.PROBES if p.name == name]
    return run_probe(lab, probe)


def test_slack_markup_escapes_without_the_escaping(surface_lab, monkeypatch):
    monkeypatch.setattr(channels, "slack_escape", lambda text: text)
    outcome = outcome_of(surface_lab, "notify_slack_markup_arrives_inert")
    assert outcome.verdict == ESCAPED and "<!channel>" in outcome.observed


def test_slack_markup_escapes_with_the_old_text_put_back(surface_lab, monkeypatch):
    """The design before: our bold title, then the agent's text as it came."""
    monkeypatch.setattr(channels, "slack_text", lambda p: f"*{p['title']}*\n{p['text']}")
    assert outcome_of(surface_lab, "notify_slack_markup_arrives_inert").verdict == ESCAPED


def test_slack_lines_escape_without_the_quote(surface_lab, monkeypatch):
    """Escaped but unquoted: the agent's `*wakeloop: …*` line stands beside our heading."""
    monkeypatch.setattr(channels, "slack_text", lambda p: f"*{p['title']}*\n{channels.slack_escape(p['text'])}")
    outcome = outcome_of(surface_lab, "notify_slack_markup_arrives_inert")
    assert outcome.verdict == ESCAPED and "line of its own" in outcome.observed


def test_a_secret_reaches_the_receiver_without_the_allowed_names(surface_lab, monkeypatch):
    """The design before: any ${VAR} in a target expanded at send time."""
    monkeypatch.setattr(config.Allowed, "refusal", lambda self, name: None)
    outcome = outcome_of(surface_lab, "notify_target_never_carries_a_secret")
    assert outcome.verdict == ESCAPED and "request path" in outcome.observed


def test_a_secret_target_loads_without_the_load_time_check(surface_lab, monkeypatch):
    """The send-time lock alone: nothing is sent, but ROOT/notify.yaml's secret target loaded
    (agent.yaml's is still refused by the rule that a ${VAR} only starts its target)."""
    monkeypatch.setattr(config, "target_refusal", lambda target, allowed: None)
    outcome = outcome_of(surface_lab, "notify_target_never_carries_a_secret")
    assert outcome.verdict == ESCAPED and "loaded" in outcome.observed and "request path" not in outcome.observed


def test_a_secret_is_sent_without_the_send_time_check(surface_lab, monkeypatch):
    """The load-time check alone: a channel that got past it (built by other code) sends the key."""

    def old_expand(text, environ, allowed=()):
        return config._VAR.sub(lambda m: environ[m.group(1)], text)

    monkeypatch.setattr(channels, "expand", old_expand)
    outcome = outcome_of(surface_lab, "notify_target_never_carries_a_secret")
    assert outcome.verdict == ESCAPED and "request path" in outcome.observed


def test_an_agent_command_runs_without_the_operator_only_rule(surface_lab, monkeypatch):
    monkeypatch.setattr(config, "command_allowed", lambda operator, allowed: True)
    outcome = outcome_of(surface_lab, "notify_refuses_command_from_agent_yaml")
    assert outcome.verdict == ESCAPED and "ran as the orchestrator" in outcome.observed


def test_email_is_silenced_when_the_subject_is_the_raw_title(surface_lab, monkeypatch):
    """The design before: Subject = the title as it came; the stdlib refuses the line break,
    so every attempt failed and the operator heard nothing."""
    monkeypatch.setattr(channels, "one_line", lambda text, cap=0: text)
    outcome = outcome_of(surface_lab, "notify_email_headers_are_ours")
    assert outcome.verdict == ESCAPED and "kept its email from being sent" in outcome.observed


def test_email_headers_are_injected_by_a_message_built_as_text(surface_lab, monkeypatch):
    """A message built by pasting the title into header text: the agent's name adds headers."""

    def pasted(to, sender, payload):
        return message_from_string(f"From: {sender}\nTo: {to}\nSubject: {payload['title']}\n\n{payload['text']}\n")

    monkeypatch.setattr(channels, "_message", pasted)
    outcome = outcome_of(surface_lab, "notify_email_headers_are_ours")
    assert outcome.verdict == ESCAPED and "x-evil" in outcome.observed


def test_a_redirect_is_followed_by_urllibs_default_opener(surface_lab, monkeypatch):
    """The design before: urllib.request.urlopen, which turns a 302 after a POST into a GET elsewhere."""

    def urlopen(url, data, headers):
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers, method="POST")) as r:
            return r.status, r.read(100)

    monkeypatch.setattr(channels, "_request", urlopen)
    outcome = outcome_of(surface_lab, "notify_does_not_follow_redirects")
    assert outcome.verdict == ESCAPED and "/followed" in outcome.observed
