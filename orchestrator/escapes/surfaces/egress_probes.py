"""Surface probes: the egress record (state/egress.jsonl) and every view of it, attacked with
what a box can put in a decision (actor A: a host and path of its choosing) and what
whoever may write the agent folder can plant there (actor D).

Each probe plants an egress.jsonl in its trial's own agent folder (markup and
terminal escapes in host, path and rule; byte counts past what a float holds;
a 10 MB line; a line that is not JSON; a link in place of the file) and calls
the real readers: `wakeloop log --egress` (its reader and view, in this process), the
console's wake page and /metrics (a real Console on 127.0.0.1, as
surfaces/console.py starts it), and the wake's own sum for its receipt
(egress.summarize). No box is made.

Each probe's weakened control: tests/escapes/test_surfaces_egress.py.

Not here: the record and its checks (records/egress.py), the views
(views/egressview.py, console/templates/wake.html, metrics.py), the proxy
that decides (the egress slice).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from orchestrator.escapes.lab import Probe, escaped, held

CATEGORY = "surfaces"
XSS = "<script>window.__pwned = 1</script>"
IMG = "<img src=x onerror=alert(1)>"
TERMINAL = "\x1b]0;owned\x07\x1b[2J"  # sets the terminal's title, clears the screen
HUGE_LINE = 10 * 2**20  # bytes: a planted line no decision of ours is near
HONEST_UP, HONEST_DOWN = 300, 4000  # the bytes of the one honest decision planted beside the rest
SHOWN_CAP = 2**20  # bytes of output or page a probe accepts: the 10 MB line must not be in it


def _plant(state: Path, run_id: str) -> None:
    """egress.jsonl as an attacker leaves it: one honest decision among planted ones."""

    def line(**fields) -> str:
        base = {"time": "2026-12-02T01:00:00Z", "run_id": run_id, "port": 443, "method": "GET", "intercepted": False}
        return json.dumps({**base, **fields}, ensure_ascii=False)

    planted = [
        line(host=XSS + TERMINAL, path="/" + IMG + TERMINAL, decision="allow", rule=XSS, bytes_up=10**400),
        line(host="big.example", path="/", decision="allow", rule="r", bytes_up=10**20, bytes_down=2**63),
        line(host="long.example", path="/" + "A" * HUGE_LINE, decision="allow", rule="r"),
        "not json " + TERMINAL,
        "[" * 50_000 + "]" * 50_000,
        line(host="api.example", path="/ok", decision="deny", rule="not in allow_hosts", bytes_up=HONEST_UP).replace(
            f'"bytes_up": {HONEST_UP}', f'"bytes_up": {HONEST_UP}, "bytes_down": {HONEST_DOWN}'
        ),
    ]
    state.mkdir(parents=True, exist_ok=True)
    (state / "egress.jsonl").write_text("\n".join(planted) + "\n")


def _transcript(state: Path, run_id: str, agent: str) -> None:
    from orchestrator.records.transcript import Transcript

    transcript = Transcript(state, run_id, 1 << 20, secrets=())
    transcript.add("wake", run_id=run_id, wake=1, agent=agent, model="m", live=False)


# -- wakeloop log --egress ------------------------------------------------------------------


def egress_log_shows_planted_lines_inert(trial) -> str:
    """Planted and box-chosen text reaches a terminal through `log --egress`: no escape
    sequence, no 10 MB line, no traceback."""
    from orchestrator.records import egress
    from orchestrator.views.egressview import format_decision

    _plant(trial.state, secrets.token_hex(6))
    try:  # what `wakeloop log AGENT --egress` prints (cli/ may not be imported from here)
        text = "".join(format_decision(line) + "\n" for line in egress.read(trial.state))
    except Exception as exc:
        return escaped(f"log --egress crashed on a planted egress.jsonl: {type(exc).__name__}: {str(exc)[:80]}")
    if "\x1b" in text or "\x07" in text:
        return escaped("log --egress printed a planted terminal escape sequence")
    if len(text) > SHOWN_CAP:
        return escaped(f"log --egress printed {len(text):,} characters: the planted 10 MB line reached the terminal")
    if "api.example" not in text:
        return "log --egress did not show the honest decision: nothing to judge"
    return held(f"planted lines shown cleaned and cut ({len(text.splitlines())} lines, {len(text):,} characters)")


# -- the console ----------------------------------------------------------------------------------


def egress_wake_page_shows_planted_lines_inert(trial) -> str:
    """The wake page lists the run's decisions: markup in host, path and rule is text there."""
    from orchestrator.escapes.surfaces.console import AGENT, console

    with console(trial) as served:
        state = served.root / AGENT / "state"
        run_id = secrets.token_hex(6)
        _plant(state, run_id)
        _transcript(state, run_id, AGENT)
        answer = served.request("GET", f"/agents/{AGENT}/wakes/{run_id}", served.bearer)
    if answer.status != 200:
        return escaped(f"a planted egress.jsonl broke the wake page: {answer.status}")
    body = answer.body
    if "<script" in body.lower() or "<img" in body.lower():
        return escaped("the wake page shows a planted host or path as markup")
    if len(body) > SHOWN_CAP:
        return escaped(f"the wake page is {len(body):,} characters: the planted 10 MB line is on it")
    if "&lt;script&gt;" not in body or "api.example" not in body:
        return "the planted decisions are not on the wake page at all: nothing to judge"
    return held("planted markup in host, path and rule shown escaped on the wake page")


