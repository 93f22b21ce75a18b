"""Every egress decision on the record (issue 23): state/egress.jsonl written checked and cut,
read without ever raising, kept by the one retention rule, summed in the wake's receipt,
shown by `wakeloop log --egress`, on the console's wake page and in /metrics.

No engine needed but for the one test that runs a wake (docker marker): decisions are
appended here as the egress proxy's collection appends them, with records/egress.append.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator import metrics
from orchestrator.console.app import Console, start
from orchestrator.console.auth import Access
from orchestrator.policy.agent import init_agent
from orchestrator.records import egress, retention
from orchestrator.records.egress import EGRESS_FILE, Decision, Foreign
from orchestrator.records.event_types import WakeFinished
from orchestrator.records.events import EVENTS_FILE, EventLog
from orchestrator.records.receipt import MAX_COUNT, EgressSum, Receipt
from orchestrator.records.retention import Retention, enforce, segments
from orchestrator.records.transcript import Transcript
from orchestrator.views.egressview import format_decision
from tests.helpers import run_cli
from tests.helpers.console import TOKEN, Client

NOW = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
XSS = '<script>alert("x")</script>'
RUN = "3f2a9c1e0b7d"
OTHER_RUN = "aaaaaaaaaaaa"


def decision(run_id: str = RUN, **changes) -> dict:
    """One decision as the proxy hands it over (the shared contract's fields)."""
    base = {
        "time": "2026-12-02T01:00:00.000Z",
        "run_id": run_id,
        "host": "api.github.com",
        "port": 443,
        "method": "GET",
        "path": "/repos/x/y",
        "decision": "allow",
        "rule": "allow GET /repos/**",
        "intercepted": True,
        "credential": "GH_TOKEN",
        "bytes_up": 300,
        "bytes_down": 4000,
    }
    return {**base, **changes}


def lines(state_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (state_dir / EGRESS_FILE).read_text().splitlines()]


# -- the record -----------------------------------------------------------------------------


def test_decisions_are_appended_and_read_back_by_run(tmp_path):
    denied = decision(method="POST", path="/repos/x/pulls", decision="deny", rule="allow GET /repos/**")
    assert egress.append(tmp_path, [decision(), denied, decision(OTHER_RUN, method="CONNECT", path="")]) == 3
    assert [line["run_id"] for line in lines(tmp_path)] == [RUN, RUN, OTHER_RUN]
    mine = list(egress.read(tmp_path, RUN))
    assert [(d.method, d.decision) for d in mine if isinstance(d, Decision)] == [("GET", "allow"), ("POST", "deny")]
    assert egress.read(tmp_path).__next__() == Decision(**{**decision(), "decision": "allow"})
    assert egress.summarize(tmp_path, RUN) == EgressSum(allowed=1, denied=1, bytes_up=600, bytes_down=8000)
    assert egress.summarize(tmp_path, "bbbbbbbbbbbb") == EgressSum()
    assert egress.runs(tmp_path) == [RUN, OTHER_RUN]


def test_a_decision_is_checked_and_cut_before_it_is_written(tmp_path):
    """Host, path and method come from a request the box made: nothing of it is written as given."""
    planted = decision(
        host="evil\x1b]52;c;aGk=\x07.example" + "h" * 1000,
        path="/" + "p" * 2**20 + "\u202e",
        method="GET /x HTTP/1.1\r\nX-Injected: 1",
        credential="ghp_realvalue-with-dashes/and+slashes=",
        decision="maybe",
        port=10**9,
        bytes_up=-5,
        bytes_down=10**400,
        intercepted="yes",
        run_id="../../etc",
    )
    egress.append(tmp_path, [planted, "not a mapping", 42], secrets=())  # type: ignore[list-item]
    raw = (tmp_path / EGRESS_FILE).read_bytes()
    assert raw.count(b"\n") == 1 and len(raw) <= egress.LINE_MAX
    (line,) = lines(tmp_path)
    assert "\x1b" not in line["host"] and "\x07" not in line["host"] and len(line["host"].encode()) <= egress.HOST_CAP
    assert len(line["path"].encode()) <= egress.PATH_CAP and line["path"].endswith(egress.CUT)
    assert (line["method"], line["credential"], line["decision"]) == ("?", egress.NOT_A_NAME, "deny")
    assert (line["port"], line["bytes_up"], line["bytes_down"], line["intercepted"]) == (0, 0, 0, False)
    assert line["run_id"] == ""


def test_the_longest_decision_still_fits_one_line(tmp_path):
    """Every text at its cap, in characters that escape or encode longest: still under LINE_MAX."""
    worst = decision(host='"\\é' * 500, path='"\\€' * 5000, rule='"\\😀' * 500, time='"' * 100)
    egress.append(tmp_path, [worst], secrets=())
    assert len((tmp_path / EGRESS_FILE).read_bytes()) <= egress.LINE_MAX


def test_a_secret_in_a_decision_is_scrubbed(tmp_path):
    egress.append(tmp_path, [decision(path="/x?key=sk-ant-secret-value-1234")], secrets=("sk-ant-secret-value-1234",))
    assert "sk-ant-secret" not in (tmp_path / EGRESS_FILE).read_text()
    assert "[redacted]" in lines(tmp_path)[0]["path"]


def test_planted_lines_read_as_something_safe_and_never_raise(tmp_path):
    huge = json.dumps(decision(bytes_up=10**400, bytes_down=MAX_COUNT + 1, host=XSS))
    planted = [
        "not json at all",
        "[1, 2, 3]",
        "[" * 10_000 + "]" * 10_000,  # a nesting bomb: RecursionError in json.loads
        json.dumps({"decision": "allow-everything", "run_id": RUN}),
        json.dumps({"decision": "deny", "run_id": RUN, "port": "443", "host": 5, "bytes_up": True}),
        huge,
        '{"decision": "allow", "run_id": "' + RUN + '", "path": "' + "x" * (10 * 2**20) + '"}',  # 10 MB
        json.dumps(decision(bytes_up=100, bytes_down=1)),
    ]
    (tmp_path / EGRESS_FILE).write_text("\n".join(planted) + "\n")
    read = list(egress.read(tmp_path))
    assert [type(line).__name__ for line in read] == [
        "Foreign",
        "Foreign",
        "Foreign",
        "Foreign",
        "Decision",
        "Decision",
        "Decision",
    ]  # the 10 MB line is skipped unread
    assert read[3] == Foreign(read[3].excerpt, RUN) and len(read[2].excerpt.encode()) <= egress.EXCERPT_CAP
    odd = read[4]
    assert isinstance(odd, Decision) and (odd.port, odd.host, odd.bytes_up, odd.method) == (0, "", None, "?")
    big = read[5]
    assert isinstance(big, Decision) and (big.bytes_up, big.bytes_down, big.host) == (None, None, XSS)
    assert egress.summarize(tmp_path, RUN) == EgressSum(allowed=2, denied=1, bytes_up=100, bytes_down=1)
    assert all("\n" not in format_decision(line) for line in read)


def test_a_link_in_place_of_the_file_is_neither_written_nor_read(tmp_path):
    state = tmp_path / "agent" / "state"
    state.mkdir(parents=True)
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps(decision(host="read-through-the-link")) + "\n")
    (state / EGRESS_FILE).symlink_to(outside)
    with pytest.raises(OSError):
        egress.append(state, [decision()])
    assert "api.github.com" not in outside.read_text()
    assert list(egress.read(state)) == [] and egress.summarize(state, RUN) == EgressSum()


