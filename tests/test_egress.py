"""Credentials bound to hosts, HTTPS interception, method and path rules, the egress record
and budget (issue 23), against a real HTTPS server of our own on the proxies' network.

The server (`echo`, below: the credential probes' own, escapes/credentials.py) runs in
the proxy image (python3 and its cryptography), makes its own CA and a certificate for
three names at its start, and sits on the shared egress bridge under those names, which
the proxy resolves through the engine's DNS:

- secret.wakeloop.test: the credential's host, with rules (GET /repos/**, POST /repos/*/pulls);
- ruled.wakeloop.test: rules only (intercepted, no credential);
- plain.wakeloop.test: allowed and tunnelled untouched.

Its address is private, as every container's is; the proxy refuses private destinations
unless the operator names the host in WAKELOOP_EGRESS_PRIVATE_OK (egress_plan.plan_for), which
the fixture sets, with the server's CA in WAKELOOP_EGRESS_UPSTREAM_CA; one test shows the
refusal without it. The server answers every request with a JSON summary (the
Authorization header only as its SHA-256, unless the path ends in /echo) and prints what
it received on its stdout, where the tests look for the secret. A tunnelled request shows
the box the server's own certificate, which the box has no reason to trust: curl -k there.
Nothing leaves this machine.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shlex
from contextlib import nullcontext
from dataclasses import replace

import pytest
import yaml

from orchestrator.broker.client import BrokerSandbox
from orchestrator.cli.wakeloop import main
from orchestrator.escapes.credentials import echo_server
from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.policy.load import parse_policy
from orchestrator.records import approvals, egress
from orchestrator.sandbox.egress import egress_plan, network
from orchestrator.sandbox.engine import DockerSandbox
from orchestrator.testing.fakeapi import FAKE_KEY, text, tool_use, turn
from orchestrator.wake.loop import wake
from orchestrator.wake.model import LiveModel
from tests.helpers import live_wake, set_policy, wait_for
from tests.helpers.broker import served
from tests.helpers.recorded import first_user_text, tool_result_texts

SECRET_HOST, RULED_HOST, PLAIN_HOST = "secret.wakeloop.test", "ruled.wakeloop.test", "plain.wakeloop.test"
NAMES = (SECRET_HOST, RULED_HOST, PLAIN_HOST)
TOKEN_VAR = "EGRESS_TEST_TOKEN"  # the credential's variable, in this process's environment only
TEST_LABEL = "wakeloop.egresstest"  # on our server, so only it is ever removed

POLICY = f"""\
sandbox:
  network: allowlist
  disk: none
  pool: 0
  allow_hosts: [{SECRET_HOST}, {RULED_HOST}, {PLAIN_HOST}]
  credentials:
    - host: {SECRET_HOST}
      value: "Bearer ${{{TOKEN_VAR}}}"
      placeholder_env: GH_TOKEN
  http:
    - host: {SECRET_HOST}
      allow: ["GET /repos/**", "POST /repos/*/pulls"]
    - host: {RULED_HOST}
      allow: ["GET /**"]
"""
HTTP_RULE_LINE = POLICY.splitlines().index(f"    - host: {SECRET_HOST}", 10) + 1  # sandbox.http[0]

# Runs in the box: everything the box can read that could hold the value, into one file.
DUMP = r"""
import os
out = []
for name in os.listdir("/proc"):
    if name.isdigit():
        for what in ("environ", "cmdline"):
            try:
                out.append(open(f"/proc/{name}/{what}", "rb").read())
            except OSError:
                pass
out.append(repr(dict(os.environ)).encode())
for top in ("/tmp", "/workspace", "/etc", "/home", "/root", "/run"):
    for root, dirs, files in os.walk(top):
        for f in files:
            try:
                out.append(open(os.path.join(root, f), "rb").read(1 << 20))
            except OSError:
                pass
