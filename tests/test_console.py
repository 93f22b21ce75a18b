"""The console over real HTTP (uvicorn on 127.0.0.1), without a browser: which Host names it answers,
who may read and act, the token file, escaping, bounded metrics, the wake-history index, serve's
--http errors, and the escape suite's button.

Roots are built with the records' own functions (what a wake would leave);
the browser tests (test_console_browser.py) build theirs with real wakes.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from orchestrator import metrics
from orchestrator.console import auth
from orchestrator.console.app import Console, start
from orchestrator.console.auth import Access
from orchestrator.console.escapes import Runner
from orchestrator.fleet.wake_history import WakeIndex
from orchestrator.policy.agent import init_agent
from orchestrator.records.events import EVENTS_FILE, EventLog
from orchestrator.records.health import load as load_health
from orchestrator.records.state import append_outbox, peek_inbox
from orchestrator.records.tasks import load_tasks
from tests.helpers import REPO, run_cli, scrubbed_env, wait_for
from tests.helpers.console import TOKEN, Client

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

    def open_(loopback=True, behind_tls=False, runner=None, public_names=()):
        listening = start(
            Console(root, Access(TOKEN, loopback, behind_tls), runner=runner), "127.0.0.1", 0, public_names
        )
        running.append(listening)
        return Client(listening.url)

    yield open_
    for listening in running:
        listening.stop()


def test_agent_text_is_escaped_and_every_page_forbids_scripts(serve_console):
    client = serve_console().sign_in()
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
        html = Client(listening.url).sign_in().get("/agents/one")[2]
    finally:
        listening.stop()
    assert XSS in html


def test_on_loopback_reading_needs_the_token_and_acting_the_token_and_the_forms_csrf(serve_console, root):
    client = serve_console()
    status, headers, _ = client.get("/agents/one")
    assert status == 303 and headers["location"] == "/login?next=/agents/one"
    assert client.get("/")[0] == 303 and client.get("/metrics")[0] == 200  # /metrics: open on loopback
    assert client.get("/login")[0] == 200 and client.get("/static/console.css")[0] == 200
    status, _, html = client.post("/agents/one/pause", {})
    assert status == 403 and "sign in with the console token first" in html
    assert client.post("/login", {"token": "wrong-token-0000000"})[0] == 403
    client.sign_in()
    assert client.get("/agents/one")[0] == 200
    status, _, html = client.post("/agents/one/pause", {"csrf": "forged"})
    assert status == 403 and "CSRF" in html and not load_health(root / "one" / "state").paused
    csrf = Access(TOKEN, True).csrf
    status, _, _ = client.post("/agents/one/pause", {"csrf": csrf}, Origin="http://evil.example")
    assert status == 403 and not load_health(root / "one" / "state").paused
    for action, form in (
        ("pause", {}),
        ("send", {"text": "hello agent"}),
        ("task", {"title": "sum up"}),
        ("run-now", {}),
    ):
        status, headers, _ = client.post(f"/agents/one/{action}", {"csrf": csrf, **form})
        assert status == 303 and headers["location"] == f"/agents/one?said={action}", action
    sd = root / "one" / "state"
    assert load_health(sd).paused and "hello agent" in peek_inbox(sd)
    assert [t.title for t in load_tasks(sd)] == ["sum up"] and (sd / "run-now").exists()
    assert "one wake requested" in client.get("/agents/one?said=run-now")[2]
    assert 'action="/agents/one/task-cancel"' in client.get("/agents/one")[2]  # each open task has its buttons
    assert client.post("/agents/one/task", {"csrf": csrf, "title": "then this"})[0] == 303
    for action in ("task-cancel", "task-rm"):  # as `wakeloop task cancel|rm`
        status, headers, _ = client.post(f"/agents/one/{action}", {"csrf": csrf, "id": "t1"})
        assert status == 303 and headers["location"] == f"/agents/one?said={action}", action
    assert client.post("/agents/one/task-cancel", {"csrf": csrf, "id": "t9"})[0] == 400  # one line: no such task
    assert [(t.id, t.status) for t in load_tasks(sd)] == [("t2", "todo")]


def test_a_foreign_host_gets_421_on_every_route_and_only_the_consoles_names_are_answered(serve_console):
    """DNS rebinding: a page whose own name now points at 127.0.0.1 sends its own name as Host."""
    client = serve_console(public_names=("console.example.org", "proxy.example.org:8443"))
    port, bearer = client.port, ("Authorization", f"Bearer {TOKEN}")
    for host in (
        "rebind.example:8765",
        f"rebind.example:{port}",
        f"127.0.0.1.nip.io:{port}",
        f"127.0.0.1.:{port}",
        f"localhost.:{port}",
        f"127.0.0.1:{port + 1}",
        f"127.1:{port}",
        f"[::ffff:127.0.0.1]:{port}",
        f"[0:0:0:0:0:0:0:1]:{port}",
        "proxy.example.org:443",
        f"console.example.org.evil:{port}",
        f"127.0.0.1:{port}@evil.example",
        "",
    ):
        for method, path in (
            ("GET", "/"),
            ("GET", "/agents/one"),
            ("GET", "/metrics"),
            ("GET", "/static/console.css"),
            ("GET", f"/login?token={TOKEN}"),
            ("POST", "/agents/one/pause"),
        ):
            status, _, body = client.raw(method, path, [("Host", host), bearer], b"" if method == "POST" else None)
            assert status == 421 and len(body.strip().splitlines()) == 1, (host, path, status)
    status, _, body = client.raw("GET", "/metrics", [("Host", f"127.0.0.1:{port}"), ("Host", "rebind.example")])
    assert status in (400, 421), "two Host headers: answered by no one (uvicorn's h11 says 400 first)"
    for target in (f"http://rebind.example:{port}/agents/one", f"http://127.0.0.1:{port}/agents/one"):
        status, _, body = client.raw("GET", target, [("Host", f"127.0.0.1:{port}"), bearer])
        assert status == 421 and body.startswith("421: a request for an absolute URL"), target
    for host in (
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        f"LocalHost:{port}",
        f"[::1]:{port}",
        "console.example.org",
        "console.example.org:8080",
        "proxy.example.org:8443",
    ):
        assert client.raw("GET", "/agents/one", [("Host", host), bearer])[0] == 200, host


def test_the_sign_in_url_sets_the_session_and_sends_the_browser_on_without_the_token(serve_console):
    client = serve_console()
    status, headers, _ = client.get(f"/login?token={TOKEN}&next=/agents/one")
    assert status == 303 and headers["location"] == "/agents/one" and TOKEN not in headers["location"]
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=strict" in headers["set-cookie"]
    assert client.get("/agents/one")[0] == 200
    stranger = Client(client.url)
    status, _, html = stranger.get("/login?token=not-the-token-at-all")
    assert status == 403 and "not the console token" in html and stranger.get("/")[0] == 303
    status, headers, _ = stranger.get(f"/login?token={TOKEN}&next=//evil.example/")
    assert status == 303 and headers["location"] == "/"


def test_an_action_checks_csrf_whatever_authorization_header_comes_with_it(serve_console, root):
    """The old rule skipped the CSRF check whenever any Authorization header was present: a cookie
    plus `Authorization: garbage` acted without the form's field (shown against the old auth.py)."""
    client = serve_console().sign_in()
    sd = root / "one" / "state"
    for authorization in ("garbage", "Bearer wrong-token-000000000", "Basic dXNlcjpwYXNz", f"Bearer {TOKEN}"):
        status, _, html = client.post("/agents/one/pause", {}, Authorization=authorization)
        assert status == 403 and "CSRF" in html and not load_health(sd).paused, authorization
    script = Client(client.url)  # no cookie at all: a script holding the token
    assert script.post("/agents/one/pause", {}, Authorization="Bearer garbage")[0] == 403
    status, _, html = script.post(
        "/agents/one/pause", {}, Authorization=f"Bearer {TOKEN}", Origin="http://evil.example"
    )
    assert status == 403 and "evil.example" in html and not load_health(sd).paused
    assert script.post("/agents/one/pause", {}, Authorization=f"Bearer {TOKEN}")[0] == 303
    assert load_health(sd).paused
    csrf = Access(TOKEN, True).csrf
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}, {"Origin": "null"}):
        status, _, _ = client.post("/agents/one/resume", {"csrf": csrf}, **headers)
        assert status == 403 and load_health(sd).paused, headers
    assert client.post("/agents/one/resume", {"csrf": csrf}, **{"Sec-Fetch-Site": "same-origin"})[0] == 303
    assert not load_health(sd).paused


