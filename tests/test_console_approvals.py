"""Approval links against the real console over HTTP: a link decides one approval, once, signed in,
past CSRF and Origin; a replayed, altered, borrowed, expired or foreign-key link decides nothing.

The approvals are filed with records/approvals.py directly (a wake that files one through the real
SDK is in test_approvals.py); everything after is the console's real routes on a real socket.
"""

from __future__ import annotations

import os
import stat
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.console.app import Console, start
from orchestrator.console.auth import Access
from orchestrator.policy.agent import init_agent
from orchestrator.records import approval_links, approvals
from orchestrator.records.approval_links import Link, LinkError, sign, verify
from tests.helpers.console import TOKEN, Client

CSRF = Access(TOKEN, True).csrf


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "agents"
    for name in ("one", "two"):
        init_agent(root / name)
    return root


@pytest.fixture
def console(root):
    listening = start(Console(root, Access(TOKEN, True)), "127.0.0.1", 0)
    yield Client(listening.url).sign_in()
    listening.stop()


def ask(root: Path, agent: str = "one", command: str = "git push origin main", **kwargs) -> approvals.Approval:
    return approvals.ask(
        root / agent / "state",
        "bash",
        {"command": command},
        "tool: bash, match 'git push*'",
        "Pushing.",
        "run1",
        3600,
        **kwargs,
    ).approval


def path_of(root: Path, approval: approvals.Approval, action: str = "approve", agent: str = "one") -> str:
    url = approval_links.links_for(root, agent, approval, "http://x")[action]
    return url[len("http://x") :]


def status_of(root: Path, approval: approvals.Approval, agent: str = "one") -> str:
    return approvals.load(root / agent / "state", approval.id).status


def test_a_link_decides_once_and_a_replay_or_the_other_action_then_changes_nothing(root, console):
    a = ask(root)
    approve, deny = path_of(root, a, "approve"), path_of(root, a, "deny")
    status, _, html = console.get(approve)
    assert status == 200 and "git push origin main" in html and 'name="csrf"' in html
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert (
        Client(console.url)._open(
            urllib.request.Request(console.url + approve.lstrip("/"), method="HEAD", headers=bearer)
        )[0]
        == 200
    )
    assert status_of(root, a) == "pending"  # a GET or a HEAD decides nothing
    assert console.post(approve, {"csrf": CSRF})[0] == 303
    assert status_of(root, a) == "approved"
    status, _, html = console.post(approve, {"csrf": CSRF})  # replayed
    assert status == 410 and "approved already" in html
    assert console.post(deny, {"csrf": CSRF, "reason": "changed my mind"})[0] == 410
    assert console.get(approve)[0] == 410
    assert status_of(root, a) == "approved"
    stat_ = (root / approval_links.KEY_FILE).stat()
    assert stat.S_IMODE(stat_.st_mode) == 0o600 and stat_.st_uid == os.geteuid()


def test_a_deny_link_carries_the_reason(root, console):
    a = ask(root)
    assert console.post(path_of(root, a, "deny"), {"csrf": CSRF, "reason": "not on a Friday"})[0] == 303
    done = approvals.load(root / "one" / "state", a.id)
    assert (done.status, done.reason, done.decided_by) == ("denied", "not on a Friday", "console")


def test_a_forged_altered_borrowed_or_expired_link_is_refused(root, console):
    a, b = ask(root), ask(root, command="git push --force")
    key = approval_links.load_key(root)
    good = path_of(root, a).rsplit("/", 1)[1]
    body, mac = good.split(".")
    expires = int(time.time()) + 3600
    refused = {
        "altered MAC": f"{body}.{mac[:-2]}{'AA' if mac[-2:] != 'AA' else 'BB'}",
        "another key": sign(b"k" * 32, Link("one", a.id, "approve", expires, a.nonce)),
        "b's id, a's nonce": sign(key, Link("one", b.id, "approve", expires, a.nonce)),
        "another agent": sign(key, Link("two", a.id, "approve", expires, a.nonce)),
        "expired": sign(key, Link("one", a.id, "approve", int(time.time()) - 1, a.nonce)),
        "no action": sign(key, Link("one", a.id, "run", expires, a.nonce)),
        "not a token": "x" * 40,
    }
    for what, token in refused.items():
        get, _, _ = console.get(f"/approvals/{token}")
        post, _, html = console.post(f"/approvals/{token}", {"csrf": CSRF})
        assert get in (403, 410) and post in (403, 410), what
    assert status_of(root, a) == status_of(root, b) == "pending"
    with pytest.raises(LinkError):
        verify(key, refused["expired"])