def egress_metrics_count_no_planted_number(trial) -> str:
    """A wake's egress sum (its receipt, which /metrics books) over a planted egress.jsonl:
    only the honest decision's bytes count, and no host or path becomes a label."""
    from orchestrator.escapes.surfaces.console import AGENT, console
    from orchestrator.records import egress
    from orchestrator.records.event_types import WakeFinished
    from orchestrator.records.events import EVENTS_FILE, EventLog
    from orchestrator.records.receipt import Receipt

    with console(trial) as served:
        state = served.root / AGENT / "state"
        run_id = secrets.token_hex(6)
        _plant(state, run_id)
        before = _egress_series(served)
        try:
            total = egress.summarize(state, run_id)  # what the wake's end does
        except Exception as exc:
            return escaped(f"summing a planted egress.jsonl raised {type(exc).__name__}: the wake would fail")
        receipt = Receipt(run_id, AGENT, 1, "done", "probe", egress=total)
        EventLog(state / EVENTS_FILE, run_id, secrets=()).write(WakeFinished(status="done", receipt=receipt))
        after = _egress_series(served)
    grown = {key: value - before.get(key, 0.0) for key, value in after.items() if value != before.get(key, 0.0)}
    if not grown:
        return "/metrics counted no egress at all: nothing to judge"
    labels = {key.split("{", 1)[1] for key in after if "{" in key}
    foreign = [label for label in labels if "script" in label or "example" in label]
    if foreign:
        return escaped(f"a planted host became a /metrics label: {foreign[0][:80]}")
    up = sum(v for k, v in grown.items() if k.startswith("wakeloop_egress_bytes_total") and 'direction="up"' in k)
    down = sum(v for k, v in grown.items() if k.startswith("wakeloop_egress_bytes_total") and 'direction="down"' in k)
    if (up, down) != (HONEST_UP, HONEST_DOWN):
        return escaped(f"/metrics booked {up:,.0f} bytes up, {down:,.0f} down: planted counts were added")
    return held(f"/metrics booked the honest {HONEST_UP} bytes up and {HONEST_DOWN} down; no host label")


def _egress_series(served) -> dict[str, float]:
    text = served.request("GET", "/metrics").body
    found = {}
    for line in text.splitlines():
        if line.startswith("wakeloop_egress_") and "_total{" in line:
            key, _, value = line.rpartition(" ")
            found[key] = float(value)
    return found


# -- a link in place of the file ------------------------------------------------------------


def egress_record_never_follows_a_link(trial) -> str:
    """state/egress.jsonl planted as a link to a host file: no decision lands in it, none is read."""
    from orchestrator.records import egress

    canary = trial.lab.canary_path
    before = canary.read_bytes()
    (trial.state / "egress.jsonl").symlink_to(canary)
    decision = {"run_id": "probe", "host": "written-through.example", "decision": "allow", "rule": "r"}
    try:
        egress.append(trial.state, [decision], secrets=())
    except OSError:
        pass
    seen = [line for line in egress.read(trial.state)]
    if canary.read_bytes() != before:
        return escaped("a decision was appended through state/egress.jsonl, a link, into the host canary")
    if any(trial.lab.host_canary in str(line) for line in seen):
        return escaped("the egress record read the host canary through a link")
    return held("state/egress.jsonl planted as a link to the host canary: neither written nor read")


def _probe(attack, expected: str) -> Probe:
    return Probe(attack.__name__, CATEGORY, expected, attack)


PROBES: list = [
    _probe(egress_log_shows_planted_lines_inert, "log --egress shows planted lines cleaned, cut, without a crash"),
    _probe(egress_wake_page_shows_planted_lines_inert, "the wake page shows planted hosts and paths as text"),
    _probe(egress_metrics_count_no_planted_number, "/metrics books only known byte counts, no host label"),
    _probe(egress_record_never_follows_a_link, "state/egress.jsonl planted as a link is neither written nor read"),
]