def test_no_cross_origin_script_is_ever_granted_a_preflight(serve_console):
    """What keeps a cross-site page from sending Authorization: no CORS header, ever."""
    client = serve_console()
    status, headers, _ = client.raw(
        "OPTIONS",
        "/agents/one/pause",
        [
            ("Host", f"127.0.0.1:{client.port}"),
            ("Origin", "http://evil.example"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization"),
        ],
    )
    assert status in (401, 403, 405) and not any(k.startswith("access-control-") for k in headers)


def test_off_loopback_reading_needs_the_token_and_actions_need_tls_in_front(serve_console, root):
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
    status, headers, _ = behind.post("/login", {"token": TOKEN, "next": "/"})
    assert status == 303 and "Secure" in headers["set-cookie"]  # sent back only over the proxy's TLS
    # (The old form of this test got its 303 from the redirect to /login: urllib never sends a
    # Secure cookie over http. The TLS proxy would; here the cookie is sent as it would forward it.)
    session = f"{auth.COOKIE}={Access(TOKEN, False).session}"
    status, headers, _ = behind.post("/agents/two/pause", {"csrf": Access(TOKEN, False).csrf}, Cookie=session)
    assert status == 303 and headers["location"] == "/agents/two?said=pause"
    assert load_health(root / "two" / "state").paused


def test_login_never_redirects_off_the_console(serve_console):
    client = serve_console()
    for target in ("//evil.example/x", "https://evil.example", "/\\evil.example"):
        status, headers, _ = client.post("/login", {"token": TOKEN, "next": target})
        assert status == 303 and headers["location"] == "/"


def test_the_token_is_generated_once_kept_private_and_a_short_one_is_refused(tmp_path):
    token, said = auth.load_token(tmp_path, environ={})
    kept = tmp_path / auth.TOKEN_FILE
    assert token not in said and kept.read_text().strip() == token and kept.stat().st_mode & 0o777 == 0o600
    again, said = auth.load_token(tmp_path, environ={})
    assert again == token and token not in said
    assert auth.load_token(tmp_path, environ={auth.TOKEN_ENV: TOKEN}) == (TOKEN, f"token from {auth.TOKEN_ENV}")
    with pytest.raises(auth.TokenError, match="too short"):
        auth.load_token(tmp_path, environ={auth.TOKEN_ENV: "short"})


def _planted(root: Path, kind: str) -> Path:
    path = root / auth.TOKEN_FILE
    if kind == "world-readable":
        path.write_text(TOKEN + "\n")
        path.chmod(0o644)
    elif kind == "empty, someone else's":
        path.touch(mode=0o666)
        path.chmod(0o666)
        os.chown(path, 4242, 4242)
    elif kind == "someone else's":
        path.write_text(TOKEN + "\n")
        path.chmod(0o600)
        os.chown(path, 4242, 4242)
    elif kind == "empty, ours":
        path.touch(mode=0o600)
    elif kind == "a link":
        (root / "elsewhere").write_text(TOKEN + "\n")
        (root / "elsewhere").chmod(0o600)
        path.symlink_to(root / "elsewhere")
    elif kind == "a dangling link":
        path.symlink_to(root / "nowhere")
    elif kind == "a folder":
        path.mkdir()
    elif kind == "a fifo":
        os.mkfifo(path, 0o600)
    return path


@pytest.mark.parametrize(
    "kind",
    [
        "world-readable",
        "empty, someone else's",
        "someone else's",
        "empty, ours",
        "a link",
        "a dangling link",
        "a folder",
        "a fifo",
    ],
)
def test_a_pre_made_token_file_is_refused_in_one_line_and_never_written(tmp_path, kind):
    path = _planted(tmp_path, kind)
    before = os.lstat(path)
    with pytest.raises(auth.TokenError) as refused:
        auth.load_token(tmp_path, environ={})
    line = str(refused.value)
    assert len(line.splitlines()) == 1 and str(path) in line and ("chmod 600" in line or "rm " in line)
    after = os.lstat(path)
    assert (after.st_mode, after.st_size, after.st_uid) == (before.st_mode, before.st_size, before.st_uid)
    if kind == "a dangling link":
        assert not (tmp_path / "nowhere").exists()


def test_serve_prints_a_sign_in_url_that_works_and_refuses_a_world_readable_token_in_one_line(root):
    planted = root / auth.TOKEN_FILE
    planted.write_text(TOKEN + "\n")
    planted.chmod(0o644)
    bad = run_cli("serve", str(root), "--http", "127.0.0.1:0")
    assert bad.returncode == 2 and f"chmod 600 {planted}" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    planted.unlink()
    serve = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "serve", str(root), "--http", "127.0.0.1:0", "--max-concurrent", "1"],
        cwd=REPO,
        env=scrubbed_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        for line in serve.stdout:
            lines.append(line)
            if "sign in at" in line:
                break
        url = re.search(r"console: sign in at (http://127\.0\.0\.1:\d+/login\?token=\S+)", "".join(lines))
        assert url, lines
        token = planted.read_text().strip()
        assert url.group(1).endswith(f"token={token}") and planted.stat().st_mode & 0o777 == 0o600
        assert sum(token in line for line in lines) == 1, "the token is printed once, in the sign-in URL"
        client = Client(url.group(1).split("login?")[0])
        status, headers, _ = client.get(url.group(1).split("/", 3)[3])
        assert status == 303 and headers["location"] == "/" and client.get("/")[0] == 200
    finally:
        serve.terminate()
        serve.wait(timeout=60)