# -- retention ----------------------------------------------------------------------------------


def test_the_egress_log_rotates_expires_and_is_read_across_segments(tmp_path):
    assert retention.KINDS[EGRESS_FILE].name == EGRESS_FILE
    for batch in range(3):
        egress.append(tmp_path, [decision(f"run{batch:09d}", path="/" + "x" * 500)] * 10, secrets=())
        done = enforce(tmp_path, Retention(rotate_size=4096), NOW + timedelta(seconds=batch))
        assert any(f"rotated {EGRESS_FILE}" in line for line in done), done
    found = segments(tmp_path, retention.KINDS[EGRESS_FILE])
    assert len(found) == 3 and all(p.name.startswith("egress-") and p.name.endswith(".jsonl.gz") for p in found)
    egress.append(tmp_path, [decision("run000000003")], secrets=())
    assert egress.runs(tmp_path) == [f"run{n:09d}" for n in range(4)]
    assert egress.total(egress.of_run(tmp_path, "run000000001")).allowed == 10  # out of a gzipped segment
    assert egress.summarize(tmp_path, "run000000001") == EgressSum()  # a wake's end reads its live file alone
    enforce(tmp_path, Retention(keep_size=0), NOW)
    assert not segments(tmp_path, retention.KINDS[EGRESS_FILE]) and egress.runs(tmp_path) == ["run000000003"]


