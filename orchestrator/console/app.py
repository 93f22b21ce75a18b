"""The console's routes, headers and listener: a Starlette app under uvicorn, in a thread of serve.

Every request is first checked for its Host (hosts.py: 421 unless it is one
of this console's names), then for the token (auth.py: every page needs it;
/metrics is open on a loopback listener, where Prometheus scrapes it; /login
and the stylesheet are open). Every response carries a
Content-Security-Policy that allows no script at all, only this console's
stylesheet, inline SVG and forms posted back here, and refuses to be framed
by anyone else. Actions are POSTs answered with a redirect back to the page
(303), which shows what was done.

`start()` binds the socket first, so a port in use is one line from serve,
not a thread that died quietly.

Not here: who may do what (auth.py), which names are answered (hosts.py),
what a page holds (pages.py), the markup (templates/), what serve prints at
start (listen.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, quote

import anyio
import jinja2
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from orchestrator import metrics
from orchestrator.assets import SHIPPED_POLICIES
from orchestrator.console import approval_pages, template_cache
from orchestrator.console import pages as pages_mod
from orchestrator.console.auth import COOKIE, Access
from orchestrator.console.charts import bars
from orchestrator.console.escapes import RUNTIMES, Runner
from orchestrator.console.hosts import Hosts, bind, refused_line
from orchestrator.errors import ConfigError
from orchestrator.fleet.control import request_run
from orchestrator.records import escape_reports, stopswitch
from orchestrator.records.health import set_paused
from orchestrator.records.state import send_message_to_agent
from orchestrator.records.tasks import add_task
from orchestrator.records.tasks import cancel as cancel_task
from orchestrator.records.tasks import remove as remove_task
from orchestrator.safeio.shown import shown

HERE = Path(__file__).parent
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; frame-src 'self'; "
    "frame-ancestors 'self'; form-action 'self'; base-uri 'none'"
)
MAX_FORM_BYTES = 64 * 1024  # a message or a task title, with room
LIVE_REFRESH_S = 2  # a running wake's frame reloads this often
FLEET_REFRESH_S = 10  # the fleet page reloads this often: states change without anyone asking
FIRST_VIEW_WAIT_S = 2.0  # the warm-up reads the histories once the first fleet view is answered,
# or after this long (a browser left open across the restart asks at once)
WARM_PAGE_WAIT_S = 15.0  # a view asked during the warm-up waits this long at most for its page, then
# makes its own (a warm-up that slow is stuck on something a second pass would be stuck on too)
SAID = {
    "run-now": "one wake requested: it starts within seconds",
    "pause": "paused: serve runs none of its ticks until resumed",
    "resume": "resumed: failures forgotten, ticks run again",
    "send": "message queued for the next live wake",
    "task": "task queued",
    "task-cancel": "task cancelled: no wake takes it",
    "task-rm": "task removed from the list",
    "escapes": "the escape suite started",
    "login": "signed in",
    "stop": "stopped: nothing starts, running calls are killed, running wakes end `stopped`",
    "start": "started: the fleet runs again from the next ticks",
    "approved": "approved: the call runs at the start of the agent's next wake, requested now",
    "denied": "denied: the agent is told at its next wake",
}
ABSOLUTE_FORM = "421: a request for an absolute URL is for a proxy, and this console is none\n"
TOO_MANY_HOSTS = "421: a request with more than one Host header is answered by no one\n"


@dataclass
class Console:
    root: Path
    access: Access
    poke: Callable[[], None] = lambda: None  # the scheduler looks again now
    runner: Runner | None = None
    hosts: Hosts | None = None  # set by start() once the port is bound; None answers no one

    def __post_init__(self):
        self.pages = pages_mod.Pages(self.root)
        self.runner = self.runner or Runner()
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        # Compiled once, not at every start; keyed by what the code compiled depends on (autoescape...).
        self.env.bytecode_cache = template_cache.bytecode_cache(self.env)
        # `shown`: the model's own text with controls and bidi overrides written out (\u202e), so a
        # person approves exactly what reads on the page
        self.env.filters.update(money=_money, seconds=_seconds, shown=lambda text: shown(str(text), keep="\n\t"))
        self.env.globals.update(bars=bars, SAID=SAID)
        if not metrics.enabled():
            metrics.install()
        metrics.watch_root(self.root)  # its agents, and only they, are `agent` label values
        self.warmed = threading.Event()
        self._viewed = threading.Event()  # the first fleet view has been answered
        # A fleet view asked while the warm-up makes its first page is answered with that page (one
        # for a person signed in, one for not), instead of making its own beside it: two passes at
        # once, each at half speed, and the second over again (0.8-1.3 s for the first view after
        # a restart of 100 agents under load: bench/console.py). Later views make their own.
        self._warm_pages: dict[bool, str] = {}  # signed in? -> the warm-up's fleet page
        self._warm_paged = threading.Event()  # the warm-up's pages are made (or could not be)
        # The first view of a big fleet reads every agent (~4 ms each; a stat per file when the
        # rows kept on disk stand), and of an agent its history (~0.1 s for a year; a stat per
        # file when its index on disk stands); the templates compile in ~0.1 s: done now, off the
        # request, the fleet page's first (it is the one a person opens).
        threading.Thread(target=self._warm, name="wakeloop-console-warm", daemon=True).start()

    def _warm(self) -> None:
        try:
            try:
                page, fleet = self._fleet_html(False, None, "/")  # compiled, its charts drawn
                signed = self._html("fleet.html", True, None, "/", refresh=FLEET_REFRESH_S, **fleet)
                self._warm_pages.update({False: page, True: signed})
            finally:
                self._warm_paged.set()
            anyio.run(anyio.sleep, 0)  # the request path's event-loop backend, imported now (~25 ms)
            rows = fleet["rows"]
            # The rest is for later views: a person who opened the console as serve restarted
            # is answered first, not made to share the CPU with it.
            self._viewed.wait(FIRST_VIEW_WAIT_S)
            self._warm_pages.clear()  # from here views make their own: the warm-up's pages age
            for template in self.env.list_templates(".html"):
                self.env.get_template(template)  # compiled once, here, not on a person's first view
            for row in rows:
                self.pages.wakes.recent(self.root / row["dir_name"] / "state")
        except Exception:
            pass  # the page itself will say what is wrong when asked
        self.warmed.set()

    # -- plumbing -------------------------------------------------------------------------

    def app(self) -> Starlette:
        routes = [
            Route("/", self.fleet),
            Route("/agents/{name}", self.agent),
            Route("/agents/{name}/wakes/{run_id}", self.wake),
            Route("/agents/{name}/wakes/{run_id}/diff", self.wake_diff),
            Route("/agents/{name}/{action}", self.act, methods=["POST"]),
            Route("/fleet/{action}", self.switch, methods=["POST"]),
            Route("/approvals/{token}", self.approval, methods=["GET", "POST"]),
            Route("/escapes", self.escapes),
            Route("/escapes/run", self.run_escapes, methods=["POST"]),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/metrics", self.metrics),
            Route("/static/console.css", self.css),
            Route("/favicon.ico", lambda request: Response(status_code=204)),
            Route("/healthz", lambda request: Response("ok\n", media_type="text/plain")),
        ]
        app = Starlette(routes=routes)
        app.add_middleware(_Guard, console=self)
        return app

    def render(self, request: Request, template: str, status: int = 200, **data) -> HTMLResponse:
        signed_in = self.access.signed_in(request.cookies, request.headers)
        html = self._html(template, signed_in, SAID.get(request.query_params.get("said", "")), request.url.path, **data)
        return HTMLResponse(html, status_code=status)

    def _html(self, template: str, signed_in: bool, said: str | None, path: str, **data) -> str:
        data.setdefault("refresh", 0)
        return self.env.get_template(template).render(
            csrf=self.access.csrf if signed_in else "",
            signed_in=signed_in,
            can_act=self.access.actions_allowed and signed_in,
            actions_allowed=self.access.actions_allowed,
            said=said,
            path=path,
            **data,
        )

    # -- pages ----------------------------------------------------------------------------

    def fleet(self, request: Request):
        try:
            signed_in = self.access.signed_in(request.cookies, request.headers)
            said = SAID.get(request.query_params.get("said", ""))
            if not said and not self._warm_paged.is_set():  # asked during the warm-up: its page
                self._warm_paged.wait(WARM_PAGE_WAIT_S)
                if signed_in in self._warm_pages:
                    return HTMLResponse(self._warm_pages[signed_in])
            html, _ = self._fleet_html(signed_in, said, request.url.path)
            return HTMLResponse(html)
        finally:
            self._viewed.set()

    def _fleet_html(self, signed_in: bool, said: str | None, path: str) -> tuple[str, dict]:
        """The fleet page and its data. A row kept on disk that the page cannot show (a file of
        another version's shape) is forgotten and the rows read afresh: never a broken page."""
        data = {**self.pages.fleet(), "approvals": self._waiting()}
        try:
            return self._html("fleet.html", signed_in, said, path, refresh=FLEET_REFRESH_S, **data), data
        except Exception:
            self.pages.rows.forget_kept()  # once: a page that fails on fresh rows too is a bug, raised
        data = {**self.pages.fleet(), "approvals": self._waiting()}
        return self._html("fleet.html", signed_in, said, path, refresh=FLEET_REFRESH_S, **data), data

    def _waiting(self) -> list[dict]:
        """What waits for a person (console/approval_pages.py); a key that cannot be used says so instead."""
        try:
            return approval_pages.waiting(self.root)
        except (ConfigError, OSError, ValueError) as exc:  # one agent's unreadable files: said, never a 500
            return [{"error": str(exc)}]

    def agent(self, request: Request):
        try:
            data = self.pages.agent(request.path_params["name"])
        except pages_mod.NotFound as exc:
            return self.render(request, "error.html", 404, message=str(exc))
        return self.render(request, "agent.html", **data)

    def wake(self, request: Request):
        try:
            data = self.pages.wake(request.path_params["name"], request.path_params["run_id"])
        except pages_mod.NotFound as exc:
            return self.render(request, "error.html", 404, message=str(exc))
        framed = request.query_params.get("frame") == "1"
        return self.render(request, "wake.html", framed=framed, refresh=LIVE_REFRESH_S if data["live"] else 0, **data)

    def wake_diff(self, request: Request):
        try:
            data = self.pages.wake_diff(request.path_params["name"], request.path_params["run_id"])
        except pages_mod.NotFound as exc:
            return self.render(request, "error.html", 404, message=str(exc))
        return self.render(request, "wake_diff.html", **data)

    def escapes(self, request: Request):
        assert self.runner is not None  # __post_init__ made one
        run = self.runner.last
        return self.render(
            request,
            "escapes.html",
            reports=escape_reports.latest(),
            run=run,
            runtimes=RUNTIMES,
            policies=SHIPPED_POLICIES,
            refresh=LIVE_REFRESH_S if run and run.running else 0,
        )

    def metrics(self, request: Request):
        body, kind = metrics.exposition()
        return Response(body, media_type=kind)

    def css(self, request: Request):
        return FileResponse(HERE / "static" / "console.css", media_type="text/css")

    # -- actions --------------------------------------------------------------------------

    async def act(self, request: Request):
        name, action = request.path_params["name"], request.path_params["action"]
        form, refused = await self._checked(request)
        if refused:
            return refused
        try:
            path = self.pages.agent_dir(name)
            await run_in_threadpool(self._do, path, action, form)
        except pages_mod.NotFound as exc:
            return self.render(request, "error.html", 404, message=str(exc))
        except (ConfigError, ValueError) as exc:
            return self.render(request, "error.html", 400, message=str(exc))
        return RedirectResponse(f"/agents/{quote(name)}?said={action}", status_code=303)

    async def switch(self, request: Request):
        """The one switch (records/stopswitch.py): stop or start every agent under ROOT."""
        action = request.path_params["action"]
        form, refused = await self._checked(request)
        if refused:
            return refused
        if action == "stop":
            who = f"the console ({request.client.host if request.client else 'unknown'})"
            await run_in_threadpool(stopswitch.stop, self.root, form.get("reason", ""), who)
        elif action == "start":
            try:
                await run_in_threadpool(stopswitch.start, self.root)
            except ConfigError as exc:
                return self.render(request, "error.html", 400, message=str(exc))
        else:
            return self.render(request, "error.html", 404, message=f"no action {action!r}")
        self.poke()
        return RedirectResponse(f"/?said={action}", status_code=303)

    def _do(self, path: Path, action: str, form: dict) -> None:
        """The CLI's own functions: run-now, pause, resume, send, task add, cancel and rm."""
        sd = path / "state"
        if action == "run-now":
            request_run(sd)
            self.poke()
        elif action in ("pause", "resume"):
            set_paused(sd, action == "pause")
        elif action == "send":
            text = form.get("text", "").strip()
            if not text:
                raise ValueError("nothing to send: write the message first")
            send_message_to_agent(sd, text)
        elif action == "task":
            add_task(sd, form.get("title", "").strip())
        elif action == "task-cancel":
            cancel_task(sd, form.get("id", ""), form.get("note", ""))
        elif action == "task-rm":
            remove_task(sd, form.get("id", ""))
        else:
            raise pages_mod.NotFound(f"no action {action!r}")

    async def approval(self, request: Request):
        """A link from an `approval` notification: GET a confirm page, POST (CSRF, Origin) decides."""
        token = request.path_params["token"]
        reading = request.method in ("GET", "HEAD")  # only a POST decides
        form, refused = ({}, None) if reading else await self._checked(request)
        if refused:
            return refused
        try:
            opened = await run_in_threadpool(approval_pages.open_link, self.root, self.pages, token)
            if reading:
                return self.render(
                    request,
                    "approval.html",
                    a=opened.approval,
                    action=opened.link.action,
                    agent=opened.link.agent,
                    token=token,
                )
            done = await run_in_threadpool(approval_pages.decide, opened, form.get("reason", ""), self.poke)
        except approval_pages.Refused as exc:
            return self.render(request, "error.html", exc.status, message=str(exc))
        return RedirectResponse(f"/?said={done.status}", status_code=303)

    async def run_escapes(self, request: Request):
        form, refused = await self._checked(request)
        if refused:
            return refused
        assert self.runner is not None  # __post_init__ made one
        why_not = self.runner.start(form.get("runtime", ""), form.get("policy", ""))
        if why_not:
            return self.render(request, "error.html", 409, message=why_not)
        return RedirectResponse("/escapes?said=escapes", status_code=303)

    async def _checked(self, request: Request) -> tuple[dict, Response | None]:
        try:
            form = await _form(request)
        except ValueError as exc:
            return {}, self.render(request, "error.html", 413, message=str(exc))
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        why = self.access.why_not_act(request.cookies, request.headers, form, own)
        if why is None:
            return form, None
        return form, self.render(request, "error.html", 403, message=why)

    # -- signing in -----------------------------------------------------------------------

    async def login(self, request: Request):
        """The form (GET), its answer (POST), and serve's sign-in URL (GET with ?token=): the cookie is
        set and the browser sent on at once, so the token does not stay in the address bar."""
        if request.method == "GET":
            form = dict(request.query_params)
            if "token" not in form:
                return self.render(request, "login.html", next=_local(form.get("next", "/")), message=None)
        else:
            try:
                form = await _form(request)
            except ValueError:
                form = {}
        if not self.access.token_ok(form.get("token", "").strip()):
            return self.render(
                request, "login.html", 403, next=_local(form.get("next", "/")), message="that is not the console token"
            )
        target = _local(form.get("next", "/"))
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE, self.access.session, httponly=True, samesite="strict", secure=self.access.behind_tls, path="/"
        )
        return response

    async def logout(self, request: Request):
        form, refused = await self._checked(request)
        response = RedirectResponse("/", status_code=303)
        if not refused:
            response.delete_cookie(COOKIE, path="/")
        return response


