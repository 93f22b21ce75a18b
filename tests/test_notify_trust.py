"""What an agent folder's author and its model can make a notification do: nothing but say words.

Actors (docs/security.md, "Threat model"): the model (A) writes the text of its
messages and of the reasons it causes; whoever may write one agent folder
(D) writes agent.yaml, its notify entries and the agent's name, but not
ROOT/notify.yaml or the ceiling. Every test here sends through the real
notify code to a real receiver on 127.0.0.1 (tests/helpers/receivers.py) and judges
what arrived, or shows that nothing was sent.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import pytest
import yaml

from orchestrator.escapes.surfaces.receivers import Hook, Mailbox
from orchestrator.notify import outcomes
from orchestrator.notify.channels import DeliveryError, deliver
from orchestrator.notify.config import DEFAULT_ON, Channel
from orchestrator.notify.sender import send_due
from orchestrator.policy.agent import AgentError, load_agent
from orchestrator.policy.ceiling import load_ceiling
from orchestrator.policy.schema import PolicyError
from tests.helpers import make_agent

FAKE_KEY = "sk-ant-api03-FAKE-notify-0123456789abcdef"  # planted in a copy of the environment, never the real one
FAKE_CONSOLE = "console-FAKE-0123456789abcdef"
BAIT = "<!channel> <https://evil.example/pay|Approve budget> & <@U012> <#C0>"


pytestmark = pytest.mark.usefixtures("no_ceiling")  # conftest: none of the machine's


def message(agent, text: str) -> None:
    outcomes.on_message(agent, "r1", 3, 1, text)


def send(agent, environ: dict | None = None):
    return send_due(agent.state_dir, agent.notify, now=time.time(), environ=environ or {})


# -- ${VAR}: only what the operator allowed, never a secret ---------------------------------------


@pytest.mark.parametrize(
    "name",
    ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "WAKELOOP_CONSOLE_TOKEN", "WAKELOOP_SMTP_URL"],
)
def test_a_secret_in_a_webhook_target_is_refused_at_load_and_never_sent(tmp_path, name):
    """Before: agent.yaml's `webhook: http://…/x/${ANTHROPIC_API_KEY}` was expanded at send time
    and the key arrived in the receiver's request path."""
    with Hook() as hook:
        folder = make_agent(tmp_path, "a", notify=[{"webhook": hook.url(f"/x/${{{name}}}")}])
        with pytest.raises(AgentError, match=rf"agent.yaml:\d+: notify\[0\]\.webhook: \$\{{{name}\}} is a secret"):
            load_agent(folder)
        # The second lock: a channel that got past the load is refused at send, before any request.
        channel = Channel("webhook", hook.url(f"/x/${{{name}}}"), frozenset(DEFAULT_ON))
        with pytest.raises(DeliveryError, match="is a secret"):
            deliver(channel, outcomes.payload("a", "dead_letter", "r/d", "t", "x"), {name: FAKE_KEY})
    assert hook.attempts == 0 and not hook.paths


def test_a_variable_nobody_allowed_is_refused_and_an_allowed_one_expands(tmp_path):
    with pytest.raises(
        AgentError,
        match=r"notify\[0\]\.slack: \$\{HOME\} is not a variable notifications may "
        r"read \(SLACK_\*, WAKELOOP_NOTIFY_\*\)",
    ):
        load_agent(make_agent(tmp_path, "a", notify=[{"slack": "https://hooks.example/${HOME}"}]))
    with pytest.raises(AgentError, match=r"notify\[0\]\.email: \$\{PAGER_TO\} is not a variable"):
        load_agent(make_agent(tmp_path, "b", notify=[{"email": "${PAGER_TO}"}]))
    with Hook() as hook:
        agent = load_agent(make_agent(tmp_path, "c", notify=[{"webhook": "${WAKELOOP_NOTIFY_HOOK}/t/p9"}]))
        message(agent, "hi")
        report = send(agent, {"WAKELOOP_NOTIFY_HOOK": hook.url(""), "ANTHROPIC_API_KEY": FAKE_KEY})
    assert len(report.sent) == 1 and hook.paths == ["/t/p9"]


