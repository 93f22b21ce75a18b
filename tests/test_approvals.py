"""Approvals out of band, end to end: the real anthropic SDK against orchestrator/testing/fakeapi.py, real
containers, the real CLI, the real console over HTTP, a real webhook receiver.

A call that matches the policy's approve: rules is not run and the model is told it waits; a
person decides (CLI or a console link) while no wake runs; the next wake runs an approved call
exactly as asked and tells the model who approved it and what it returned, or why not.
"""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.policy.load import parse_policy
from orchestrator.policy.schema import PolicyError
from orchestrator.records import approvals
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.testing.fakeapi import text, tool_use, turn
from orchestrator.wake.loop import wake
from tests.helpers import live_wake, support
from tests.helpers.recorded import first_user_text, tool_result_texts

ALLOWLIST = "sandbox:\n  network: allowlist\n  allow_hosts: [pypi.org]\n"  # what a network_host rule needs
PUSH = "echo pushed > pushed.txt; echo push-output"  # stands in for `git push`: it leaves a trace
APPROVE = {
    "approve": {
        "rules": [{"tool": "bash", "match": ["echo pushed*"]}, {"tool": "write_file", "paths": ["deploy/**"]}],
        "expires": "24h",
    }
}


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """`wakeloop ARGS` in this process (the same main() as the command line): (exit, stdout, stderr)."""
    from orchestrator.cli.wakeloop import main

    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def kinds(agent_dir: Path) -> list[str]:
    return [e.type for e in read_events(agent_dir / "state" / EVENTS_FILE)]


def ask_once(agent_dir: Path, fake_api, words: str = "Pushing the release now.") -> approvals.Approval:
    """One wake whose model asks for the held call; the approval it filed."""
    api = fake_api([turn(text(words), tool_use("bash", {"command": PUSH})), turn(text("ok, other work then"))])
    receipt = live_wake(agent_dir)
    assert receipt.status == "done"
    system = api.requests[0].body["system"][0]["text"]
    assert "Some calls wait for a person's approval (bash echo pushed*; write_file deploy/**)" in system
    (waiting,) = tool_result_texts(api.requests[1])
    (approval,) = approvals.load_all(agent_dir / "state")
    assert waiting.startswith("WAITING for a person") and approval.id in waiting
    return approval


# -- the policy --------------------------------------------------------------------------------------


def test_approve_rules_are_checked_naming_file_line_and_key():
    for yaml_text, says in (
        (
            "approve:\n  rules:\n    - tool: bash\n      match: []\n",
            "p.yaml:4: approve.rules[0].match: expected `match:`",
        ),
        (
            "approve:\n  rules:\n    - tool: curl\n      match: [x]\n",
            "p.yaml:3: approve.rules[0].tool: expected tool: bash",
        ),
        (
            "approve:\n  rules:\n    - network_host: '*'\n",
            "p.yaml:3: approve.rules[0].network_host: only used with sandbox.network: allowlist (network is none)",
        ),
        (
            f"{ALLOWLIST}approve:\n  rules:\n    - network_host: 'API.example.com:443'\n",
            "p.yaml:6: approve.rules[0].network_host: expected a glob over host names, lower-case, no port",
        ),
        (
            f"{ALLOWLIST}approve:\n  rules:\n    - network_host: '*'\n      tool: bash\n",
            "p.yaml:7: approve.rules[0].tool: a network_host rule takes no other key",
        ),
        ("approve:\n  expires: soon\n", "p.yaml:2: approve.expires: expected a duration"),
        ("approve:\n  expires: 30s\n", "p.yaml:2: approve.expires: '30s' is under a minute"),
        ("approve:\n  rules:\n    - tool: write_file\n      paths: ['../x']\n", "p.yaml:4: approve.rules[0].paths[0]"),
    ):
        with pytest.raises(PolicyError) as caught:
            parse_policy(yaml_text, "p.yaml")
        assert str(caught.value).startswith(says), str(caught.value)
    approve = parse_policy(
        "approve:\n  rules:\n    - tool: bash\n      match: ['git push*']\n  expires: 2d\n", "p.yaml"
    ).approve
    assert approve.expires == 2 * 86400
    assert approve.asks("bash", {"command": "  git push origin main"}) == "tool: bash, match 'git push*'"
    assert approve.asks("bash", {"command": "git status"}) is None
    assert approve.asks("write_file", {"path": "git push"}) is None
    policy = parse_policy(f"{ALLOWLIST}approve:\n  rules:\n    - network_host: '*.example.com'\n", "p.yaml")
    assert policy.sandbox.ask_hosts == ("*.example.com",)  # the proxy's and the broker's copy
    assert policy.approve.asks("bash", {"command": "curl https://api.example.com"}) is None  # the proxy asks
    with pytest.raises(PolicyError, match="unknown key"):
        parse_policy("sandbox:\n  ask_hosts: ['*']\n", "p.yaml")  # derived, never set by hand


