"""Telling a person (orchestrator/notify/): real receivers on 127.0.0.1, time passed in, never slept through.

The receivers are real servers (tests/helpers/receivers.py); the agents are real
agent folders loaded as `wakeloop` loads them. Backoff is driven by passing
`now` to the sender, so hours of retries take milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.escapes.surfaces.receivers import Hook, Mailbox
from orchestrator.notify import outcomes, queue
from orchestrator.notify.config import NotifyError, parse_notify
from orchestrator.notify.sender import CAP_S, retry_after, send_due
from orchestrator.policy.agent import AgentError, load_agent
from orchestrator.records import health
from orchestrator.records.events import EVENTS_FILE, read_events
from orchestrator.records.receipt import Receipt
from orchestrator.testing.fakeapi import text, tool_use, turn
from tests.helpers import cli_here, make_agent, support

TOKEN = "T0KEN-9f8e7d6c5b4a"  # what must never be written anywhere under state/ or printed


def note(agent, n: int, event: str = "dead_letter") -> dict:
    return outcomes.payload(agent.name, event, f"run{n}/{event}", f"title {n}", f"text {n}", f"run{n}")


def everything_under(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


# -- configuration ------------------------------------------------------------------------


def test_notify_entries_are_checked_naming_file_line_and_key(tmp_path):
    with pytest.raises(AgentError, match=r"agent.yaml:\d+: notify\[0\]\.on: 'dead' is not an event"):
        load_agent(make_agent(tmp_path, "a", notify=[{"webhook": "https://h.example/x", "on": ["dead"]}]))
    with pytest.raises(AgentError, match=r"notify\[0\]: name exactly one channel"):
        load_agent(make_agent(tmp_path, "b", notify=[{"webhook": "https://h.example/x", "slack": "https://s.example"}]))
    with pytest.raises(NotifyError, match=r"notify\[0\]\.command: expected the program"):
        parse_notify([{"command": "page-me"}], Path("f.yaml"), None, operator=True)
    (tmp_path / "notify.yaml").write_text("- email: ops@example.com\n  on: [daily]\n")
    agent = load_agent(make_agent(tmp_path, "c", notify=[{"slack": "${SLACK_URL}"}]))
    assert [c.kind for c in agent.notify] == ["slack", "email"]  # its own, then ROOT's
    assert agent.notify[0].label == "slack $SLACK_URL" and agent.notify[1].on == {"daily"}
    url = load_agent(make_agent(tmp_path, "d", notify=[{"webhook": f"https://hooks.example.com/{TOKEN}"}])).notify[0]
    assert url.label == "webhook hooks.example.com/…" and TOKEN not in url.label


# -- the queue and the sender ----------------------------------------------------------------


def test_a_webhook_down_then_up_gets_every_notification_once_in_order(tmp_path):
    with Hook(status=503) as hook:
        agent = load_agent(make_agent(tmp_path, "a", notify=[{"webhook": hook.url(f"/hook/{TOKEN}")}]))
        for n in range(3):
            outcomes.emit(agent.state_dir, agent.notify, note(agent, n))
        t0 = time.time()
        report = send_due(agent.state_dir, agent.notify, now=t0)
        assert (hook.attempts, len(report.failed), report.waiting) == (1, 1, 3)  # the rest wait behind it
        # Down for an hour: each retry comes when its backoff says, never before.
        now, attempts = t0, 1
        while now < t0 + 3600:
            now = queue.pending(agent.state_dir)[0].next_at
            assert send_due(agent.state_dir, agent.notify, now=now - 0.001).failed == []  # not yet due
            send_due(agent.state_dir, agent.notify, now=now)
            attempts += 1
            assert hook.attempts == attempts
        assert attempts < 20  # capped backoff, not a busy loop
        hook.status = 200
        report = send_due(agent.state_dir, agent.notify, now=now + CAP_S)
        assert len(report.sent) == 3 and report.waiting == 0
        assert [b["id"] for b in hook.received] == [f"a/run{n}/dead_letter" for n in range(3)]
        assert hook.headers[0]["Idempotency-Key"] == "a/run0/dead_letter"
        assert send_due(agent.state_dir, agent.notify, now=now + 2 * CAP_S).sent == []  # once each
    assert [d["outcome"] for d in queue.done(agent.state_dir)] == ["sent"] * 3
    assert TOKEN not in everything_under(agent.state_dir)


def test_backoff_doubles_to_its_cap_and_an_always_failing_receiver_is_given_up_and_shown(tmp_path, capsys):
    assert [retry_after(n) for n in (1, 2, 3)] == [5, 10, 20] and retry_after(30) == CAP_S
    with Hook(status=500) as hook:
        agent = load_agent(make_agent(tmp_path, "a", notify=[{"webhook": hook.url(), "give_up_after": "2h"}]))
        outcomes.emit(agent.state_dir, agent.notify, note(agent, 1))
        t0 = time.time()
        send_due(agent.state_dir, agent.notify, now=t0)
        report = send_due(agent.state_dir, agent.notify, now=t0 + 2 * 3600)
    assert report.gave_up and "still failing after 2h: HTTP 500" in report.gave_up[0]
    assert queue.pending(agent.state_dir) == []
    assert cli_here("status", str(agent.dir)) == 0
    status = capsys.readouterr().out
    assert "1 given up" in status and "HTTP 500" in status
    assert "notify_gave_up" in [e.type for e in read_events(agent.state_dir / EVENTS_FILE)]


def test_email_carries_the_agents_message_over_real_smtp_and_the_password_stays_out(tmp_path):
    with Mailbox() as smtp:
        agent = load_agent(make_agent(tmp_path, "a", notify=[{"email": "ops@example.com", "on": ["message"]}]))
        outcomes.on_message(agent, "r1", 4, 1, "The report is ready: see out/report.md")
        outcomes.emit(agent.state_dir, agent.notify, note(agent, 2))  # dead_letter: not asked for
        env = {"WAKELOOP_SMTP_URL": smtp.url("ops", TOKEN)}
        report = send_due(agent.state_dir, agent.notify, now=time.time(), environ=env)
    assert report.sent == ["email ops@example.com: 250 accepted"]
    [msg] = [mail.message for mail in smtp.messages]
    assert msg["To"] == "ops@example.com" and msg["Subject"] == "a (wake #4) says"
    assert msg["Message-ID"] == "<a/r1/message/1@wakeloop>"
    assert "The report is ready: see out/report.md" in msg.get_payload()
    assert smtp.logins == [("ops", TOKEN)] and TOKEN not in everything_under(agent.state_dir)


def test_a_command_hook_gets_the_json_on_stdin_and_its_failure_is_one_line(tmp_path):
    out = tmp_path / "paged.json"
    page = [sys.executable, "-c", f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())"]
    (tmp_path / "notify.yaml").write_text(
        yaml.safe_dump(
            {
                "expand": ["PAGER_TOKEN"],
                "notify": [
                    {"command": page, "on": ["dead_letter"]},
                    {
                        "command": [
                            sys.executable,
                            "-c",
                            "import sys; sys.exit('pager says no ' + sys.argv[1])",
                            "${PAGER_TOKEN}",
                        ]
                    },
                ],
            }
        )
    )  # the operator's file: the only place a command comes from
    agent = load_agent(make_agent(tmp_path, "a", notify=[]))
    outcomes.emit(agent.state_dir, agent.notify, note(agent, 1))
    report = send_due(agent.state_dir, agent.notify, now=time.time(), environ={"PAGER_TOKEN": TOKEN})
    assert json.loads(out.read_text())["id"] == "a/run1/dead_letter"
    assert [line.split(": ", 1)[1] for line in report.sent] == ["exit 0"]
    [failed] = report.failed
    assert "exit 1: pager says no [redacted]" in failed and TOKEN not in failed


def test_kill_9_in_the_middle_of_a_delivery_loses_nothing(tmp_path):
    """The sender is killed while the receiver holds its POST open: the item stays queued
    and the next pass delivers it; the receiver may see it twice, with the same id."""
    held, release = threading.Event(), threading.Event()
    with Hook() as hook:
        original = hook.server.RequestHandlerClass.do_POST

        def holding(handler):
            if not held.is_set():
                held.set()
                release.wait(30)
            original(handler)

        hook.server.RequestHandlerClass.do_POST = holding
        agent = load_agent(make_agent(tmp_path, "a", notify=[{"webhook": hook.url()}]))
        outcomes.emit(agent.state_dir, agent.notify, note(agent, 1))
        sender = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, time; from orchestrator.policy.agent import "
                "load_agent; from orchestrator.notify.sender import send_due; "
                "a = load_agent(sys.argv[1]); send_due(a.state_dir, a.notify, now=time.time())",
                str(agent.dir),
            ],
            cwd=support.REPO,
            env=support.scrubbed_env(),
        )
        assert held.wait(30), "the sender never reached the receiver"
        os.kill(sender.pid, signal.SIGKILL)
        sender.wait(10)
        release.set()
        assert len(queue.pending(agent.state_dir)) == 1
        report = send_due(agent.state_dir, agent.notify, now=time.time())
        assert len(report.sent) == 1 and queue.pending(agent.state_dir) == []
        assert {b["id"] for b in hook.received} == {"a/run1/dead_letter"}


# -- failing, paused, recovered ------------------------------------------------------------------


def receipt(status: str, n: int, reason: str = "boom") -> Receipt:
    return Receipt(run_id=f"run{n}", agent="a", wake=n, status=status, reason=reason)


def test_failing_is_sent_once_the_agent_pauses_at_its_count_and_recovered_follows(tmp_path):
    agent = load_agent(make_agent(tmp_path, "a", notify=[{"webhook": "http://127.0.0.1:9/x"}], pause_after_failures=3))
    for n in range(1, 5):
        outcomes.after_wake(agent, receipt("dead_letter", n))
    h = health.load(agent.state_dir)
    assert (h.failures, h.paused) == (4, True) and "3 failed wakes in a row" in h.paused_reason
    assert h.backoff_until() == h.last_failure_at + health.backoff_s(4) and health.backoff_s(99) == health.BACKOFF_CAP_S
    outcomes.after_wake(agent, receipt("blocked", 5))  # the USD cap: not a failure
    outcomes.after_wake(agent, receipt("blocked", 6))  # and said once a day
    outcomes.after_wake(agent, receipt("done", 7))
    events = [i.event for i in queue.pending(agent.state_dir)]
    assert events == [
        "dead_letter",
        "dead_letter",
        "failing",
        "dead_letter",
        "paused",
        "dead_letter",
        "blocked",
        "recovered",
    ]
    paused = next(i for i in queue.pending(agent.state_dir) if i.event == "paused")
    assert f"wakeloop resume {agent.dir}" in paused.payload["text"]
    assert health.load(agent.state_dir) == health.Health()


def test_a_refused_api_key_pauses_at_once(tmp_path):
    agent = load_agent(make_agent(tmp_path, "a", notify=[{"webhook": "http://127.0.0.1:9/x"}]))
    outcomes.after_wake(agent, receipt("dead_letter", 1, "the API answered HTTP 401 (authentication_error)"))
    h = health.load(agent.state_dir)
    assert h.paused and "refused the key" in h.paused_reason
    assert [i.event for i in queue.pending(agent.state_dir)] == ["dead_letter", "failing", "paused"]
    assert cli_here("resume", str(agent.dir)) == 0
    assert not health.load(agent.state_dir).paused


def test_the_daily_digest_is_queued_once_per_day_with_wakes_statuses_and_cost(tmp_path):
    agent = load_agent(make_agent(tmp_path, "a", notify=[{"webhook": "http://127.0.0.1:9/x", "on": ["daily"]}]))
    from orchestrator.records.events import EventLog

    log = EventLog(agent.state_dir / EVENTS_FILE, "r1")
    for status, usd in (("done", 0.25), ("dead_letter", 0.5)):
        log.emit("wake_finished", receipt={"status": status, "usd": usd, "model": "claude-sonnet-4-6"})
    log.emit("tool_call", tool="send_message", input={"text": "hi"})
    day = read_events(agent.state_dir / EVENTS_FILE).__next__().timestamp[:10]
    outcomes.daily(agent.state_dir, agent.name, agent.notify, today=day)  # the first: only marks the day
    outcomes.daily(agent.state_dir, agent.name, agent.notify, today=day)
    outcomes.daily(agent.state_dir, agent.name, agent.notify, today="2999-01-01")
    [item] = queue.pending(agent.state_dir)
    assert item.id == f"a/daily/{day}"
    data = item.payload["data"]
    assert data["wakes"] == 2 and data["statuses"] == {"done": 1, "dead_letter": 1} and data["messages"] == 1
    assert data["usd_by_model"] == {"claude-sonnet-4-6": 0.75}


# -- serve ---------------------------------------------------------------------------------------


def not_started(agent_dir: Path) -> int:
    return [e.type for e in read_events(agent_dir / "state" / EVENTS_FILE)].count("wake_not_started")


def test_serve_records_failed_starts_pauses_and_run_now_and_resume_act_on_the_running_serve(tmp_path, monkeypatch):
    """A live agent with no API key cannot start a wake (no engine needed): serve records each failure
    in the agent's events and health, backs off, says `failing` once, pauses at the count, and its
    sender delivers all of it; `wakeloop run-now` and `resume` reach the running serve, whose heartbeat
    `status` sees. The hook's token is in no file under state/ and not in serve's output."""
    from orchestrator.fleet.control import scheduler_note
    from orchestrator.fleet.scheduler import Scheduler

    monkeypatch.setattr(health, "BACKOFF_BASE_S", 0.0)  # the backoff rule itself is tested above
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with Hook() as hook:
        root = tmp_path / "root"
        agent_dir = make_agent(
            root, "a", notify=[{"webhook": hook.url(f"/h/{TOKEN}")}], live=True, schedule="1s", pause_after_failures=2
        )
        lines: list[str] = []
        scheduler = Scheduler(root, out=lines.append, rescan_s=0.2)
        thread = threading.Thread(target=scheduler.run, daemon=True)
        thread.start()
        try:
            support.wait_for(lambda: health.load(agent_dir / "state").paused, "the agent to be paused", 30)
            support.wait_for(lambda: [b["event"] for b in hook.received][-1:] == ["paused"], "paused notified", 30)
            assert [b["event"] for b in hook.received] == ["failing", "paused"]
            assert "ANTHROPIC_API_KEY is not set" in hook.received[0]["text"]
            support.wait_for(lambda: any("paused (" in line for line in lines), "serve to say paused", 10)
            assert scheduler_note(root) is None  # its heartbeat is fresh
            before = not_started(agent_dir)
            assert cli_here("run-now", str(agent_dir)) == 0  # paused, but a person asked
            support.wait_for(lambda: not_started(agent_dir) == before + 1, "the run-now wake", 30)
            assert any("run-now requested" in line for line in lines)
            assert cli_here("resume", str(agent_dir)) == 0
            support.wait_for(lambda: health.load(agent_dir / "state").failures >= 1, "ticks to run again", 30)
        finally:
            scheduler.request_stop()
            thread.join(30)
    kinds = [e.type for e in read_events(agent_dir / "state" / EVENTS_FILE)]
    assert kinds.count("wake_not_started") >= 4 and "notify_sent" in kinds
    assert TOKEN not in everything_under(agent_dir / "state") and TOKEN not in "\n".join(lines)


# -- one real wake ---------------------------------------------------------------------------------


@pytest.mark.docker
def test_a_live_wake_queues_its_send_message_and_the_sender_delivers_it(tmp_path, fake_api, capsys):
    from orchestrator.cli.notify_commands import send_notifications
    from orchestrator.testing.fakeapi import FAKE_KEY
    from orchestrator.wake.loop import wake
    from orchestrator.wake.model import LiveModel

    fake_api([turn(tool_use("send_message", {"text": "Hello, human: the job is done."})), turn(text("bye"))])
    with Hook() as hook:
        agent = load_agent(
            make_agent(tmp_path, "a", notify=[{"webhook": hook.url(f"/h/{TOKEN}"), "on": ["message"]}], live=True)
        )
        receipt = wake(agent, live=True, model=LiveModel(agent.model, FAKE_KEY))
        assert receipt.status == "done" and hook.attempts == 0  # queued by the wake, not sent by it
        send_notifications(agent)  # what `wakeloop wake` does after
        assert [b["text"] for b in hook.received] == ["Hello, human: the job is done."]
        assert hook.received[0]["id"] == f"a/{receipt.run_id}/message/1"
    assert cli_here("transcript", str(agent.dir)) == 0
    out = capsys.readouterr()
    assert "-> send_message" in out.out and "Hello, human" in out.out
    assert "notified webhook 127.0.0.1/…: HTTP 200" in out.err
    assert TOKEN not in out.out + out.err and TOKEN not in everything_under(agent.state_dir)


def test_status_says_the_scheduler_is_not_running_when_its_heartbeat_is_stale(tmp_path):
    from orchestrator.fleet.control import STALE_S, beat, scheduler_note
    from orchestrator.views.fleet_table import status_table

    make_agent(tmp_path, "a", notify=[])
    assert "scheduler not running: no `wakeloop serve" in status_table(tmp_path)
    beat(tmp_path)
    assert scheduler_note(tmp_path) is None and "no scheduler" not in status_table(tmp_path)
    beat(tmp_path, now=time.time() - STALE_S - 1)
    assert "its last heartbeat was" in scheduler_note(tmp_path) and "no scheduler" in status_table(tmp_path)


@pytest.mark.docker
def test_a_hung_wake_ends_at_max_wake_s_with_a_receipt_and_a_free_lock(tmp_path):
    """A call that would hang for ten minutes is cut to what is left of max_wake_s; the wake then
    stops at its next step boundary, receipt budget_stop, lock released, the failure rules untouched."""
    from orchestrator.records.state import lock_holder
    from orchestrator.wake.loop import wake

    script = tmp_path / "hang.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "bash", "input": {"command": "sleep 600"}}]}, {"text": "never reached"}])
    )
    agent_dir = make_agent(tmp_path, "a", notify=[], policy={"budget": {"max_wake_s": 5}, "sandbox": {"pool": 0}})
    started = time.monotonic()
    receipt = wake(load_agent(agent_dir), script=script)
    assert (receipt.status, receipt.reason) == ("budget_stop", "max_wake_s (5s) reached")
    assert time.monotonic() - started < 120  # not the call's 600 s
    assert lock_holder(agent_dir / "state") is None
    results = [e.data for e in read_events(agent_dir / "state" / EVENTS_FILE) if e.type == "tool_result"]
    assert all(r.get("timed_out") for r in results)  # if it ran, it was cut
    assert health.load(agent_dir / "state").failures == 0