def test_agent_yaml_cannot_send_an_allowed_variable_to_a_host_of_its_own(tmp_path):
    """SLACK_* may be read, but from agent.yaml only as the start of the target: the operator's
    Slack URL goes to Slack, never into the path of the author's own receiver."""
    with Hook() as theirs:
        for target in (
            theirs.url("/${SLACK_WEBHOOK_URL}"),
            "${SLACK_HOST}/x/${SLACK_WEBHOOK_URL}",
            "${SLACK_HOST}@their.example/x",
            "${SLACK_HOST}.their.example",
        ):
            with pytest.raises(AgentError, match=r"notify\[0\]\.webhook: in agent.yaml one \$\{VAR\} may start"):
                load_agent(make_agent(tmp_path, f"a{len(target)}", notify=[{"webhook": target}]))
        for target in ("${SLACK_BOT_TOKEN}@their.example", "ops-${SLACK_BOT_TOKEN}@their.example"):
            with pytest.raises(AgentError, match=r"notify\[0\]\.email: in agent.yaml one \$\{VAR\} may start"):
                load_agent(make_agent(tmp_path, f"e{len(target)}", notify=[{"email": target}]))
        (tmp_path / "notify.yaml").write_text(yaml.safe_dump({"notify": [{"webhook": theirs.url("/${SLACK_TEAM}")}]}))
        agent = load_agent(make_agent(tmp_path, "b", notify=[]))  # the operator's own file may
        message(agent, "hi")
        send(agent, {"SLACK_TEAM": "T0123"})
    assert theirs.paths == ["/T0123"]


def test_the_operator_allows_more_in_notify_yaml_or_the_ceiling_but_never_a_secret(tmp_path, monkeypatch):
    (tmp_path / "notify.yaml").write_text('expand: [PAGER_TOKEN, "OPS_*"]\nnotify: []\n')
    assert load_agent(make_agent(tmp_path, "o", notify=[{"webhook": "${OPS_HOOK}"}])).notify[0].expand[-1] == "OPS_*"
    agent = load_agent(make_agent(tmp_path, "a", notify=[{"webhook": "${PAGER_TOKEN}/x"}]))
    assert agent.notify[0].expand[-2:] == ("PAGER_TOKEN", "OPS_*")
    for bad, line in (('"ANTHROPIC_*"', 2), ('"*"', 2), ("WAKELOOP_CONSOLE_TOKEN", 2), ('"A*"', 2)):
        (tmp_path / "notify.yaml").write_text(f"notify: []\nexpand: [{bad}]\n")
        with pytest.raises(AgentError, match=rf"notify.yaml:{line}: expand\[0\]: .* admits a secret"):
            load_agent(agent.dir)
    (tmp_path / "notify.yaml").unlink()
    ceiling = tmp_path / "ceiling.yaml"
    ceiling.write_text("runtimes: [runc]\nnotify_env: [OPS_*]\n")
    monkeypatch.setenv("WAKELOOP_CEILING", str(ceiling))
    with pytest.raises(AgentError, match=r"\$\{PAGER_TOKEN\} is not a variable"):
        load_agent(agent.dir)  # the ceiling allows OPS_* only
    ceiling.write_text("runtimes: [runc]\nnotify_env: [OPS_*, PAGER_TOKEN]\n")
    assert load_agent(agent.dir).notify[0].expand[-2:] == ("OPS_*", "PAGER_TOKEN")
    ceiling.write_text("runtimes: [runc]\nnotify_env:\n  - OPS_*\n  - ANTHROPIC_API_KEY\n")
    with pytest.raises(PolicyError, match=r"ceiling.yaml:4: notify_env: 'ANTHROPIC_API_KEY' admits a secret"):
        load_ceiling(ceiling)
    with pytest.raises(AgentError, match=r"ceiling.yaml:4: notify_env"):
        load_agent(agent.dir)