class _Guard:
    """First the Host (421 unless it is ours), then the token; our headers on every response."""

    OPEN = ("/login", "/static/console.css", "/favicon.ico", "/healthz")  # exact paths: no token needed

    def __init__(self, app, console: Console):
        self.app, self.console = app, console

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":  # no route takes one; refused before the app sees it
            return await send({"type": "websocket.close", "code": 1008})
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refused = self._refused(scope)
        if refused is not None:
            return await _with_headers(refused)(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in _HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        return await self.app(scope, receive, send_with_headers)

    def _refused(self, scope) -> Response | None:
        hosts = [value.decode("latin-1") for key, value in scope["headers"] if key == b"host"]
        if len(hosts) > 1:
            return Response(TOO_MANY_HOSTS, 421, media_type="text/plain")
        host = hosts[0] if hosts else None
        if self.console.hosts is None or not self.console.hosts.answers(host):
            return Response(refused_line(host), 421, media_type="text/plain")
        if not scope.get("raw_path", b"/").startswith(b"/"):
            # absolute-form (`GET http://name/ HTTP/1.1`): its authority, not Host, names the target,
            # and only proxies are sent one; a console is no proxy.
            return Response(ABSOLUTE_FORM, 421, media_type="text/plain")
        path = scope["path"]
        if path in self.OPEN:
            return None
        request = Request(scope)
        access = self.console.access
        if path == "/metrics" and access.loopback:
            return None  # Prometheus on this host scrapes without the token (docs/operations.md)
        if access.may_read(request.cookies, request.headers):
            return None
        if path == "/metrics":
            return Response("the console token is needed (Authorization: Bearer TOKEN)\n", 401)
        if scope["method"] not in ("GET", "HEAD"):
            return Response("sign in with the console token first\n", 403, media_type="text/plain")
        return RedirectResponse(f"/login?next={quote(path)}", status_code=303)


_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def _with_headers(response: Response) -> Response:
    response.headers.update(_HEADERS)
    return response


async def _form(request: Request) -> dict:
    """An urlencoded form, capped; the last value of each field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ValueError("the form is too large")
    return {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}


def _local(target: str) -> str:
    """Only a path on this console: never an open redirect."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"


def _money(value) -> str:
    return f"${value:.4f}" if isinstance(value, (int, float)) else "unknown"


def _seconds(ms) -> str:
    return f"{ms / 1000:.1f}s" if isinstance(ms, (int, float)) else "-"


# -- the listener ---------------------------------------------------------------------------


@dataclass
class Listening:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start(console: Console, host: str, port: int, public_names=(), published_on_loopback: bool = False) -> Listening:
    """Bind HOST:PORT now (an error is the caller's one line), then serve in a thread, answering
    only the Host names hosts.py allows for this address, its bound port and PUBLIC_NAMES."""
    sock = bind(host, port, "--http")
    sock.listen(64)
    bound = sock.getsockname()[1]
    try:
        console.hosts = Hosts.of(host, bound, public_names, published_on_loopback)
    except ValueError as exc:
        sock.close()
        raise ConfigError(str(exc)) from None
    # X-Forwarded-* only from a proxy the operator says is there: otherwise any local client could
    # make uvicorn believe the request came over https from anywhere.
    server = uvicorn.Server(
        uvicorn.Config(
            console.app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
            proxy_headers=console.access.behind_tls,
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="wakeloop-console", daemon=True)
    thread.start()
    shown = f"[{host}]" if ":" in host else host
    return Listening(f"http://{shown}:{bound}/", server, thread)