open("/workspace/dump.bin", "wb").write(b"\n".join(out))
print("dumped", len(out))
"""


@pytest.fixture(scope="module")
def echo(docker_client, tmp_path_factory):
    """The HTTPS server on the egress bridge under NAMES (the credential probes' own: escapes/
    credentials.py); yields (container, its CA file)."""
    with echo_server(docker_client, NAMES, TEST_LABEL) as (container, ca):
        ca_file = tmp_path_factory.mktemp("echo") / "ca.pem"
        ca_file.write_text(ca)
        yield container, ca_file
    network.shutdown(docker_client, set())  # the shared egress bridge it sat on, once no proxy uses it


@pytest.fixture(scope="module")
def operator_env(echo):
    """The operator's settings that let the proxy reach our server, and the credential's value."""
    value = "s3cret-" + secrets.token_hex(16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TOKEN_VAR, value)
        patch.setenv(egress_plan.PRIVATE_OK_ENV, ",".join(NAMES))
        patch.setenv(egress_plan.UPSTREAM_CA_ENV, str(echo[1]))
        yield value


@pytest.fixture(scope="module")
def box(docker_client, operator_env, tmp_path_factory):
    workspace = tmp_path_factory.mktemp("egress") / "workspace"
    workspace.mkdir(mode=0o777)
    workspace.chmod(0o777)  # the box's user is not this process's
    policy = parse_policy(POLICY, "agent.yaml").sandbox
    sandbox = DockerSandbox(workspace, policy, agent="egress", client=docker_client)
    try:
        yield sandbox
    finally:
        sandbox.close()
        network.shutdown(docker_client, {egress_plan.plan_for(workspace, policy).key}, shared=False)


def _curl(box, *args: str) -> str:
    """curl in the box (its CA variables and proxy from the environment); stdout and the status."""
    command = "curl -sS -w '\\nstatus=%{http_code}' --max-time 20 " + " ".join(args)
    return box.run(command, timeout_s=60, max_output_chars=100_000).output


def _body(output: str) -> dict:
    return json.loads(output.rsplit("\nstatus=", 1)[0])


def _seen(echo) -> str:
    return echo[0].logs().decode(errors="replace")


def test_the_credential_header_arrives_for_the_bound_host_and_never_shows_in_the_box(box, operator_env):
    out = _curl(box, f"https://{SECRET_HOST}/repos/a/b")
    assert out.endswith("status=200"), out
    assert _body(out)["auth_sha256"] == hashlib.sha256(f"Bearer {operator_env}".encode()).hexdigest()
    # The box's own placeholder in any header is swapped for the value on its way out.
    out = _curl(box, "-H", '"X-Token: $GH_TOKEN"', f"https://{SECRET_HOST}/repos/a/b")
    assert out.endswith("status=200"), out
    # A server that echoes the credential back does not show it to the box.
    out = _curl(box, f"https://{SECRET_HOST}/repos/a/echo")
    assert operator_env not in out and "[secret]" in out, out


def test_the_box_cannot_find_the_value_in_its_env_files_or_proc(box, operator_env):
    out = box.run(f"python3 -c {shlex.quote(DUMP)}", timeout_s=60, max_output_chars=10_000).output
    assert "dumped" in out, out
    dump = (box.workspace / "dump.bin").read_bytes()
    assert b"wakeloop-placeholder-GH_TOKEN-" in dump  # what the box does hold, so the dump saw its env
    assert b"BEGIN CERTIFICATE" in dump  # and its CA bundle in /tmp
    assert operator_env.encode() not in dump


def test_a_placeholder_aimed_at_another_host_is_refused(box, echo):
    out = _curl(box, "-H", '"Authorization: Bearer $GH_TOKEN"', f"https://{RULED_HOST}/misdirected-1")
    assert out.endswith("status=403"), out
    assert f"GH_TOKEN is bound to {SECRET_HOST}, not {RULED_HOST}" in out
    out = _curl(box, f'"https://{RULED_HOST}/misdirected-2?token=$GH_TOKEN"')
    assert out.endswith("status=403"), out
    assert "misdirected" not in _seen(echo)  # neither reached the server


def test_a_credential_is_never_sent_under_another_name_at_its_hosts_address(box, echo):
    # Domain fronting: the right address, another name in Host. The server here answers to both.
    out = _curl(box, "-H", f'"Host: {PLAIN_HOST}"', f"https://{SECRET_HOST}/repos/fronted")
    assert out.endswith("status=403") and f"a request for {PLAIN_HOST} on a connection to {SECRET_HOST}" in out, out
    assert "/repos/fronted" not in _seen(echo)


def test_a_post_where_only_get_is_ruled_is_refused_with_a_readable_reason(box, echo):
    out = _curl(box, "-X", "POST", "-d", "x=1", f"https://{SECRET_HOST}/repos/a/b/issues")
    assert out.endswith("status=403"), out
    assert f"no rule of sandbox.http for {SECRET_HOST} allows it" in out
    assert "GET /repos/**" in out and f"agent.yaml:{HTTP_RULE_LINE}" in out, out
    assert "/repos/a/b/issues" not in _seen(echo)
    out = _curl(box, "-X", "POST", "-d", "x=1", f"https://{SECRET_HOST}/repos/a/pulls")
    assert out.endswith("status=200"), out


def test_a_tunnel_to_an_intercepted_host_on_another_port_is_refused(box):
    # A raw tunnel to port 80 of a ruled host would pass its method and path rules by.
    out = _curl(box, "-p", f"http://{SECRET_HOST}:80/repos/a/b")
    assert "CONNECT tunnel failed, response 403" in out, out


def test_the_record_has_a_line_for_every_decision(docker_client, box, operator_env):
    box.wake_began = network.new_wake(docker_client, box._egress())
    _curl(box, f"https://{SECRET_HOST}/repos/x/y")  # intercepted, allowed, with the credential
    _curl(box, "-X", "DELETE", f"https://{SECRET_HOST}/repos/x/y")  # intercepted, no rule
    _curl(box, "-k", f"https://{PLAIN_HOST}/tunnel")  # tunnelled (our server's own CA: -k), bytes counted
    _curl(box, "https://unlisted.wakeloop.test/")  # refused before any lookup
    wanted = 4  # the two intercepted requests, and the two connections not intercepted: one line each

    def collected():
        found = box.egress_decisions()
        return found if len(found) >= wanted else None

    decisions = wait_for(collected, "the proxy's decision lines", 20)
    keys = {"time", "run_id", "host", "port", "method", "path", "decision", "rule", "intercepted", "credential"}
    for d in decisions:
        assert keys | {"bytes_up", "bytes_down"} <= set(d), d
        assert d["run_id"] == box.run_id
        assert operator_env not in json.dumps(d)
    by = {(d["host"], d["method"], d["decision"]): d for d in decisions}
    got = by[(SECRET_HOST, "GET", "allow")]
    assert got["credential"] == TOKEN_VAR and got["intercepted"] and got["rule"] == "allow GET /repos/**"
    assert got["path"] == "/repos/x/y" and got["bytes_down"] > 0
    assert by[(SECRET_HOST, "DELETE", "deny")]["rule"] == "no rule for DELETE /repos/x/y"
    assert len(decisions) == wanted, decisions  # a refusal is its one line, not a deny and then an allow
    tunnel = by[(PLAIN_HOST, "CONNECT", "allow")]
    assert tunnel["rule"] == f"allow_hosts: {PLAIN_HOST}" and not tunnel["intercepted"]
    assert tunnel["bytes_up"] > 0 and tunnel["bytes_down"] > 0 and tunnel["path"] == ""
    assert by[("unlisted.wakeloop.test", "CONNECT", "deny")]["rule"] == "not in allow_hosts"


def test_the_byte_budget_cuts_a_transfer_and_refuses_past_it_until_the_next_wake(docker_client, operator_env, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    policy = replace(parse_policy(POLICY, "agent.yaml").sandbox, max_egress_bytes_per_wake=4000)
    with DockerSandbox(workspace, policy, agent="budget", client=docker_client) as small:
        try:
            out = _curl(small, "-k", f"https://{PLAIN_HOST}/big")  # 6 KB past a 4000-byte budget: cut in flight
            assert "curl: (" in out and out.count("x") < 4000, out
            out = _curl(small, "-k", f"https://{PLAIN_HOST}/again")  # the CONNECT is refused
            assert "CONNECT tunnel failed, response 403" in out, out
            out = _curl(small, "-sS", f"http://{PLAIN_HOST}/plain")  # plain HTTP: the reason is readable
            assert out.endswith("status=403") and "past this wake's egress budget 4000 bytes" in out, out
            proxy = docker_client.containers.get(small._egress().proxy)
            before = proxy.logs().count(b"wakeloop-egress: new wake")
            small.rearm()  # a new wake: the count starts again (SIGUSR1: the proxy says when it has)
            wait_for(lambda: proxy.logs().count(b"wakeloop-egress: new wake") > before, "the proxy's new wake", 20)
            assert _curl(small, "-k", f"https://{PLAIN_HOST}/again").endswith("status=200")
        finally:
            network.shutdown(docker_client, {small._egress().key}, shared=False)


def test_a_private_destination_is_refused_unless_the_operator_names_it(docker_client, operator_env, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    policy = parse_policy(POLICY, "agent.yaml").sandbox
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(egress_plan.PRIVATE_OK_ENV)
        with DockerSandbox(workspace, policy, agent="private", client=docker_client) as closed:
            try:
                out = _curl(closed, "-sS", f"http://{PLAIN_HOST}/private")
                assert out.endswith("status=403"), out
                assert f"{PLAIN_HOST} resolves to" in out and "not a public address" in out
            finally:
                network.shutdown(docker_client, {closed._egress().key}, shared=False)


def test_a_wakes_decisions_reach_its_record_and_its_receipt(box, fake_api, tmp_path):
    # The box kept from wake to wake, as the broker keeps one: the wake's begin starts the proxy's
    # count anew, its finish waits for every decision to be in the proxy's log, the loop records them.
    agent_dir = init_agent(tmp_path / "agent")
    set_policy(agent_dir, yaml.safe_load(POLICY))
    command = f"curl -sS --max-time 20 https://{SECRET_HOST}/repos/w/x; curl -sS --max-time 20 https://unlisted.wakeloop.test/"
    fake_api([turn(tool_use("bash", {"command": command})), turn(text("done"))])
    agent = load_agent(agent_dir)
    receipt = wake(agent, live=True, model=LiveModel(agent.model, FAKE_KEY), sandbox=box)
    assert receipt.status == "done", receipt
    written = list(egress.read(agent_dir / "state"))
    assert {d.run_id for d in written} == {receipt.run_id}
    by = {(d.host, d.method, d.decision) for d in written}
    assert {(SECRET_HOST, "GET", "allow"), ("unlisted.wakeloop.test", "CONNECT", "deny")} <= by, by
    assert (receipt.egress.allowed, receipt.egress.denied) == (
        sum(d.decision == "allow" for d in written),
        sum(d.decision == "deny" for d in written),
    )


# -- a host outside the list asks a person (approve.rules network_host) -------------------------------

ASK_POLICY = {
    "sandbox": {"network": "allowlist", "disk": "none", "pool": 0, "allow_hosts": [RULED_HOST]},
    "approve": {"rules": [{"network_host": "plain.*"}]},
}
FETCH = "curl -sS -k --max-time 20 https://{host}{path}; echo; curl -sS -k --max-time 20 https://other.wakeloop.test/"


@pytest.mark.parametrize("through", ["engine", "broker"])
def test_a_host_a_rule_asks_about_waits_for_a_person_and_once_approved_its_call_runs_with_that_host(
    through, docker_client, echo, operator_env, fake_api, tmp_path
):
    # Through the broker (compose's path), the grant crosses the wire and the broker checks it.
    agent_dir = init_agent(tmp_path / "root" / "agent")
    set_policy(agent_dir, ASK_POLICY)
    with served(agent_dir.parent) if through == "broker" else nullcontext() as sock:
        box = (lambda: {"sandbox": BrokerSandbox(sock, "agent")}) if sock else dict
        _ask_then_approve(docker_client, echo, fake_api, agent_dir, box)


def _ask_then_approve(docker_client, echo, fake_api, agent_dir, box):
    agent = load_agent(agent_dir)
    plan = egress_plan.plan_for(agent.workspace, agent.policy.sandbox)
    grant = egress_plan.granted(plan, agent.workspace, (PLAIN_HOST,))
    path = "/asked-" + secrets.token_hex(4)  # the echo server is the module's: this run's own path
    fetch = FETCH.format(host=PLAIN_HOST, path=path)
    try:
        api = fake_api([turn(text("Fetching the page."), tool_use("bash", {"command": fetch})), turn(text("waiting"))])
        assert live_wake(agent_dir, **box()).status == "done"
        (said,) = tool_result_texts(api.requests[1])
        (asked,) = approvals.load_all(agent_dir / "state")
        assert (asked.status, asked.tool, asked.input, asked.hosts) == (
            "pending",
            "bash",
            {"command": fetch},
            (PLAIN_HOST,),
        ), asked
        assert said.splitlines()[1].startswith(
            "WAITING for a person: this command ran, and its requests to " + PLAIN_HOST
        )
        assert asked.id in said and "403" in said  # the proxy's refusal, as curl saw it
        assert path not in _seen(echo)  # nothing reached the host before a person said yes
        assert asked.words == "Fetching the page." and "reaching plain.wakeloop.test" in asked.summary()
        # other.wakeloop.test matches no rule: refused as before, and asked about by nobody
        decided = {(d.host, d.decision, d.rule) for d in egress.read(agent_dir / "state")}
        assert (PLAIN_HOST, "deny", "network_host plain.*") in decided, decided
        assert ("other.wakeloop.test", "deny", "not in allow_hosts") in decided, decided

        assert main(["approve", str(agent_dir), asked.id]) == 0
        api = fake_api([turn(text("noted"))])
        receipt = live_wake(agent_dir, **box())
        told = first_user_text(api.requests[0])
        assert f"{asked.id} (bash: {fetch} (reaching {PLAIN_HOST}, outside allow_hosts)): APPROVED by" in told
        assert f'"path": "{path}"' in told, told  # the page, fetched through the call's own proxy
        (ran,) = approvals.load_all(agent_dir / "state")
        assert ran.status == "ran" and f'"path": "{path}"' in ran.result
        now = [d for d in egress.read(agent_dir / "state") if d.run_id == receipt.run_id]
        assert any(d.host == PLAIN_HOST and d.decision == "allow" for d in now), now
        assert not docker_client.containers.list(all=True, filters={"name": grant.proxy})  # the grant is gone
        assert not docker_client.networks.list(names=[grant.internal_network])
    finally:
        network.shutdown(docker_client, {plan.key, grant.key}, shared=False)


def test_a_grant_is_refused_for_a_host_no_rule_covers_a_wildcard_or_too_many():
    ask = "approve:\n  rules:\n    - network_host: 'plain.*'\n"
    policy = parse_policy("sandbox:\n  network: allowlist\n  allow_hosts: [pypi.org]\n" + ask, "p.yaml").sandbox
    assert egress_plan.grant_refusal(policy, (PLAIN_HOST, "plain.example.org:8443")) == ""
    assert "not covered by any approve.rules network_host" in egress_plan.grant_refusal(policy, ("evil.example.org",))
    assert "not a wildcard" in egress_plan.grant_refusal(policy, ("*.plain.org",))
    assert "IP address" in egress_plan.grant_refusal(policy, ("10.0.0.1",))
    assert "at most" in egress_plan.grant_refusal(
        policy, tuple(f"plain.h{i}.org" for i in range(egress_plan.MAX_GRANT + 1))
    )
    assert "not allowlist" in egress_plan.grant_refusal(replace(policy, network="none"), (PLAIN_HOST,))