# -- command: the operator's alone -----------------------------------------------------------------


def test_a_command_channel_in_agent_yaml_is_refused_unless_the_ceiling_allows_it(tmp_path, monkeypatch):
    out = tmp_path / "ran"
    page = [sys.executable, "-c", f"open({str(out)!r}, 'w').write('ran')"]
    folder = make_agent(tmp_path, "a", notify=[{"command": page}])
    with pytest.raises(AgentError) as refused:
        load_agent(folder)
    assert str(refused.value).count("\n") == 0 and "agent.yaml:" in str(refused.value)
    assert "notify[0].command: a command runs a program as the orchestrator: only ROOT/notify.yaml" in str(
        refused.value
    )
    ceiling = tmp_path / "ceiling.yaml"
    ceiling.write_text("notify_commands: true\n")
    monkeypatch.setenv("WAKELOOP_CEILING", str(ceiling))
    agent = load_agent(folder)
    message(agent, "hi")
    assert len(send(agent).sent) == 1 and out.read_text() == "ran"
    ceiling.write_text("notify_commands: yes please\n")
    with pytest.raises(AgentError, match=r"ceiling.yaml:1: notify_commands: expected true or false"):
        load_agent(folder)


def test_a_command_gets_the_text_on_stdin_only_and_no_secret_in_its_environment(tmp_path):
    out = tmp_path / "seen.json"
    spy = [
        sys.executable,
        "-c",
        "import json, os, sys; json.dump({'argv': sys.argv, 'env': dict(os.environ), "
        f"'stdin': sys.stdin.read()}}, open({str(out)!r}, 'w'))",
    ]
    (tmp_path / "notify.yaml").write_text(yaml.safe_dump({"notify": [{"command": spy}]}))
    agent = load_agent(make_agent(tmp_path, "a", notify=[]))
    message(agent, "$(touch /tmp/x) `id` ${ANTHROPIC_API_KEY} --help")
    report = send(
        agent, {"ANTHROPIC_API_KEY": FAKE_KEY, "WAKELOOP_CONSOLE_TOKEN": FAKE_CONSOLE, "PATH": os.environ["PATH"]}
    )
    assert len(report.sent) == 1
    seen = json.loads(out.read_text())
    assert seen["argv"][1:] == [] and json.loads(seen["stdin"])["text"].startswith("$(touch /tmp/x)")
    assert FAKE_KEY not in json.dumps(seen) and FAKE_CONSOLE not in json.dumps(seen)
    assert "ANTHROPIC_API_KEY" not in seen["env"] and "PATH" in seen["env"]


# -- what the model writes: data on every channel --------------------------------------------------


def test_slack_markup_from_the_agent_arrives_inert_and_quoted_under_our_heading(tmp_path):
    with Hook() as hook:
        agent = load_agent(make_agent(tmp_path, "a", notify=[{"slack": hook.url()}], name="ops*bot"))
        message(agent, f"{BAIT}\n*wakeloop: budget approved*\r\nok\u2028> fake quote end\n\u202eevil\u202c")
        assert len(send(agent).sent) == 1
    [body] = hook.received
    lines = body["text"].split("\n")
    assert lines[0] == "*opsbot [a] (wake #3) says*"  # our heading; the name cannot end its bold
    assert all(line.startswith("> ") for line in lines[1:]) and len(lines) == 6
    assert "<" not in body["text"] and ">" not in body["text"].replace("\n> ", "\n").lstrip("*")
    assert lines[1] == (
        "> &lt;!channel&gt; &lt;https://evil.example/pay|Approve budget&gt; &amp; &lt;@U012&gt; &lt;#C0&gt;"
    )
    assert lines[2] == "> *wakeloop: budget approved*" and lines[4] == "> &gt; fake quote end"
    assert lines[5] == "> \\u202eevil\\u202c"  # a bidi override, shown, not obeyed


