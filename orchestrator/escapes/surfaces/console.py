"""Surface probes: the console of `serve --http`, attacked over real HTTP on 127.0.0.1.

The attackers are a web page in the operator's browser and any other local
user (actor C in docs/security.md's threat model), and the model whose words the
console shows (A). Each probe starts a real Console (uvicorn, in a thread of
this process) on 127.0.0.1 and an ephemeral port, for a throwaway ROOT inside
its trial's folder (which the trial removes), sends real requests with
http.client, and judges the answers. None needs a box.

A request is written here exactly as the attacker can make a browser or a
script send it: a rebound name as Host; a session cookie with a forged form;
an `Authorization` header a page cannot make valid. Each probe first checks
that the console answers a proper request, so a console that refuses
everything is INCONCLUSIVE, never HELD.

The console is imported inside the probes, so that `wakeloop escapes` loads
uvicorn and Starlette only when these probes run.

Not here: the console itself (orchestrator/console/), each probe's weakened
control (tests/escapes/test_surfaces_console.py).
"""

from __future__ import annotations

import http.client
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from orchestrator.escapes.lab import Probe, escaped, held
from orchestrator.policy.agent import init_agent

if TYPE_CHECKING:
    from orchestrator.console.auth import Access

CATEGORY = "surfaces"
AGENT = "agent"  # the one agent of each probe's ROOT
REQUEST_TIMEOUT_S = 10  # one request to a console in this process: milliseconds, normally
XSS = "<script>window.__pwned = 1</script>"
INVENTED_TOOLS = 1000  # tool names a model makes up, in one probe


@dataclass
class Answer:
    status: int
    headers: dict
    body: str