def test_a_runs_decisions_are_found_without_reading_segments_rotated_before_it_began(tmp_path):
    """Retention rotates at a wake's start: a run's decisions are in the live file, or in the first
    segment rotated after it began. Older segments are not read (here one planted with its id)."""
    egress.append(tmp_path, [decision()], secrets=())
    enforce(tmp_path, Retention(rotate_size=1), NOW - timedelta(hours=1))  # before the run: not read
    egress.append(tmp_path, [decision(), decision(OTHER_RUN)], secrets=())
    enforce(tmp_path, Retention(rotate_size=1), NOW + timedelta(hours=1))  # the next wake's start
    egress.append(tmp_path, [decision()], secrets=())  # live
    assert egress.total(egress.of_run(tmp_path, RUN)).allowed == 3
    assert egress.total(egress.of_run(tmp_path, RUN, started=NOW)).allowed == 2
    assert egress.total(egress.of_run(tmp_path, RUN, started=NOW + timedelta(days=1))).allowed == 1


def test_the_egress_log_rotates_once_its_first_decision_is_older_than_rotate_days(tmp_path):
    egress.append(tmp_path, [decision(time=NOW.isoformat())], secrets=())
    assert enforce(tmp_path, Retention(rotate_days=1), NOW + timedelta(hours=23)) == []
    done = enforce(tmp_path, Retention(rotate_days=1), NOW + timedelta(hours=25))
    assert any(f"rotated {EGRESS_FILE}" in line and "age" in line for line in done), done


def test_a_planted_time_without_a_zone_does_not_crash_retention(tmp_path):
    """A naive stamp minus an aware now is a TypeError: it was raised out of enforce, failing the wake."""
    for name, key in ((EGRESS_FILE, "time"), (EVENTS_FILE, "timestamp")):
        (tmp_path / name).write_text(json.dumps({key: "2020-01-01T00:00:00"}) + "\n")
    assert enforce(tmp_path, Retention(rotate_days=1), NOW) == []


# -- the receipt ----------------------------------------------------------------------------------


def test_the_receipt_carries_the_egress_sum_and_old_receipts_still_read():
    total = EgressSum(allowed=3, denied=1, bytes_up=10, bytes_down=2000)
    receipt = Receipt("r", "a", 1, "done", "ok", egress=total)
    flat = receipt.to_dict()
    assert (flat["egress_allowed"], flat["egress_denied"], flat["egress_bytes_up"], flat["egress_bytes_down"]) == (
        3,
        1,
        10,
        2000,
    )
    assert list(flat)[-4:] == list(total.to_json())  # after the fields scripts already parse
    assert Receipt.from_json(json.loads(receipt.to_json())) == receipt
    old = {k: v for k, v in flat.items() if not k.startswith("egress_")}
    assert Receipt.from_json(old) == Receipt("r", "a", 1, "done", "ok")
    planted = Receipt.from_json({**flat, "egress_bytes_up": 10**400, "egress_denied": "many"})
    assert planted is not None and planted.egress == EgressSum(allowed=3, bytes_down=2000)
    assert EgressSum(bytes_up=MAX_COUNT) + EgressSum(bytes_up=MAX_COUNT) == EgressSum(bytes_up=MAX_COUNT)


def test_summing_ten_thousand_decisions_of_other_runs_is_quick(tmp_path):
    """A wake's end reads the retained egress log for its run: 10,000 lines of others' must cost
    milliseconds (bench/egress_cost.py measures it; this bound is one a wake can afford)."""
    others = [decision(f"{n:012x}") for n in range(10_000)]
    egress.append(tmp_path, [*others, decision()], secrets=())
    started = time.perf_counter()
    assert egress.summarize(tmp_path, RUN) == EgressSum(allowed=1, bytes_up=300, bytes_down=4000)
    assert time.perf_counter() - started < 1.0


# -- the views ----------------------------------------------------------------------------------------