def test_serve_says_in_one_line_when_it_cannot_listen(root):
    bad = run_cli("serve", str(root), "--http", "nonsense")
    assert bad.returncode == 2 and "is not HOST:PORT" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = run_cli("serve", str(root), "--http", f"127.0.0.1:{port}")
        taken_metrics = run_cli("serve", str(root), "--http", "127.0.0.1:0", "--metrics", f"127.0.0.1:{port}")
    assert busy.returncode == 2 and "cannot listen there" in busy.stderr
    assert taken_metrics.returncode == 2 and f"--metrics 127.0.0.1:{port}: cannot listen there" in taken_metrics.stderr
    named = run_cli("serve", str(root), "--http", "127.0.0.1:0", "--public-name", "evil.example/x")
    assert named.returncode == 2 and "--public-name 'evil.example/x' is not a host name" in named.stderr
    assert len(named.stderr.strip().splitlines()) == 1
    assert "--metrics" in run_cli("serve", "--help").stdout


def test_the_wake_index_reads_each_file_once_follows_the_live_log_and_survives_rotation(tmp_path):
    sd = tmp_path / "state"
    sd.mkdir()

    def finish(n: int):
        EventLog(sd / EVENTS_FILE, f"run{n:04d}", secrets=()).emit(
            "wake_finished", status="done", receipt={"run_id": f"run{n:04d}", "wake": n, "status": "done"}
        )
        EventLog(sd / EVENTS_FILE, f"run{n:04d}", secrets=()).emit("tool_call", tool="bash")

    index = WakeIndex()
    for n in range(1, 4):
        finish(n)
    assert [w["wake"] for w in index.recent(sd)[1]] == [1, 2, 3]
    finish(4)
    assert [w["wake"] for w in index.recent(sd)[1]] == [1, 2, 3, 4]
    segment = sd / "events-20260101T000000000000Z.jsonl.gz"  # what retention.py leaves
    with open(sd / EVENTS_FILE, "rb") as live, gzip.open(segment, "wb") as out:
        shutil.copyfileobj(live, out)
    os.unlink(sd / EVENTS_FILE)
    finish(5)
    assert [w["wake"] for w in index.recent(sd)[1]] == [1, 2, 3, 4, 5]
    assert index.recent(sd, 2) == (5, index.recent(sd)[1][-2:])
    with open(sd / EVENTS_FILE, "a") as live:
        live.write(json.dumps({"run_id": "x", "type": "wake_finished"})[:20])  # a torn last line waits
    assert [w["wake"] for w in index.recent(sd)[1]] == [1, 2, 3, 4, 5]


