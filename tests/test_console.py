"""The console over real HTTP (uvicorn on 127.0.0.1), without a browser: who may read and act,
escaping, the wake-history index, serve's --http errors, and the escape suite's button.

Roots are built with the records' own functions (what a wake would leave);
the browser tests (test_console_browser.py) build theirs with real wakes.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import urllib.error
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import jinja2
import pytest

from orchestrator.console import auth
from orchestrator.console.app import Console, start
from orchestrator.console.auth import Access
from orchestrator.console.escapes import Runner
from orchestrator.fleet.history import WakeIndex
from orchestrator.notify.health import load as load_health
from orchestrator.policy.agent import init_agent
from orchestrator.records.events import EVENTS_FILE, EventLog
from orchestrator.records.state import append_outbox, peek_inbox
from orchestrator.records.tasks import load_tasks
from support import run_cli, wait_for

TOKEN = "unit-test-token-0a9b8c7d"
XSS = '<script>alert("x")</script>'


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "agents"
    for name in ("one", "two"):
        init_agent(root / name)
    append_outbox(root / "one" / "state", XSS, wake=1)
    return root


@pytest.fixture
def serve_console(root):
    running = []

    def open_(loopback=True, behind_tls=False, runner=None):
        listening = start(Console(root, Access(TOKEN, loopback, behind_tls), runner=runner), "127.0.0.1", 0)
        running.append(listening)
        return Client(listening.url)
    yield open_
    for listening in running:
        listening.stop()


class Client:
    """urllib with cookies; no redirect followed, so a 303 is seen as one."""

    def __init__(self, url: str):
        self.url = url
        self.jar = CookieJar()

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args):
                return None
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), NoRedirect)

    def get(self, path: str, **headers):
        return self._open(urllib.request.Request(self.url + path.lstrip("/"), headers=headers))

    def post(self, path: str, form: dict, **headers):
        body = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in form.items()).encode()
        return self._open(urllib.request.Request(self.url + path.lstrip("/"), data=body, method="POST",
                                                 headers={"Content-Type": "application/x-www-form-urlencoded",
                                                          **headers}))

    def _open(self, request):
        try:
            with self.opener.open(request, timeout=30) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read().decode()

    def sign_in(self):
        status, headers, _ = self.post("/login", {"token": TOKEN, "next": "/"})
        assert status == 303 and headers["location"] == "/"


def test_agent_text_is_escaped_and_every_page_forbids_scripts(serve_console):
    client = serve_console()
    status, headers, html = client.get("/agents/one")
    assert status == 200
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html and XSS not in html
    assert "<script" not in html.lower()
    assert headers["content-security-policy"].startswith("default-src 'none'")
    assert headers["x-content-type-options"] == "nosniff" and headers["cache-control"] == "no-store"
    assert client.get("/agents/..%2f..%2fetc")[0] == 404
    assert client.get("/agents/one/wakes/..%2fprompts")[0] == 404


def test_the_escaping_check_fails_against_a_console_that_does_not_escape(root):
    """The weakened control: with autoescaping off, the same check sees the raw <script>."""
    weak = Console(root, Access(TOKEN, True))
    escaping = weak.env
    weak.env = jinja2.Environment(loader=escaping.loader, autoescape=False, undefined=jinja2.StrictUndefined)
    weak.env.filters.update(escaping.filters)
    weak.env.globals.update(escaping.globals)
    listening = start(weak, "127.0.0.1", 0)
    try:
        html = Client(listening.url).get("/agents/one")[2]
    finally:
        listening.stop()
    assert XSS in html


def test_on_loopback_reading_is_open_and_acting_needs_the_token_and_the_forms_csrf(serve_console, root):
    client = serve_console()
    assert client.get("/")[0] == 200 and client.get("/metrics")[0] == 200
    status, _, html = client.post("/agents/one/pause", {})
    assert status == 403 and "sign in with the console token first" in html
    assert client.post("/login", {"token": "wrong-token-0000000"})[0] == 403
    client.sign_in()
    status, _, html = client.post("/agents/one/pause", {"csrf": "forged"})
    assert status == 403 and "CSRF" in html and not load_health(root / "one" / "state").paused
    csrf = Access(TOKEN, True).csrf
    status, _, _ = client.post("/agents/one/pause", {"csrf": csrf}, Origin="http://evil.example")
    assert status == 403 and not load_health(root / "one" / "state").paused
    for action, form in (("pause", {}), ("send", {"text": "hello agent"}), ("task", {"title": "sum up"}),
                         ("run-now", {})):
        status, headers, _ = client.post(f"/agents/one/{action}", {"csrf": csrf, **form})
        assert status == 303 and headers["location"] == f"/agents/one?said={action}", action
    sd = root / "one" / "state"
    assert load_health(sd).paused and "hello agent" in peek_inbox(sd)
    assert [t.title for t in load_tasks(sd)] == ["sum up"] and (sd / "run-now").exists()
    assert "one wake requested" in client.get("/agents/one?said=run-now")[2]


def test_off_loopback_reading_needs_the_token_and_actions_need_tls_in_front(serve_console):
    client = serve_console(loopback=False)
    status, headers, _ = client.get("/agents/one")
    assert status == 303 and headers["location"] == "/login?next=/agents/one"
    assert client.get("/metrics")[0] == 401
    assert client.get("/metrics", Authorization=f"Bearer {TOKEN}")[0] == 200
    client.sign_in()
    assert client.get("/")[0] == 200
    status, _, html = client.post("/agents/one/pause", {"csrf": Access(TOKEN, False).csrf})
    assert status == 403 and "without TLS in front" in html
    behind = serve_console(loopback=False, behind_tls=True)
    behind.sign_in()
    assert behind.post("/agents/two/pause", {"csrf": Access(TOKEN, False).csrf})[0] == 303


def test_login_never_redirects_off_the_console(serve_console):
    client = serve_console()
    for target in ("//evil.example/x", "https://evil.example", "/\\evil.example"):
        status, headers, _ = client.post("/login", {"token": TOKEN, "next": target})
        assert status == 303 and headers["location"] == "/"


def test_the_token_is_generated_once_kept_private_and_a_short_one_is_refused(tmp_path):
    token, said = auth.load_token(tmp_path, environ={})
    kept = tmp_path / auth.TOKEN_FILE
    assert token in said and kept.read_text().strip() == token and kept.stat().st_mode & 0o777 == 0o600
    again, said = auth.load_token(tmp_path, environ={})
    assert again == token and token not in said
    assert auth.load_token(tmp_path, environ={auth.TOKEN_ENV: TOKEN}) == (TOKEN, f"token from {auth.TOKEN_ENV}")
    with pytest.raises(auth.TokenError, match="too short"):
        auth.load_token(tmp_path, environ={auth.TOKEN_ENV: "short"})


def test_serve_says_in_one_line_when_it_cannot_listen(root):
    bad = run_cli("serve", str(root), "--http", "nonsense")
    assert bad.returncode == 2 and "is not HOST:PORT" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = run_cli("serve", str(root), "--http", f"127.0.0.1:{port}")
    assert busy.returncode == 2 and "cannot listen there" in busy.stderr
    assert "--metrics" in run_cli("serve", "--help").stdout


def test_the_wake_index_reads_each_file_once_follows_the_live_log_and_survives_rotation(tmp_path):
    sd = tmp_path / "state"
    sd.mkdir()

    def finish(n: int):
        EventLog(sd / EVENTS_FILE, f"run{n:04d}", secrets=()).emit(
            "wake_finished", status="done", receipt={"run_id": f"run{n:04d}", "wake": n, "status": "done"})
        EventLog(sd / EVENTS_FILE, f"run{n:04d}", secrets=()).emit("tool_call", tool="bash")
    index = WakeIndex()
    for n in range(1, 4):
        finish(n)
    assert [w["wake"] for w in index.recent(sd)[1]] == [1, 2, 3]
    finish(4)
    assert [w["wake"] for w in index.recent(sd)[1]] == [1, 2, 3, 4]
    segment = sd / "events-20260101T000000000000Z.jsonl.gz"      # what retention.py leaves
    with open(sd / EVENTS_FILE, "rb") as live, gzip.open(segment, "wb") as out:
        shutil.copyfileobj(live, out)
    os.unlink(sd / EVENTS_FILE)
    finish(5)
    assert [w["wake"] for w in index.recent(sd)[1]] == [1, 2, 3, 4, 5]
    assert index.recent(sd, 2) == (5, index.recent(sd)[1][-2:])
    with open(sd / EVENTS_FILE, "a") as live:
        live.write(json.dumps({"run_id": "x", "type": "wake_finished"})[:20])   # a torn last line waits
    assert [w["wake"] for w in index.recent(sd)[1]] == [1, 2, 3, 4, 5]


@pytest.mark.docker
def test_the_escapes_button_runs_the_suite_in_the_background_and_its_report_is_shown(serve_console, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.setenv("WAKELOOP_REPORTS", str(tmp_path / "reports"))
    client = serve_console(runner=Runner(("--probe", "blocks_proc_1_root")))
    assert "No report yet" in client.get("/escapes")[2]
    client.sign_in()
    status, headers, _ = client.post("/escapes/run", {"csrf": Access(TOKEN, True).csrf, "runtime": "runc",
                                                      "policy": "default"})
    assert status == 303 and headers["location"] == "/escapes?said=escapes"
    page = client.get("/escapes")[2]
    assert "runtime runc, policy default" in page and 'http-equiv="refresh"' in page
    def reported():
        page = client.get("/escapes")[2]
        return page if "every probe held" in page and "No report yet" not in page else None
    page = wait_for(reported, "the run's report on the page", 180)
    assert "blocks_proc_1_root" in page and "1 probes" in page
    assert client.post("/escapes/run", {"csrf": Access(TOKEN, True).csrf, "runtime": "nope",
                                        "policy": "default"})[0] == 409