def test_a_link_posts_only_signed_in_with_the_forms_csrf_and_from_this_console(root, tmp_path):
    a = ask(root)
    path = path_of(root, a)
    listening = start(Console(root, Access(TOKEN, True)), "127.0.0.1", 0)
    try:
        stranger = Client(listening.url)
        assert stranger.get(path)[0] == 303 and stranger.post(path, {"csrf": CSRF})[0] == 403
        client = Client(listening.url).sign_in()
        assert client.post(path, {})[0] == 403
        assert client.post(path, {"csrf": CSRF}, Origin="http://evil.example")[0] == 403
        assert client.post(path, {"csrf": CSRF}, **{"Sec-Fetch-Site": "cross-site"})[0] == 403
        assert status_of(root, a) == "pending"
    finally:
        listening.stop()


def test_an_approval_that_lapsed_is_not_decided_by_its_link(root, console):
    a = ask(root, now=approvals.now_utc() - timedelta(hours=2))
    key = approval_links.load_key(root)
    token = sign(key, Link("one", a.id, "approve", int(time.time()) + 3600, a.nonce))  # a link still in date
    status, _, html = console.post(f"/approvals/{token}", {"csrf": CSRF})
    assert status == 410 and "expired" in html and status_of(root, a) == "pending"  # the next wake marks it


def test_the_fleet_page_shows_what_waits_with_links_that_work(root, console):
    a = ask(root, agent="two")
    status, _, html = console.get("/")
    assert status == 200 and f'id="approval-{a.id}"' in html and "git push origin main" in html
    approve = html.split(f'id="approval-{a.id}"')[1].split('class="approve"')[0].rsplit('href="', 1)[1].split('"')[0]
    assert console.post(approve, {"csrf": CSRF})[0] == 303
    assert status_of(root, a, "two") == "approved" and f'id="approval-{a.id}"' not in console.get("/")[2]


def test_a_key_file_that_is_not_ours_is_refused_in_one_line(tmp_path):
    root = tmp_path
    (root / approval_links.KEY_FILE).write_bytes(b"k" * 32)
    os.chmod(root / approval_links.KEY_FILE, 0o644)
    with pytest.raises(LinkError, match="readable or writable by others"):
        approval_links.load_key(root)
    (root / approval_links.KEY_FILE).unlink()
    (root / approval_links.KEY_FILE).symlink_to("/etc/passwd")
    with pytest.raises(LinkError, match="symbolic link"):
        approval_links.load_key(root)


def test_the_approval_notification_carries_its_links_intact_on_every_channel_and_the_words_as_data(root, monkeypatch):
    """Slack escapes the agent's words (a fake link among them arrives as text), yet our links,
    first in the text, arrive whole; email carries them in the body; the webhook as fields too."""
    import yaml

    from orchestrator.notify import outcomes, queue
    from orchestrator.notify.channels import _message, slack_text
    from orchestrator.policy.agent import load_agent

    config = root / "one" / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**data, "notify": [{"webhook": "https://hooks.example/h", "on": ["approval"]}]}))
    monkeypatch.setenv(approval_links.CONSOLE_URL_ENV, "https://console.example/")
    agent = load_agent(root / "one")
    a = approvals.ask(
        agent.state_dir,
        "bash",
        {"command": "git push <!channel>"},
        "tool: bash, match 'git push*'",
        "Approve: <https://evil.example|here>",
        "run1",
        3600,
    ).approval
    outcomes.on_approval(agent, a)
    (item,) = queue.pending(agent.state_dir)
    note = item.payload
    approve, deny = note["data"]["approve_url"], note["data"]["deny_url"]
    assert approve.startswith("https://console.example/approvals/") and approve != deny
    assert note["text"].index(approve) < note["text"].index("<https://evil.example|here>")  # ours first
    slack = slack_text(note)
    assert approve in slack and deny in slack
    assert "<https://evil.example|here>" not in slack and "&lt;https://evil.example|here&gt;" in slack
    assert "<!channel>" not in slack
    assert approve in _message("ops@example.com", "w@example.com", note).get_content()
    assert approval_links.verify(approval_links.load_key(root), approve.rsplit("/", 1)[1]).approval_id == a.id