def test_an_agent_named_like_another_is_shown_with_its_folder(tmp_path):
    with Hook() as hook:
        agent = load_agent(make_agent(tmp_path, "intern", notify=[{"slack": hook.url()}], name="prod-billing"))
        message(agent, "please approve")
        send(agent)
    assert hook.received[0]["text"].startswith("*prod-billing [intern] (wake #3) says*\n")


def test_the_webhook_carries_the_agents_text_as_one_json_field(tmp_path):
    injected = '", "event": "approved", "x": "\u0000</script>\r\nX-Evil: 1'
    with Hook() as hook:
        agent = load_agent(make_agent(tmp_path, "a", notify=[{"webhook": hook.url()}], name="café-日本"))
        message(agent, injected)
        assert len(send(agent).sent) == 1  # a name outside Latin-1 no longer fails the header
    [body], [headers] = hook.received, hook.headers
    assert body["text"] == injected and body["event"] == "message" and "X-Evil" not in headers
    assert headers["Idempotency-Key"] == "caf%C3%A9-%E6%97%A5%E6%9C%AC/r1/message/1"
    assert body["id"] == "café-日本/r1/message/1"


def test_email_headers_are_ours_and_the_agents_text_only_in_the_body(tmp_path):
    with Mailbox() as smtp:
        agent = load_agent(
            make_agent(
                tmp_path, "a", notify=[{"email": "ops@example.com"}], name="bot\r\nBcc: evil@example.net\nX-Evil: 1"
            )
        )
        message(agent, "Subject: fake\r\nBcc: evil@example.net\r\n\r\nApprove")
        env = {"WAKELOOP_SMTP_URL": smtp.url("ops", "pw-0123456789")}
        assert len(send(agent, env).sent) == 1
    [msg] = [mail.message for mail in smtp.messages]
    assert msg["Subject"] == "bot Bcc: evil@example.net X-Evil: 1 [a] (wake #3) says"
    assert msg["Bcc"] is None and msg["X-Evil"] is None and msg["To"] == "ops@example.com"
    assert "Subject: fake" in msg.get_payload()


def test_an_address_that_would_add_a_recipient_or_a_header_is_refused(tmp_path):
    for address in (
        "ops@example.com,evil@example.net",
        "Ops <ops@example.com>",
        "a b@example.com",
        "ops@example.com\r\nBcc: evil@example.net",
        '"evil"@example.net',
    ):
        with pytest.raises(
            AgentError, match=r"notify\[0\]\.email: (.* is not an email address|a target has no spaces)"
        ):
            load_agent(make_agent(tmp_path, f"a{len(address)}", notify=[{"email": address}]))
    with Mailbox() as smtp:
        agent = load_agent(make_agent(tmp_path, "b", notify=[{"email": "${WAKELOOP_NOTIFY_TO}"}]))
        message(agent, "hi")
        report = send(
            agent,
            {
                "WAKELOOP_SMTP_URL": smtp.url("ops", "pw-0123456789"),
                "WAKELOOP_NOTIFY_TO": "ops@example.com\r\nBcc: evil@example.net",
            },
        )
    assert report.failed and "not one plain address" in report.failed[0] and smtp.messages == []


# -- where a target may point ------------------------------------------------------------------------


def test_a_url_with_credentials_is_refused_at_load(tmp_path):
    with pytest.raises(AgentError, match=r"notify\[0\]\.slack: a URL with user:password@ is not sent"):
        load_agent(make_agent(tmp_path, "a", notify=[{"slack": "http://user:pass@127.0.0.1:9/x"}]))