@dataclass
class Served:
    """A console under test: its port, token, ROOT, and the requests a probe sends it."""

    port: int
    token: str
    root: Path
    access: Access

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def request(
        self, method: str, path: str, headers: dict | None = None, form: dict | None = None, host: str | None = None
    ) -> Answer:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", host or self.host)
            body = urlencode(form).encode() if form is not None else None
            for key, value in (headers or {}).items():
                conn.putheader(key, value)
            if body is not None:
                conn.putheader("Content-Type", "application/x-www-form-urlencoded")
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            return Answer(
                response.status,
                {k.lower(): v for k, v in response.getheaders()},
                response.read().decode("utf-8", "replace"),
            )
        finally:
            conn.close()

    @property
    def bearer(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def cookie(self) -> dict:
        """The session cookie a signed-in browser holds (what a cross-site form would carry,
        were SameSite=Strict not there)."""
        from orchestrator.console.auth import COOKIE

        return {"Cookie": f"{COOKIE}={self.access.session}"}

    def paused(self) -> bool:
        from orchestrator.records.health import load

        return load(self.root / AGENT / "state").paused


@contextmanager
def console(trial, loopback: bool = True) -> Iterator[Served]:
    """A real Console on 127.0.0.1:0 for ROOT = the trial's folder's console-root/ (one agent)."""
    from orchestrator.console.app import Console, start
    from orchestrator.console.auth import Access

    root = trial.dir / "console-root"
    init_agent(root / AGENT)
    token = secrets.token_urlsafe(24)
    access = Access(token, loopback)
    listening = start(Console(root, access), "127.0.0.1", 0)
    try:
        yield Served(int(listening.url.rstrip("/").rsplit(":", 1)[1]), token, root, access)
    finally:
        listening.stop()


def _answers_its_own(served: Served) -> str | None:
    """Why the probe cannot judge (the console refuses even a proper request), or None."""
    proper = served.request("GET", "/", served.bearer)
    if proper.status != 200 or AGENT not in proper.body:
        return f"the console refused a proper request too ({proper.status}): nothing to judge"
    return None


# -- the probes -----------------------------------------------------------------------------


def console_refuses_foreign_host(trial) -> str:
    """DNS rebinding: a page whose own name now resolves to 127.0.0.1 sends that name as Host.
    Even with the token (a script that has it), a foreign Host is answered by no one."""
    with console(trial) as served:
        unsure = _answers_its_own(served)
        if unsure:
            return unsure
        out = []
        for host in (
            f"rebind.example:{served.port}",
            "rebind.example:8765",
            f"127.0.0.1.nip.io:{served.port}",
            f"127.0.0.1.:{served.port}",
            f"localhost.:{served.port}",
        ):
            for path in ("/", f"/agents/{AGENT}", "/metrics", "/static/console.css"):
                answer = served.request("GET", path, served.bearer, host=host)
                if answer.status != 421:
                    out.append(escaped(f"Host {host} GET {path}: {answer.status}, not 421"))
        return "".join(out) or held("every foreign Host got 421 on every route (pages, /metrics, static)")


def console_reading_needs_the_token_on_loopback(trial) -> str:
    """Any local user reaches a loopback port: without the token nothing but /login is shown."""
    with console(trial) as served:
        unsure = _answers_its_own(served)
        if unsure:
            return unsure
        out = []
        for path in ("/", f"/agents/{AGENT}", "/escapes"):
            answer = served.request("GET", path)
            if answer.status == 200:
                out.append(escaped(f"GET {path} without the token: 200 ({len(answer.body)} bytes)"))
        return "".join(out) or held("on loopback every page without the token is sent to /login")


def console_refuses_a_pre_made_token_file(trial) -> str:
    """Another local user makes ROOT/console.token first (empty and writable by all, or readable
    by all with a token they chose): serve must refuse it, and never write its token into it."""
    from orchestrator.console import auth

    out = []
    for kind in ("empty, writable by all", "readable by all"):
        root = trial.dir / f"token-root-{kind.split(',')[0].split()[0]}"
        root.mkdir()
        planted = root / auth.TOKEN_FILE
        planted.write_text("" if kind.startswith("empty") else secrets.token_urlsafe(24) + "\n")
        planted.chmod(0o666 if kind.startswith("empty") else 0o644)
        before = planted.read_bytes()
        try:
            auth.load_token(root, environ={})
        except auth.TokenError as exc:
            if planted.read_bytes() != before:
                out.append(escaped(f"{kind}: refused, but written into first"))
            elif "chmod 600" not in str(exc) and "rm " not in str(exc):
                out.append(escaped(f"{kind}: refused without saying how to fix it: {exc}"))
            continue
        mode, written = os.stat(planted).st_mode & 0o777, planted.read_bytes() != before
        out.append(
            escaped(
                f"{kind}: used as is (mode {mode:o})"
                + ("; our token written into it" if written else "; its token is the console's")
            )
        )
    return "".join(out) or held("a pre-made console.token (empty and 0666, or 0644) is refused, untouched")


def console_refuses_a_forged_form_with_a_valid_cookie(trial) -> str:
    """A cross-site form posts with the operator's session cookie (were SameSite not there) and no
    or a wrong CSRF field: the action must not happen."""
    with console(trial) as served:
        unsure = _answers_its_own(served)
        if unsure:
            return unsure
        out = []
        for what, form in (("no CSRF field", {}), ("a wrong CSRF field", {"csrf": "0" * 64})):
            answer = served.request("POST", f"/agents/{AGENT}/pause", served.cookie, form=form)
            if answer.status < 400 or served.paused():
                out.append(escaped(f"cookie with {what}: {answer.status}, paused={served.paused()}"))
        return "".join(out) or held("with the session cookie, a form without the right CSRF field is refused")


def console_csrf_holds_whatever_authorization_says(trial) -> str:
    """The old rule skipped CSRF whenever any Authorization header came: a cookie plus
    `Authorization: garbage` acted. A page cannot make that header valid; it must count for nothing."""
    with console(trial) as served:
        unsure = _answers_its_own(served)
        if unsure:
            return unsure
        out = []
        for garbage in ("garbage", "Bearer not-the-token-0000000000", "Basic dXNlcjpwYXNz"):
            answer = served.request(
                "POST", f"/agents/{AGENT}/pause", {**served.cookie, "Authorization": garbage}, form={}
            )
            if answer.status < 400 or served.paused():
                out.append(
                    escaped(f"cookie + Authorization {garbage!r}, no CSRF: {answer.status}, paused={served.paused()}")
                )
        return "".join(out) or held("a cookie plus a garbage Authorization header and no CSRF field is refused")


def console_shows_agent_text_inert(trial) -> str:
    """The model writes markup into its outbox and its transcript: the pages show it as text."""
    from orchestrator.records.state import append_outbox
    from orchestrator.records.transcript import Transcript

    with console(trial) as served:
        sd = served.root / AGENT / "state"
        append_outbox(sd, XSS, wake=1)
        run_id = secrets.token_hex(6)
        transcript = Transcript(sd, run_id, 1 << 20, secrets=())
        transcript.add("wake", run_id=run_id, wake=1, agent=AGENT, model="m", live=False)
        transcript.add(
            "assistant",
            step=1,
            content=[{"type": "text", "text": XSS}, {"type": "tool_use", "id": "t1", "name": XSS, "input": {}}],
        )
        transcript.add("tool_result", step=1, id="t1", tool=XSS, text=XSS, is_error=True, denied=None)
        out = []
        for path in (f"/agents/{AGENT}", f"/agents/{AGENT}/wakes/{run_id}"):
            answer = served.request("GET", path, served.bearer)
            if answer.status != 200:
                return f"GET {path}: {answer.status}: nothing to judge"
            if "<script" in answer.body.lower():
                out.append(escaped(f"GET {path}: the agent's <script> is in the page as markup"))
            elif "&lt;script&gt;" not in answer.body:
                return f"GET {path}: the agent's text is not on the page at all: nothing to judge"
        return "".join(out) or held("the agent's <script> is shown escaped in its outbox and transcript")


def console_metrics_bounded_against_invented_tools(trial) -> str:
    """A model invents tool names: each lands in the event log as a tool_result, which /metrics
    counts. The series /metrics shows must not grow with them."""
    from orchestrator.records.event_types import ToolResult
    from orchestrator.records.events import EVENTS_FILE, EventLog

    with console(trial) as served:
        log = EventLog(served.root / AGENT / "state" / EVENTS_FILE, secrets.token_hex(6), secrets=())
        log.write(ToolResult(tool="invented_first", is_error=True))
        before = _series(served)
        for n in range(INVENTED_TOOLS):
            log.write(ToolResult(tool=f"invented_{n}_{secrets.token_hex(3)}", is_error=True))
        after = _series(served)
        if not before:
            return "/metrics showed no series: nothing to judge"
        grown = len(after - before)
        if grown:
            return escaped(f"{INVENTED_TOOLS} invented tool names made {grown} new series in /metrics")
        return held(f"{INVENTED_TOOLS} invented tool names: /metrics has the same {len(after)} series")


def _series(served: Served) -> set[str]:
    text = served.request("GET", "/metrics").body
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def _probe(attack, expected: str) -> Probe:
    return Probe(attack.__name__, CATEGORY, expected, attack)


PROBES: list = [
    _probe(console_refuses_foreign_host, "a request whose Host is not the console's gets 421 on every route"),
    _probe(console_reading_needs_the_token_on_loopback, "on loopback too, no page is shown without the token"),
    _probe(
        console_refuses_a_pre_made_token_file,
        "a console.token someone else made or others can read is refused, never written into",
    ),
    _probe(
        console_refuses_a_forged_form_with_a_valid_cookie,
        "a form with the cookie but no or a wrong CSRF field acts on nothing",
    ),
    _probe(
        console_csrf_holds_whatever_authorization_says,
        "an Authorization header a page can send does not skip the CSRF check",
    ),
    _probe(console_shows_agent_text_inert, "the agent's <script> is shown as text in its outbox and transcript"),
    _probe(console_metrics_bounded_against_invented_tools, "tool names a model invents mint no metric series"),
]