@pytest.mark.docker
def test_the_escapes_button_runs_the_suite_in_the_background_and_its_report_is_shown(
    serve_console, tmp_path, monkeypatch
):
    monkeypatch.setenv("WAKELOOP_REPORTS", str(tmp_path / "reports"))
    client = serve_console(runner=Runner(("--probe", "blocks_proc_1_root"))).sign_in()
    assert "No report yet" in client.get("/escapes")[2]
    status, headers, _ = client.post(
        "/escapes/run", {"csrf": Access(TOKEN, True).csrf, "runtime": "runc", "policy": "default"}
    )
    assert status == 303 and headers["location"] == "/escapes?said=escapes"
    page = client.get("/escapes")[2]
    assert "runtime runc, policy default" in page and 'http-equiv="refresh"' in page

    def reported():
        page = client.get("/escapes")[2]
        return page if "every probe held" in page and "No report yet" not in page else None

    page = wait_for(reported, "the run's report on the page", 180)
    assert "blocks_proc_1_root" in page and "1 probes" in page
    assert (
        client.post("/escapes/run", {"csrf": Access(TOKEN, True).csrf, "runtime": "nope", "policy": "default"})[0]
        == 409
    )


def series(client: Client) -> set[str]:
    """Every sample line's name and labels in /metrics: one per series."""
    text = client.get("/metrics")[2]
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_the_metrics_tool_label_is_the_registrys_tools_and_nothing_else(tmp_path):
    from dataclasses import replace

    from orchestrator.policy.schema import MemoryTool, Policy
    from orchestrator.records.tasks import Task
    from orchestrator.wake.task_tools import complete_task_tools
    from orchestrator.wake.tools import build_registry

    every = Policy(tools=replace(Policy().tools, memory=MemoryTool(enabled=True)))  # every tool offered
    registry = build_registry(
        every,
        None,
        outbox=lambda text: None,
        extra=complete_task_tools(tmp_path, "run", Task("t1", "x"), every.tools),
    )
    assert set(metrics.TOOLS) == set(registry.names())