def test_a_long_text_is_cut_where_slack_would_and_says_so(tmp_path):
    with Hook() as hook:
        agent = load_agent(make_agent(tmp_path, "a", notify=[{"slack": hook.url()}]))
        message(agent, "&" * 2**20)  # 1 MiB, each char 5 once escaped
        assert len(send(agent).sent) == 1
    text = hook.received[0]["text"]
    assert len(text) < 40_000 and "(cut: " in text.splitlines()[-1]


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "gopher://127.0.0.1:70/_x",
        "ftp://127.0.0.1/x",
        "http+unix://%2Frun%2Fdocker.sock/x",
        "/run/wakeloop/broker.sock",
    ],
)
def test_a_target_that_is_not_http_is_refused_at_load(tmp_path, url):
    with pytest.raises(AgentError, match=r"notify\[0\]\.webhook: expected an http\(s\) URL"):
        load_agent(make_agent(tmp_path, "a", notify=[{"webhook": url}]))


def test_a_variable_that_expands_to_another_scheme_is_refused_at_send(tmp_path):
    agent = load_agent(make_agent(tmp_path, "a", notify=[{"slack": "${SLACK_URL}"}]))
    message(agent, "hi")
    report = send(agent, {"SLACK_URL": f"file://{tmp_path}/agent.yaml"})
    assert report.failed and "not an http(s) URL" in report.failed[0]


@pytest.mark.parametrize("url", ["http:///hook", "https://:443/hook"])
def test_a_url_with_no_host_is_refused_at_load(tmp_path, url):
    with pytest.raises(AgentError, match=r"notify\[0\]\.webhook: the URL names no host"):
        load_agent(make_agent(tmp_path, "a", notify=[{"webhook": url}]))


@pytest.mark.parametrize("url", ["http:///hook", "https://:443/hook"])
def test_a_url_with_no_host_fails_in_one_line_that_says_so(tmp_path, url):
    """Before: the connection was opened to host None, and the attempt failed as "AttributeError:
    'NoneType' object has no attribute 'rfind'" or "TypeError: expected string or bytes-like
    object, got 'NoneType'" (mypy's strict flags found it)."""
    agent = load_agent(make_agent(tmp_path, "a", notify=[{"slack": "${SLACK_URL}"}]))
    message(agent, "hi")
    report = send(agent, {"SLACK_URL": url})
    assert report.failed and "the target URL names no host" in report.failed[0]


def test_a_redirect_is_not_followed(tmp_path):
    with Hook() as elsewhere, Hook(status=302) as hook:
        hook.location = elsewhere.url("/stolen")
        agent = load_agent(make_agent(tmp_path, "a", notify=[{"webhook": hook.url()}]))
        message(agent, "hi")
        report = send(agent)
    assert report.failed and "HTTP 302: a redirect, not followed" in report.failed[0]
    assert hook.attempts == 1 and elsewhere.attempts == 0


def test_a_receiver_that_trickles_its_answer_cannot_hold_the_sender(tmp_path, monkeypatch):
    """Before: the 10 s timeout was per read, so an answer sent a byte at a time held serve's one
    sender thread (every agent's notifications) as long as the receiver liked. Now one POST has a
    deadline in all (here 0.5 s instead of 20 s)."""
    from orchestrator.notify import channels

    monkeypatch.setattr(channels, "HTTP_DEADLINE_S", 0.5)
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle():
        conn, _ = server.accept()
        conn.recv(65536)
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
            if stop.is_set():
                break
            try:
                conn.send(bytes([byte]))
            except OSError:
                break
            stop.wait(0.05)  # the attacker's pace: well inside the 10 s per-read timeout
        conn.close()

    thread = threading.Thread(target=trickle)
    thread.start()
    try:
        agent = load_agent(
            make_agent(tmp_path, "a", notify=[{"webhook": f"http://127.0.0.1:{server.getsockname()[1]}/x"}])
        )
        message(agent, "hi")
        started = time.monotonic()
        report = send(agent)
        took = time.monotonic() - started
    finally:
        stop.set()
        thread.join(10)
        server.close()
    assert report.failed and "no whole answer within 0.5s" in report.failed[0]
    assert took < 5