# -- a call waits; the decision reaches the agent -----------------------------------------------------


@pytest.mark.docker
def test_a_matching_call_waits_and_an_approval_by_cli_runs_it_at_the_next_wake(agent_dir, fake_api, disk_view, capsys):
    support.set_policy(agent_dir, APPROVE)
    approval = ask_once(agent_dir, fake_api)
    assert not (disk_view(agent_dir) / "pushed.txt").exists()  # not run
    assert approval.status == "pending" and approval.input == {"command": PUSH}
    assert approval.words == "Pushing the release now." and approval.rule == "tool: bash, match 'echo pushed*'"
    assert "approval_asked" in kinds(agent_dir)

    code, out, _ = cli(capsys, "approvals", str(agent_dir.parent), "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [approval.id]
    code, out, _ = cli(capsys, "approve", str(agent_dir), approval.id)
    assert code == 0 and f"{approval.id} approved" in out
    code, _, err = cli(capsys, "approve", str(agent_dir), approval.id)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is approved already" in err
    assert not (disk_view(agent_dir) / "pushed.txt").exists()  # a person's yes runs nothing yet

    api = fake_api([turn(text("noted"))])
    live_wake(agent_dir)
    told = first_user_text(api.requests[0])
    assert f"{approval.id} (bash: {PUSH}): APPROVED by" in told and "(wakeloop CLI)" in told
    assert "push-output" in told  # what it returned
    assert (disk_view(agent_dir) / "pushed.txt").read_text() == "pushed\n"  # ran exactly as asked
    (ran,) = approvals.load_all(agent_dir / "state")
    assert (ran.status, ran.reported) == ("ran", True) and "push-output" in ran.result
    assert {"approval_approved", "approval_ran", "approval_reported"} <= set(kinds(agent_dir))
    code, out, _ = cli(capsys, "transcript", str(agent_dir), "--json")
    assert any(json.loads(line).get("type") == "approval" for line in out.splitlines())
    code, out, _ = cli(capsys, "transcript", str(agent_dir))
    assert code == 0 and f"approval {approval.id} ran by " in out and "push-output" in out

    api = fake_api([turn(text("nothing new"))])
    live_wake(agent_dir)
    assert "Approvals decided" not in first_user_text(api.requests[0])  # told once, run once


@pytest.mark.docker
def test_a_denial_and_an_expiry_reach_the_model_and_neither_runs(agent_dir, fake_api, disk_view, capsys):
    support.set_policy(agent_dir, APPROVE)
    denied = ask_once(agent_dir, fake_api)
    sd = agent_dir / "state"
    lapsed = approvals.ask(
        sd,
        "write_file",
        {"path": "deploy/x.yaml", "content": "v: 2\n"},
        "tool: write_file, paths 'deploy/**'",
        "",
        "earlier",
        3600,
        now=approvals.now_utc() - timedelta(hours=2),
    ).approval
    assert cli(capsys, "deny", str(agent_dir), denied.id, "--reason", "not on a Friday")[0] == 0
    code, _, err = cli(capsys, "approve", str(agent_dir), lapsed.id)
    assert code == 2 and f"approval {lapsed.id} is expired already" in err
    assert wake(load_agent(agent_dir), live=False).status == "done"  # a dry run: no model to tell
    assert not approvals.load(sd, denied.id).reported

    api = fake_api([turn(text("understood"))])
    live_wake(agent_dir)
    told = first_user_text(api.requests[0])
    assert f"{denied.id} (bash: {PUSH}): DENIED by" in told and "Reason: not on a Friday" in told
    assert f"{lapsed.id} (write_file deploy/x.yaml (5 chars)): EXPIRED unanswered" in told
    assert not (disk_view(agent_dir) / "pushed.txt").exists()
    assert not (disk_view(agent_dir) / "deploy").exists()
    assert {"approval_denied", "approval_expired"} <= set(kinds(agent_dir))


@pytest.mark.docker
def test_a_policy_that_no_longer_offers_the_tool_voids_the_approval_and_says_so(agent_dir, fake_api, disk_view, capsys):
    support.set_policy(agent_dir, APPROVE)
    approval = ask_once(agent_dir, fake_api)
    assert cli(capsys, "approve", str(agent_dir), approval.id)[0] == 0
    support.set_policy(agent_dir, {**APPROVE, "tools": {"bash": {"enabled": False}}})
    api = fake_api([turn(text("fine"))])
    live_wake(agent_dir)
    assert (
        f"{approval.id} (bash: {PUSH}): VOID, not run: this agent's policy no longer offers the bash tool"
        in first_user_text(api.requests[0])
    )
    assert not (disk_view(agent_dir) / "pushed.txt").exists()
    assert "approval_void" in kinds(agent_dir)


@pytest.mark.docker
def test_the_same_call_asked_twice_waits_under_one_id_and_other_calls_still_run(agent_dir, fake_api, disk_view):
    support.set_policy(agent_dir, APPROVE)
    api = fake_api(
        [
            turn(
                tool_use("bash", {"command": PUSH}),
                tool_use("bash", {"command": PUSH}),
                tool_use("bash", {"command": "echo other > other.txt"}),
            ),
            turn(text("done")),
        ]
    )
    live_wake(agent_dir)
    first, second, other = tool_result_texts(api.requests[1])
    assert first.startswith("WAITING") and second.startswith("WAITING") and "same id" in second
    assert re.search(r"a-[0-9a-f]{8}", first).group() == re.search(r"a-[0-9a-f]{8}", second).group()
    assert len(approvals.load_all(agent_dir / "state")) == 1
    assert (disk_view(agent_dir) / "other.txt").read_text() == "other\n"


# -- the person is asked where they are --------------------------------------------------------------


@pytest.mark.docker
def test_the_notification_reaches_a_receiver_and_its_link_approves_in_chromium_and_the_next_wake_runs_it(
    tmp_path, fake_api, disk_view, monkeypatch
):
    """A real webhook receiver gets the `approval` notification; Debian's headless Chromium (as
    tests/test_console_browser.py drives it) opens its link signed out, goes through the sign-in
    form and back to the confirm page, and its button approves; the next wake runs the call."""
    from orchestrator.console.app import Console, start
    from orchestrator.console.auth import Access
    from orchestrator.escapes.surfaces.receivers import Hook
    from orchestrator.notify.sender import send_due
    from tests.helpers.browser import arrived, by_css, chromium
    from tests.helpers.console import TOKEN

    root = tmp_path / "agents"
    agent_dir = init_agent(root / "ops")
    with Hook() as hook:
        support.set_policy(agent_dir, APPROVE, notify=[{"webhook": hook.url("/h"), "on": ["approval"]}])
        listening = start(Console(root, Access(TOKEN, True)), "127.0.0.1", 0)
        driver = None
        try:
            monkeypatch.setenv("WAKELOOP_CONSOLE_URL", listening.url)
            approval = ask_once(agent_dir, fake_api, words="Release 1.2 is tagged; pushing it.")
            agent = load_agent(agent_dir)
            assert len(send_due(agent.state_dir, agent.notify, now=time.time()).sent) == 1
            (note,) = hook.received
            assert note["event"] == "approval" and note["agent"] == "ops" and note["data"]["input"] == {"command": PUSH}
            assert note["data"]["words"] == "Release 1.2 is tagged; pushing it." and PUSH in note["text"]
            assert note["data"]["approve_url"] in note["text"] and note["data"]["deny_url"] in note["text"]
            assert note["data"]["approve_url"].startswith(f"{listening.url}approvals/")
            driver = chromium(tmp_path / "chromium")
            driver.get(note["data"]["approve_url"])  # a person clicks, signed out
            arrived(driver, "#token").send_keys(TOKEN)
            by_css(driver, "#sign-in")[0].click()
            assert arrived(driver, "#call").text == PUSH  # back on the link's page, signed in
            assert "pushing it." in by_css(driver, "#words")[0].text
            assert approvals.load(agent_dir / "state", approval.id).status == "pending"
            by_css(driver, "#decide")[0].click()
            assert arrived(driver, "#said").text.startswith("approved: the call runs")
            assert driver.current_url.endswith("/?said=approved")
            assert (agent_dir / "state" / "run-now").exists()  # and a wake asked for now
            errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
            assert not errors, errors
            driver.get(note["data"]["approve_url"])  # the same link, again
            assert "a link decides once" in arrived(driver, "#error").text
        finally:
            if driver is not None:
                driver.quit()
            listening.stop()
    assert approvals.load(agent_dir / "state", approval.id).decided_by == "console"
    api = fake_api([turn(text("thanks"))])
    live_wake(agent_dir)
    assert f"{approval.id} (bash: {PUSH}): APPROVED by console" in first_user_text(api.requests[0])
    assert (disk_view(agent_dir) / "pushed.txt").read_text() == "pushed\n"


# -- bounds ---------------------------------------------------------------------------------------


def test_the_shipped_ceiling_bounds_how_long_a_call_may_wait():
    from orchestrator.policy.ceiling import load_ceiling

    ceiling = load_ceiling(support.REPO / "policies" / "ceiling.yaml")
    assert ceiling.refusal(parse_policy("approve:\n  expires: 7d\n", "p.yaml"), "1000:1000") is None
    over = ceiling.refusal(parse_policy("approve:\n  expires: 30d\n", "p.yaml"), "1000:1000")
    assert over and "p.yaml:2" in over and "approve.expires" in over


def test_told_approvals_are_pruned_after_keep_days_and_open_ones_are_capped(agent_dir):
    sd = agent_dir / "state"
    old = approvals.ask(
        sd,
        "bash",
        {"command": "git push"},
        "r",
        "",
        "run0",
        3600,
        now=approvals.now_utc() - timedelta(days=approvals.KEEP_DAYS + 1),
    ).approval
    approvals.take(sd, "run1", frozenset({"bash"}))  # expired: told to this wake
    approvals.finish(sd, approvals.load(sd, old.id), "run1")
    assert approvals.load(sd, old.id).reported
    approvals.take(sd, "run2", frozenset({"bash"}))
    assert approvals.load(sd, old.id) is None  # told, and past KEEP_DAYS
    for n in range(approvals.MAX_OPEN):
        assert approvals.ask(sd, "bash", {"command": f"git push {n}"}, "r", "", "run3", 3600).new
    refused = approvals.ask(sd, "bash", {"command": "git push more"}, "r", "", "run3", 3600)
    assert refused.approval is None and f"at most {approvals.MAX_OPEN}" in refused.refusal


def test_a_malformed_approval_file_is_not_an_approval_and_breaks_nothing(agent_dir, capsys):
    """state/ is the folder owner's to write: a planted file with a bad time or a field of another
    type is left out of every list, never a traceback in a wake, the CLI or the console."""
    sd = agent_dir / "state"
    good = approvals.ask(sd, "bash", {"command": "git push"}, "r", "", "run0", 3600).approval
    for n, bad in enumerate(
        (
            {"expires": "garbage"},
            {"created": 7},
            {"expires": "2026-01-01T00:00:00"},
            {"words": ["a list"]},
            {"extra": "not a dict"},
        )
    ):
        planted = {**json.loads((sd / "approvals" / f"{good.id}.json").read_text()), **bad, "id": f"a-0000000{n}"}
        (sd / "approvals" / f"a-0000000{n}.json").write_text(json.dumps(planted))
    assert [a.id for a in approvals.load_all(sd)] == [good.id]
    assert [a.id for a in approvals.take(sd, "run1", frozenset({"bash"}))] == []  # pending: nothing to tell
    code, out, _ = cli(capsys, "approvals", str(agent_dir.parent), "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [good.id]


def test_an_approved_call_is_kept_for_a_later_wake_while_the_fleet_is_stopped(agent_dir):
    from orchestrator.wake.approval_gate import Gate

    sd = agent_dir / "state"
    asked = approvals.ask(sd, "bash", {"command": "git push"}, "r", "", "run0", 3600).approval
    approvals.decide(sd, asked.id, approve=True, by="a person")

    class Offered:  # the registry as outcomes() reads it; a call would fail the test
        def names(self):
            return ["bash"]

        def call(self, *args, **kwargs):
            raise AssertionError("an approved call ran while the fleet was stopped")

    class Nowhere:
        def emit(self, *args, **kwargs):
            pass

        def add(self, *args, **kwargs):
            pass

    gate = Gate(load_agent(agent_dir).policy, sd, "run1", lambda a: None, Nowhere(), Nowhere(), halted=lambda: True)
    assert gate.outcomes(Offered()) == []  # nothing told: nothing ran
    kept = approvals.load(sd, asked.id)
    assert (kept.status, kept.reported, kept.ran_by) == ("approved", False, "")  # a later wake runs it


def test_the_link_key_is_never_seen_half_made_by_readers_racing_its_maker(tmp_path):
    """The console's warm-up and a wake's notification may both be first to need the key: each
    must get the one whole key (it was once read as 0 bytes by the second, failing a probe)."""
    import threading

    from orchestrator.records import approval_links

    def get(root, start, keys, errors):
        start.wait()
        try:
            keys.append(approval_links.load_key(root))
        except approval_links.LinkError as exc:
            errors.append(str(exc))

    for attempt in range(20):
        root = tmp_path / f"root{attempt}"
        root.mkdir()
        start, keys, errors = threading.Barrier(6), [], []
        threads = [threading.Thread(target=get, args=(root, start, keys, errors)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors and len(set(keys)) == 1 and len(keys[0]) == approval_links.KEY_BYTES, errors
        assert sorted(p.name for p in root.iterdir()) == [approval_links.KEY_FILE]  # no partial left
