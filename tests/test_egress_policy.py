"""Credentials, method and path rules and the egress budget as a policy says them (issue 23),
and what the host makes of them before any proxy runs: the proxy's config, the box's
environment, the ceiling, `policy explain`, the scrubbing of known secrets. No engine:
tests/test_egress.py runs the proxy itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.policy.ceiling import Ceiling
from orchestrator.policy.load import parse_policy
from orchestrator.policy.schema import PolicyError
from orchestrator.records.events import secrets_from_env
from orchestrator.safeio import secrets
from orchestrator.sandbox.containers import images
from orchestrator.sandbox.egress import egress_plan, network
from orchestrator.sandbox.explain import _egress_lines

BASE = """\
sandbox:
  network: allowlist
  allow_hosts: [api.github.com, pypi.org]
"""
CREDENTIAL = """\
  credentials:
    - host: api.github.com
      value: "Bearer ${GITHUB_TOKEN}"
      placeholder_env: GH_TOKEN
  http:
    - host: api.github.com
      allow: ["GET /repos/**", "POST /repos/*/pulls"]
  max_egress_bytes_per_wake: 100m
"""


def _policy(extra: str = CREDENTIAL):
    return parse_policy(BASE + extra, "agent.yaml")


def test_a_policy_names_a_credential_by_its_variable_and_rules_by_host():
    box = _policy().sandbox
    (cred,) = box.credentials
    assert (cred.host, cred.header, cred.var, cred.placeholder_env) == (
        "api.github.com",
        "Authorization",
        "GITHUB_TOKEN",
        "GH_TOKEN",
    )
    assert box.http[0].allow == ("GET /repos/**", "POST /repos/*/pulls")
    assert box.http[0].source == "agent.yaml:9"  # the refusal's text names it
    assert box.max_egress_bytes_per_wake == 100 * 2**20


@pytest.mark.parametrize(
    "extra, says",
    [
        ("  credentials: [{host: api.github.com, value: abc}]\n", "sandbox.credentials[0].value: expected one line"),
        ('  credentials: [{host: evil.org, value: "${A_TOKEN}"}]\n', "evil.org is not in sandbox.allow_hosts"),
        ('  credentials: [{host: "*.github.com", value: "${A_TOKEN}"}]\n', "name one host"),
        ('  credentials: [{host: api.github.com, value: "${ANTHROPIC_API_KEY}"}]\n', "wakeloop's own secret"),
        ('  credentials: [{host: api.github.com, value: "${A} ${B}"}]\n', "naming one variable"),
        ('  credentials: [{host: api.github.com, value: "${A}", header: "X Y"}]\n', "HTTP header name"),
        (
            '  credentials: [{host: api.github.com, value: "${A_TOKEN}", placeholder_env: HTTPS_PROXY}]\n',
            "reserved",
        ),
        ("  http: [{host: pypi.org, allow: [get /]}]\n", "sandbox.http[0].allow[0]: expected 'METHOD /path/glob'"),
        ("  http: [{host: pypi.org}]\n", "sandbox.http[0].allow: expected a list"),
        ("  http: [{host: pypi.org, allow: ['GET /'], deny: []}]\n", "sandbox.http[0].deny: unknown key"),
    ],
)
def test_a_malformed_credential_or_rule_is_one_line_naming_the_key(extra, says):
    with pytest.raises(PolicyError) as err:
        _policy(extra)
    assert says in str(err.value) and str(err.value).startswith("agent.yaml:"), str(err.value)


def test_credentials_need_the_allowlist():
    with pytest.raises(PolicyError, match="only used with network: allowlist"):
        parse_policy('sandbox:\n  credentials: [{host: a.org, value: "${A_TOKEN}"}]\n', "agent.yaml")


def test_the_ceiling_lists_the_variables_a_policy_may_name():
    policy = _policy()
    assert "GITHUB_TOKEN is not a variable the broker lets a policy name" in Ceiling().refusal(policy)
    assert Ceiling(credential_env=("GITHUB_*",)).refusal(policy) is None


def test_the_ceiling_bounds_the_budget_and_refuses_no_cap():
    ceiling = Ceiling(max={"max_egress_bytes_per_wake": 50 * 2**20})
    assert "is over the broker's ceiling" in ceiling.refusal(_policy("  max_egress_bytes_per_wake: 100m\n"))
    assert "0 (no cap) is over" in ceiling.refusal(_policy("  max_egress_bytes_per_wake: 0\n"))
    assert ceiling.refusal(_policy("  max_egress_bytes_per_wake: 10m\n")) is None


def test_the_proxy_config_holds_templates_and_placeholders_never_values(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_real_value_123456")
    egress = egress_plan.plan_for(Path("/w"), _policy().sandbox, environ={})
    conf = egress_plan.proxy_config(egress)
    assert "ghp_real_value_123456" not in conf
    intercept = json.loads(conf)["intercept"]["api.github.com"]
    assert intercept["credentials"][0]["value"] == "Bearer ${GITHUB_TOKEN}"
    assert intercept["credentials"][0]["placeholder"] == egress.placeholder(egress.credentials[0])
    assert intercept["allow"] == ["GET /repos/**", "POST /repos/*/pulls"] and intercept["where"] == "agent.yaml:9"
    assert json.loads(conf)["budget"] == 100 * 2**20
    # The value goes to the proxy's environment only, from the given environment.
    assert egress_plan.secret_env(egress, {"GITHUB_TOKEN": "v"}) == {"WAKELOOP_SECRET_GITHUB_TOKEN": "v"}
    with pytest.raises(egress_plan.NetworkError, match="names GITHUB_TOKEN for api.github.com, which is not set"):
        egress_plan.secret_env(egress, {})


def test_the_box_gets_the_placeholder_and_the_ca_variables_never_the_value():
    egress = egress_plan.plan_for(Path("/w"), _policy().sandbox, environ={})
    env = egress.env()
    assert env["GH_TOKEN"].startswith("wakeloop-placeholder-GH_TOKEN-")
    assert all(env[name] == "/tmp/wakeloop-ca.pem" for name in egress_plan.CA_VARS)
    plain = egress_plan.plan_for(Path("/w"), _policy("").sandbox, environ={})
    assert not set(egress_plan.CA_VARS) & set(plain.env()) and plain.intercepted == ()


def test_a_plain_list_keys_as_before_and_any_egress_setting_is_a_new_proxy():
    workspace, hosts = Path("/w"), ("api.github.com", "pypi.org")
    plain = egress_plan.plan_for(workspace, _policy("").sandbox, environ={})
    assert plain.key == egress_plan.plan(workspace, hosts).key  # a running proxy set is found again
    assert egress_plan.plan_for(workspace, _policy().sandbox, environ={}).key != plain.key
    private = egress_plan.plan_for(workspace, _policy("").sandbox, environ={egress_plan.PRIVATE_OK_ENV: "pypi.org"})
    assert private.private_ok == ("pypi.org",) and private.key != plain.key


def test_a_changed_proxy_image_folder_is_a_new_tag(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM debian\n")
    before = images.inputs_hash(tmp_path)
    (tmp_path / "egress_addon.py").write_text("# changed\n")
    assert images.inputs_hash(tmp_path) != before
    assert network.PROXY_IMAGE.startswith("wakeloop-proxy:inputs-")


def test_explain_shows_each_credential_as_name_and_host(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_real_value_123456")
    egress = egress_plan.plan_for(Path("/w"), _policy().sandbox, environ={})
    text = "\n".join(_egress_lines(egress, 100 * 2**20))
    assert "credential GITHUB_TOKEN -> api.github.com" in text and "GH_TOKEN=<placeholder>" in text
    assert "ghp_real_value_123456" not in text and "api.github.com: only GET /repos/**" in text


def test_a_credential_named_by_a_policy_is_scrubbed_like_the_api_key(monkeypatch):
    monkeypatch.setattr(secrets, "CREDENTIAL_NAMES", set())
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_real_value_123456")
    assert "ghp_real_value_123456" not in secrets_from_env()
    _policy()  # reading the policy notes the name
    assert "ghp_real_value_123456" in secrets_from_env()
