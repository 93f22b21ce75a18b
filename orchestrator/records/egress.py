"""The egress record: `state/egress.jsonl`, one line per decision of the agent's egress proxy.

Each connection the box opens and, where the proxy intercepts, each request
it makes is one JSON object a line (docs/architecture.md's shared contract):
`time, run_id, host, port, method, path, decision ("allow" | "deny"),
rule, intercepted, credential, bytes_up, bytes_down`. `credential` is the
NAME of the variable whose value the proxy injected, never a value.

Nothing in a decision is trusted. Its host, path and method come from a
request the box made (whatever the model, or a prompt injection, chose),
and the file itself may be planted by whoever can write the agent folder
(docs/security.md's actor D). So:

- `append` checks and cuts every field before it is written: control
  characters dropped, each text cut to its cap in bytes (a line is never
  longer than LINE_MAX), counts outside 0..MAX_COUNT written as 0, a
  credential that is not a variable's name (a value, by mistake?) never
  written, anything but "allow" recorded as "deny", and the secrets
  events.py scrubs scrubbed here too. Lines go out in whole-line writes on an
  O_APPEND descriptor (safeio/folder.py: never through a link, never into a FIFO).
- reading never raises: a line that is not a decision (torn, planted,
  another version's) becomes a `Foreign` holding a cleaned excerpt; a
  decision's fields are cut and cleaned again; a planted count past
  MAX_COUNT reads as None (unknown) and counts for nothing in a sum; a line
  longer than READ_LINE_CAP is skipped unread.

The live file is a log kind of retention.py, rotated, gzipped and expired
like the event log; `read` reads across its segments. Retention rotates only
at a wake's start, under the wake lock, so a wake's decisions are all in the
live file until the next wake's start rotates them, together, into one
segment: its end sums them from the live file alone (`summarize`), and a
finished run's are found without reading the segments rotated before it
began (`of_run(started=...)`, the console's wake page).

Not here: the proxy that decides (sandbox/, the egress slice), the sum's
place in a receipt (receipt.py's EgressSum), how decisions are shown
(views/egressview.py, the console's wake page, metrics.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from orchestrator.records import retention
from orchestrator.records.events import now_iso, scrub, secrets_from_env
from orchestrator.records.receipt import MAX_COUNT, EgressSum
from orchestrator.safeio.jsontext import loads

EGRESS_FILE = "egress.jsonl"
retention.register_log(EGRESS_FILE)  # rotated, compressed and expired like events.jsonl

Verdict = Literal["allow", "deny"]
VERDICTS: tuple[Verdict, ...] = ("allow", "deny")

# Caps, in UTF-8 bytes of the text kept: what a person reads of one decision, and what keeps
# a line under LINE_MAX whatever the box asked for (a 1 MB path is cut, not written).
HOST_CAP = 253  # the longest DNS name
PATH_CAP = 2048  # a path and query past this is cut (marked with CUT)
RULE_CAP = 300  # "allow GET /repos/**", "not in allow_hosts", a policy line
TIME_CAP = 40  # an ISO-8601 stamp
EXCERPT_CAP = 200  # of a line that is not a decision, shown as such
LINE_MAX = 8 * 2**10  # bytes: the longest line append writes (every cap above, escaped)
READ_LINE_CAP = 4 * LINE_MAX  # bytes: a longer line is not ours and is skipped unread
WRITE_CHUNK = 64 * 2**10  # bytes of lines per write(2): one write for a wake's usual handful
ROTATION_MARGIN = timedelta(minutes=1)  # segments rotated this long before a run began are read too:
#                                         a clock stepped back a little must not hide a run's decisions
CUT = "…"

RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")  # a wake's run id (12 hex digits; tests use names)
METHOD = re.compile(r"[A-Za-z]{1,16}")  # CONNECT or an HTTP method
CREDENTIAL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # a variable's name: a value never fits
NOT_A_NAME = "(not a variable name)"  # written instead of a credential that is not one
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # terminal, bidi


@dataclass(frozen=True)
class Decision:
    """One allow or deny of the proxy, for one connection or one intercepted request."""

    time: str
    run_id: str
    host: str
    port: int
    method: str  # CONNECT for a tunnel, else the request's method
    path: str  # "" for a tunnel
    decision: Verdict
    rule: str  # what decided: "allow_hosts: api.github.com", "not in allow_hosts", ...
    intercepted: bool = False  # the proxy saw the request inside TLS (credentials, method rules)
    credential: str = ""  # the NAME of the variable injected, "" if none
    bytes_up: int | None = 0  # None: unknown (a count past MAX_COUNT read from the file)
    bytes_down: int | None = 0

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "run_id": self.run_id,
            "host": self.host,
            "port": self.port,
            "method": self.method,
            "path": self.path,
            "decision": self.decision,
            "rule": self.rule,
            "intercepted": self.intercepted,
            "credential": self.credential,
            "bytes_up": self.bytes_up or 0,
            "bytes_down": self.bytes_down or 0,
        }


@dataclass(frozen=True)
class Foreign:
    """A line of egress.jsonl that is not a decision (torn, planted, another version's): kept as a
    cleaned, cut excerpt, like event_types.Other, so a reader shows or skips it and never fails."""

    excerpt: str
    run_id: str = ""  # its run_id, when it had one that looks like one


Line = Decision | Foreign


# -- writing ---------------------------------------------------------------------------------


def append(state_dir: Path, decisions: Sequence[Mapping[str, Any]], secrets: tuple[str, ...] | None = None) -> int:
    """Append the proxy's decisions to state/egress.jsonl, each checked and cut (module doc);
    returns how many were written. Whole lines per write(2), at most WRITE_CHUNK bytes each.
    Raises OSError when the file cannot be written (folder.Refused: a link or FIFO planted
    there), as EventLog.write does: the caller says so, the decisions are not kept elsewhere."""
    secrets = secrets_from_env() if secrets is None else secrets
    lines = [_line(decide(raw), secrets) for raw in decisions if isinstance(raw, Mapping)]
    folder, name = retention.holder(Path(state_dir) / EGRESS_FILE)
    chunk: list[bytes] = []
    for line in lines:
        if chunk and sum(map(len, chunk)) + len(line) > WRITE_CHUNK:
            folder.append(name, b"".join(chunk))
            chunk = []
        chunk.append(line)
    if chunk:
        folder.append(name, b"".join(chunk))
    return len(lines)


def decide(raw: Mapping[str, Any]) -> Decision:
    """One decision as the proxy handed it, checked and cut for writing (never raises)."""
    time = _text(raw.get("time"), TIME_CAP) or now_iso()
    return Decision(
        time=time,
        run_id=_run_id(raw.get("run_id")),
        host=_text(raw.get("host"), HOST_CAP),
        port=_port(raw.get("port")),
        method=_method(raw.get("method")),
        path=_text(raw.get("path"), PATH_CAP),
        decision="allow" if raw.get("decision") == "allow" else "deny",  # what is not an allow, refused
        rule=_text(raw.get("rule"), RULE_CAP),
        intercepted=raw.get("intercepted") is True,
        credential=_credential(raw.get("credential")),
        bytes_up=_bytes(raw.get("bytes_up")) or 0,
        bytes_down=_bytes(raw.get("bytes_down")) or 0,
    )


def _line(decision: Decision, secrets: tuple[str, ...]) -> bytes:
    text = scrub(json.dumps(decision.to_json(), ensure_ascii=False), secrets) + "\n"
    return text.encode("utf-8")


# -- reading -----------------------------------------------------------------------------------


def parse_line(text: str) -> Line:
    """One line of egress.jsonl as a Decision, else a Foreign. Never raises."""
    try:
        raw = loads(text)
    except ValueError:
        raw = None
    if not isinstance(raw, dict) or raw.get("decision") not in VERDICTS:
        run = raw.get("run_id") if isinstance(raw, dict) else None
        return Foreign(_text(text.strip(), EXCERPT_CAP), _run_id(run))
    return Decision(
        time=_text(raw.get("time"), TIME_CAP),
        run_id=_run_id(raw.get("run_id")),
        host=_text(raw.get("host"), HOST_CAP),
        port=_port(raw.get("port")),
        method=_method(raw.get("method")),
        path=_text(raw.get("path"), PATH_CAP),
        decision=raw["decision"],
        rule=_text(raw.get("rule"), RULE_CAP),
        intercepted=raw.get("intercepted") is True,
        credential=_credential(raw.get("credential")),
        bytes_up=_bytes(raw.get("bytes_up")),
        bytes_down=_bytes(raw.get("bytes_down")),
    )


def raw_lines(state_dir: Path, live_only: bool = False, since: datetime | None = None) -> Iterator[str]:
    """Every retained line, oldest first, as written (`wakeloop log --egress --json`): across the
    rotated segments, gzipped or not; a line over READ_LINE_CAP skipped. With live_only, the
    live file's alone; with `since`, only the segments rotated after it (module doc)."""
    paths = [Path(state_dir) / EGRESS_FILE] if live_only else retention.history(state_dir, EGRESS_FILE)
    if since is not None:  # a segment's name holds when it was rotated, sortable as text
        first = f"{EGRESS_FILE.partition('.')[0]}-{(since - ROTATION_MARGIN).strftime(retention.STAMP)}"
        paths = [path for path in paths if path.name == EGRESS_FILE or path.name >= first]
    for path in paths:
        try:
            with retention.open_text(path, READ_LINE_CAP) as lines:
                yield from lines
        except OSError:  # vanished (expired meanwhile), or not ours (a link, a FIFO): skipped
            continue


def read(
    state_dir: Path, run_id: str | None = None, live_only: bool = False, since: datetime | None = None
) -> Iterator[Line]:
    """Every retained line as a Decision or Foreign, oldest first; with run_id, only that run's
    (a run id or a prefix of one). Streams: memory stays flat however long the history."""
    for text in raw_lines(state_dir, live_only, since):
        if run_id and run_id not in text:  # most lines are other runs': no JSON parse for them
            continue
        line = parse_line(text)
        if run_id is None or line.run_id.startswith(run_id):
            yield line


def of_run(
    state_dir: Path, run_id: str, live_only: bool = False, started: datetime | None = None
) -> Iterator[Decision]:
    """One run's decisions (its exact id), oldest first; lines that are not decisions left out.
    Given when the run `started`, the segments rotated before it are not read (module doc)."""
    lines = read(state_dir, run_id, live_only, started)
    return (line for line in lines if isinstance(line, Decision) and line.run_id == run_id)


def summarize(state_dir: Path, run_id: str) -> EgressSum:
    """The running wake's decisions summed for its receipt; all 0 for a wake that made no
    connection through a proxy (network none or open). Only the live file is read (module
    doc): a wake's end costs the same after a year of history as after a day."""
    return total(of_run(state_dir, run_id, live_only=True))


def total(decisions: Iterable[Decision]) -> EgressSum:
    """Allowed, denied, and the bytes each way whose counts are known (an unknown one adds 0)."""
    allowed = denied = up = down = 0
    for line in decisions:
        if line.allowed:
            allowed += 1
        else:
            denied += 1
        up += line.bytes_up or 0
        down += line.bytes_down or 0
    return EgressSum(*(min(n, MAX_COUNT) for n in (allowed, denied, up, down)))


def runs(state_dir: Path) -> list[str]:
    """The run ids with decisions, in the order their first decision was written."""
    seen: dict[str, None] = {}
    for line in read(state_dir):
        if line.run_id:
            seen.setdefault(line.run_id, None)
    return list(seen)


# -- one field at a time, for both directions -----------------------------------------------------


def _text(value: object, cap: int) -> str:
    """A string field cleaned of control and bidi characters, cut to `cap` UTF-8 bytes; "" if not a string."""
    if not isinstance(value, str):
        return ""
    value = CONTROL.sub("", value[: cap * 2])  # no more than twice the cap is ever looked at
    raw = value.encode("utf-8", "replace")
    if len(raw) <= cap:
        return value
    return raw[: cap - len(CUT.encode())].decode("utf-8", "ignore") + CUT


def _run_id(value: object) -> str:
    return value if isinstance(value, str) and RUN_ID.fullmatch(value) else ""


def _port(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535 else 0


def _method(value: object) -> str:
    return value.upper() if isinstance(value, str) and METHOD.fullmatch(value) else "?"


def _credential(value: object) -> str:
    if not isinstance(value, str) or not value:
        return ""
    return value if CREDENTIAL.fullmatch(value) else NOT_A_NAME


def _bytes(value: object) -> int | None:
    """A byte count: an int 0..MAX_COUNT; None (unknown) for anything else, a planted huge number included."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None