@pytest.mark.docker
def test_a_model_that_invents_a_thousand_tool_names_mints_no_series(serve_console, root, tmp_path):
    """Two dry-run wakes of a scripted model, in this process under a console: the first calls one
    invented tool, the second 1,000 more; /metrics has exactly the same series after both."""
    from orchestrator.policy.agent import load_agent
    from orchestrator.wake.loop import wake

    client = serve_console()
    agent = load_agent(root / "one")

    def invent(names: list[str]) -> Path:
        script = tmp_path / f"invent-{len(names)}.json"
        script.write_text(
            json.dumps(
                [{"text": "Inventing.", "tool_calls": [{"name": n, "input": {}} for n in names]}, {"text": "Done."}]
            )
        )
        return script

    assert wake(agent, script=invent(["made_up_0"])).status == "done"
    before = series(client)
    invented = [f"made_up_{i}_{os.urandom(3).hex()}" for i in range(1000)]
    assert wake(agent, script=invent(invented)).status == "done"
    after = series(client)
    assert after == before, sorted(after ^ before)[:10]
    text = client.get("/metrics")[2]
    assert "made_up_" not in text and 'tool="other"' in text and 'agent="one"' in text


def test_metrics_labels_come_from_bounded_sets_whatever_an_event_says(root, tmp_path):
    """Events as a wake writes them (records/events.py), with names no agent or model should mint."""
    metrics.install()
    metrics.watch_root(root)
    stray = init_agent(tmp_path / "elsewhere" / "stray")  # an agent folder outside ROOT
    for sd, agent in ((root / "one" / "state", "one"), (stray / "state", "other")):
        log = EventLog(sd / EVENTS_FILE, "run-bounded", secrets=())
        log.emit("wake_started", agent="forged-name", model="m" * 500)
        log.emit("model_response", model="invented model name \n with newline", usage={"input_tokens": 1})
        log.emit("tool_result", tool="<script>", is_error=False)
        log.emit("wake_finished", status="status-from-nowhere", receipt={"usd": 0.01, "model": "x" * 300})
        assert metrics.agent_label(sd / EVENTS_FILE) == agent
    assert metrics.tool_label("<script>") == "other" and metrics.tool_label("bash") == "bash"
    assert metrics.model_label("m" * 500) == "other" and metrics.model_label("a\nb") == "other"
    text = metrics.exposition()[0].decode()
    for minted in (
        "forged-name",
        "mmmmmmmmmm",
        "invented model",
        "<script>",
        "status-from-nowhere",
        "xxxxxxxxxx",
        'agent="stray"',
    ):
        assert minted not in text, minted