def test_log_egress_shows_one_readable_line_per_decision(agent_dir):
    state = agent_dir / "state"
    denied = decision(method="POST", path="/repos/x/pulls", decision="deny", bytes_up=0, bytes_down=0)
    egress.append(state, [decision(), denied, decision(OTHER_RUN, host="pypi.org", method="CONNECT", path="")])
    with open(state / EGRESS_FILE, "a") as f:
        f.write(json.dumps(decision(host="\x1b[2J\x1b]0;pwned\x07evil.example", bytes_up=10**400)) + "\n")
        f.write("torn {\n")
    proc = run_cli("log", str(agent_dir), "--egress", timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert len(out) == 5 and "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "allow  GET api.github.com:443 /repos/x/y  <- allow GET /repos/**" in out[0]
    assert "credential GH_TOKEN" in out[0] and "↑300 B ↓4.0 kB" in out[0]
    assert "DENY   POST api.github.com:443 /repos/x/pulls" in out[1]
    assert "CONNECT pypi.org:443  <-" in out[2] and out[2].split()[1] == OTHER_RUN[:8]
    assert "↑? ↓4.0 kB" in out[3] and "(a line that is not an egress decision" in out[4]

    mine = run_cli("log", str(agent_dir), "--egress", "--run", RUN[:6], timeout=60)
    assert mine.returncode == 0 and len(mine.stdout.splitlines()) == 3, mine.stdout
    as_json = run_cli("log", str(agent_dir), "--egress", "--json", "--run", OTHER_RUN, timeout=60)
    assert [json.loads(line)["host"] for line in as_json.stdout.splitlines()] == ["pypi.org"]
    none = run_cli("log", str(agent_dir), "--egress", "--run", "ffff", timeout=60)  # no wake's id starts so
    assert none.returncode == 2 and "no wake of" in none.stderr and none.stderr.count("\n") == 1, none.stderr


def test_the_wake_page_lists_the_runs_decisions_escaped(tmp_path):
    root = tmp_path / "agents"
    state = init_agent(root / "one") / "state"
    transcript = Transcript(state, RUN, 1 << 20, secrets=())
    transcript.add("wake", run_id=RUN, wake=1, agent="one", model="m", live=False)
    egress.append(
        state,
        [
            decision(host=XSS, path="/<img src=x onerror=alert(1)>", rule=XSS),
            decision(decision="deny", rule="not in allow_hosts", bytes_up=5, bytes_down=0),
            decision(OTHER_RUN, host="another-runs-host.example"),
        ],
    )
    listening = start(Console(root, Access(TOKEN, True)), "127.0.0.1", 0)
    try:
        status, _, html = Client(listening.url).sign_in().get(f"/agents/one/wakes/{RUN}")
    finally:
        listening.stop()
    assert status == 200
    assert "<script" not in html.lower() and "<img" not in html
    assert "&lt;script&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "1 allowed · 1 denied" in html and "not in allow_hosts" in html and "another-runs-host" not in html


def test_metrics_count_egress_from_the_receipt_without_a_host_label(agent_dir):
    metrics.install()
    state = agent_dir / "state"
    egress.append(state, [decision(host=XSS), decision(decision="deny", host="h.example", bytes_up=7, bytes_down=0)])

    def counted() -> dict[str, float]:
        text = metrics.exposition()[0].decode()
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("wakeloop_egress_") and "_total{" in line
        }

    before = counted()
    receipt = Receipt(RUN, "one", 1, "done", "ok", egress=egress.summarize(state, RUN))
    EventLog(state / EVENTS_FILE, RUN, secrets=()).write(WakeFinished(status="done", receipt=receipt))
    after = counted()
    grown = {key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key, 0.0)}
    assert grown == {
        'wakeloop_egress_decisions_total{agent="other",decision="allow"}': 1.0,
        'wakeloop_egress_decisions_total{agent="other",decision="deny"}': 1.0,
        'wakeloop_egress_bytes_total{agent="other",direction="up"}': 307.0,
        'wakeloop_egress_bytes_total{agent="other",direction="down"}': 4000.0,
    }
    assert "script" not in "".join(after) and "h.example" not in "".join(after)


# -- the wake fills it ----------------------------------------------------------------------------------


@pytest.mark.docker
def test_a_wake_sums_its_own_decisions_into_its_receipt(agent_dir, monkeypatch):
    """The proxy's decisions for the run land before the receipt (here appended by hand, at the
    wake's first step; the lead wires the proxy's collection to egress.append)."""
    from orchestrator.policy.agent import load_agent
    from orchestrator.records.events import read_history
    from orchestrator.records.state import load_state
    from orchestrator.wake import loop

    state = agent_dir / "state"
    state.mkdir(exist_ok=True)
    egress.append(state, [decision(OTHER_RUN)] * 3)  # an earlier wake's
    started = loop._Wake._started

    def started_then_egress(self, inbox):
        started(self, inbox)
        egress.append(self.agent.state_dir, [decision(self.run_id), decision(self.run_id, decision="deny")])

    monkeypatch.setattr(loop._Wake, "_started", started_then_egress)
    receipt = loop.wake(load_agent(agent_dir), live=False)
    assert receipt.status == "done", receipt
    assert receipt.egress == EgressSum(allowed=1, denied=1, bytes_up=600, bytes_down=8000)
    saved, _ = load_state(state)
    assert saved.last_receipt is not None and saved.last_receipt.egress == receipt.egress
    shown = run_cli("status", str(agent_dir), timeout=60)
    assert "  egress       1 allowed, 1 denied, ↑600 B ↓8.0 kB" in shown.stdout, shown.stdout
    finished = [e for e in read_history(state) if e.type == "wake_finished"][-1]
    assert finished.data["receipt"]["egress_denied"] == 1
    assert os.path.exists(state / EGRESS_FILE)