def test_a_stalled_receiver_holds_its_own_agent_only(tmp_path, monkeypatch):
    """serve's sender: one agent's receiver that never finishes answering does not keep another
    agent's notification from going out (before: one thread, agent after agent)."""
    from orchestrator.notify import channels
    from orchestrator.notify.sender import SenderThread

    monkeypatch.setattr(channels, "HTTP_DEADLINE_S", 30.0)
    server = socket.create_server(("127.0.0.1", 0))
    stalled, stop = threading.Event(), threading.Event()

    def stall():
        conn, _ = server.accept()
        conn.recv(65536)
        stalled.set()
        stop.wait(30)  # answers nothing until the test is done
        conn.close()

    threading.Thread(target=stall, daemon=True).start()
    arrived = threading.Event()
    with Hook() as hook:
        original = hook.server.RequestHandlerClass.do_POST

        def noted(handler):
            original(handler)
            arrived.set()

        hook.server.RequestHandlerClass.do_POST = noted
        slow = load_agent(
            make_agent(tmp_path, "slow", notify=[{"webhook": f"http://127.0.0.1:{server.getsockname()[1]}/x"}])
        )
        fast = load_agent(make_agent(tmp_path, "fast", notify=[{"webhook": hook.url()}]))
        message(slow, "one")
        message(fast, "two")
        done = threading.Event()
        sender = SenderThread(
            lambda: [(slow.state_dir, slow.notify), (fast.state_dir, fast.notify)], lambda line: None, done, poll_s=0.05
        )
        sender.start()
        try:
            assert stalled.wait(10), "the slow agent's receiver never got its POST"
            assert arrived.wait(10), "the fast agent's notification waited behind the stalled receiver"
        finally:
            stop.set()
            done.set()
            sender.join(40)
            server.close()
    assert [b["text"] for b in hook.received] == ["two"] and not sender.is_alive()


# -- ROOT/notify.yaml is read as untrusted input ------------------------------------------------------


def test_root_notify_yaml_is_read_safely(tmp_path):
    folder = make_agent(tmp_path, "a", notify=[])
    root_file = tmp_path / "notify.yaml"
    os.mkfifo(root_file)
    with pytest.raises(AgentError, match=r"notify.yaml: cannot read: a FIFO, not a regular file"):
        load_agent(folder)  # would block forever on a FIFO before
    root_file.unlink()
    root_file.write_text("a: &a [x, x]\nb: &b [*a, *a]\nnotify: *b\n")
    with pytest.raises(AgentError, match=r"aliases"):
        load_agent(folder)
    root_file.write_text("# " + "x" * (2 * 2**20) + "\n")
    with pytest.raises(AgentError, match=r"notify.yaml: cannot read: .* bytes, over 1,048,576"):
        load_agent(folder)


def test_an_agent_yaml_cannot_ask_for_a_flood_or_forever(tmp_path):
    many = [{"webhook": f"https://h{n}.example/x"} for n in range(17)]
    with pytest.raises(AgentError, match=r"agent.yaml:\d+: notify\[16\]: 17 channels; at most 16"):
        load_agent(make_agent(tmp_path, "a", notify=many))
    with pytest.raises(AgentError, match=r"notify\[0\]\.give_up_after: '3650d' is over the most allowed, 604800s"):
        load_agent(make_agent(tmp_path, "b", notify=[{"webhook": "https://h.example/x", "give_up_after": "3650d"}]))
    with pytest.raises(AgentError, match=r"notify\[0\]\.webhook: a target has no spaces, line breaks or control"):
        load_agent(make_agent(tmp_path, "c", notify=[{"webhook": "http://127.0.0.1:9/x HTTP/1.1\r\nX-Evil: 1"}]))