def test_metrics_alone_answer_only_their_own_host_names():
    from orchestrator.console.hosts import Hosts

    server = metrics.serve_alone("127.0.0.1:0", lambda bound: Hosts.of("127.0.0.1", bound).answers)
    try:
        client = Client(f"http://127.0.0.1:{server.server_port}/")
        status, _, text = client.raw("GET", "/metrics", [("Host", f"127.0.0.1:{server.server_port}")])
        assert status == 200 and "wakeloop_" in text
        for host in ("rebind.example", f"rebind.example:{server.server_port}", f"localhost.:{server.server_port}"):
            status, _, text = client.raw("GET", "/metrics", [("Host", host)])
            assert status == 421 and "wakeloop_" not in text, host
    finally:
        server.shutdown()
        server.server_close()


def test_an_agent_folder_that_is_a_link_is_neither_shown_nor_acted_on(serve_console, root, tmp_path):
    outside = init_agent(tmp_path / "elsewhere" / "outside")
    (root / "link").symlink_to(outside)
    client = serve_console().sign_in()
    assert client.get("/agents/link")[0] == 404 and 'id="agent-link"' not in client.get("/")[2]
    assert client.post("/agents/link/pause", {"csrf": Access(TOKEN, True).csrf})[0] == 404
    assert not load_health(outside / "state").paused


def test_only_the_login_page_and_the_stylesheet_are_open_not_paths_that_start_like_them(serve_console):
    client = serve_console()
    for path in (
        "/login/../agents/one",
        "/loginx",
        "/static/../agents/one",
        "/static/console.css/../../agents/one",
        "/favicon.ico/../agents/one",
    ):
        status, headers, _ = client.raw("GET", path, [("Host", f"127.0.0.1:{client.port}")])
        assert status == 303 and headers["location"].startswith("/login?next="), path


def test_healthz_needs_no_token_says_only_ok_and_is_what_compose_checks(serve_console):
    from orchestrator import healthcheck

    client = serve_console()
    status, _, body = client.get("/healthz")
    assert (status, body) == (200, "ok\n")
    assert client.raw("GET", "/healthz", [("Host", "rebind.example")])[0] == 421  # the Host check first
    assert client.raw("GET", "/healthz/../agents/one", [("Host", f"127.0.0.1:{client.port}")])[0] == 303
    assert healthcheck.console(client.url + "healthz") is None
    assert healthcheck.main(["console", client.url + "healthz"]) == 0
    assert "console at" in healthcheck.console(client.url + "agents/one")  # the login redirect is no "ok"


def test_under_compose_the_published_port_is_a_public_name_and_the_sign_in_url_uses_it():
    """compose.override.yaml: `--http 0.0.0.0:8765 --published-on-loopback --public-name 127.0.0.1:${PORT}`."""
    from orchestrator.console.hosts import Hosts
    from orchestrator.console.listen import Options, sign_in_url

    options = Options("0.0.0.0:8765", published_on_loopback=True, public_names=("127.0.0.1:18765",))
    hosts = Hosts.of("0.0.0.0", 8765, options.public_names, options.published_on_loopback)
    for host in ("127.0.0.1:18765", "localhost:18765", "localhost", "[::1]:4000", "0.0.0.0:8765"):
        assert hosts.answers(host), host
    for host in ("rebind.example:18765", "127.0.0.1.nip.io:18765", "host.docker.internal:8765", None):
        assert not hosts.answers(host), host
    assert sign_in_url("http://0.0.0.0:8765/", options, "tok/en+") == "http://127.0.0.1:18765/login?token=tok%2Fen%2B"
    v6 = Hosts.of("::1", 8765)
    assert v6.answers("[::1]:8765") and v6.answers("localhost:8765") and not v6.answers("[::1]:8766")
    with pytest.raises(ValueError, match="not a host name"):
        Hosts.of("127.0.0.1", 8765, ("evil.example/path",))
