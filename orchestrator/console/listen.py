"""`serve --http ADDR` and `--metrics ADDR`: what serve starts beside its scheduler, and says at start.

The console's lines at start name its address, the Host names it answers
(hosts.py; more with `--public-name NAME`), where the token comes from,
whether actions are on (off on a non-loopback address unless a TLS proxy is
in front: `--behind-tls`), and a sign-in URL carrying the token, printed at
every start as Jupyter does (reading needs the token, on loopback too).
`--published-on-loopback` is for a container whose port the host publishes
on its loopback only (compose.override.yaml): the console listens on 0.0.0.0 inside,
but only this host can reach it.

`--metrics ADDR` alone is prometheus_client's exposition, open without the
token, answering only the Host names hosts.py gives its address.

Not here: the scheduler (fleet/scheduler.py, which calls `attach` through
serve's `beside`), the routes (app.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from orchestrator import metrics
from orchestrator.console.auth import Access, TokenError, load_token
from orchestrator.console.hosts import Hosts, bind, bracketed, is_loopback
from orchestrator.errors import ConfigError
from orchestrator.records import approval_links


@dataclass(frozen=True)
class Options:
    http: str | None = None
    metrics: str | None = None
    behind_tls: bool = False
    published_on_loopback: bool = False
    public_names: tuple[str, ...] = ()


def check(options: Options) -> None:
    """Before serve measures the host and loads the SDK (seconds, and boxes made): each
    --public-name, and that each address parses and can be bound now. One line (ConfigError)."""
    try:
        Hosts.of("127.0.0.1", 0, options.public_names)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for flag, addr in (("--http", options.http), ("--metrics", options.metrics)):
        if addr:
            try:
                host, port = metrics.split_addr(addr)
            except ValueError as exc:
                raise ConfigError(f"{flag} {addr}: {exc}") from None
            bind(host, port, flag).close()  # bound again by attach: a port taken since is its line then


def attach(scheduler, options: Options) -> Callable[[], object]:
    """Start what the options ask for (check() has looked at them); returns how to stop it.
    Errors are one line (ConfigError)."""
    stops: list[Callable[[], object]] = []  # what each returns is not used
    metrics.watch_root(scheduler.root)  # agent labels: only the agents under this ROOT
    if options.metrics:
        try:
            host, _ = metrics.split_addr(options.metrics)
            server = metrics.serve_alone(
                options.metrics,
                lambda bound: Hosts.of(host, bound, options.public_names, options.published_on_loopback).answers,
            )
        except (ValueError, OSError) as exc:
            raise ConfigError(f"--metrics {options.metrics}: {getattr(exc, 'strerror', None) or exc}") from None
        stops += [server.shutdown, server.server_close]
        scheduler.say(
            f"metrics: http://{bracketed(host)}:{server.server_port}/metrics (Prometheus text format; "
            "its own Host names only, no token)"
        )
    if options.http:
        stops.append(_console(scheduler, options, options.http))
    return lambda: [stop() for stop in stops]


def _console(scheduler, options: Options, http: str) -> Callable[[], None]:
    from orchestrator.console.app import Console, start

    try:
        host, port = metrics.split_addr(http)
        token, where = load_token(scheduler.root)
    except (ValueError, TokenError, OSError) as exc:
        raise ConfigError(f"--http {options.http}: {exc}") from None
    access = Access(token, loopback=is_loopback(host) or options.published_on_loopback, behind_tls=options.behind_tls)
    console = Console(scheduler.root, access, poke=scheduler.poke)
    listening = start(console, host, port, options.public_names, options.published_on_loopback)
    if access.actions_allowed:
        acts = "actions on (sign in with the token)"
    else:
        acts = (
            "actions OFF: a non-loopback address without TLS in front (put a TLS proxy in front "
            "and pass --behind-tls); reading needs the token"
        )
    scraped = "open on loopback" if access.loopback else "needs the token"
    assert console.hosts is not None  # start() set them
    scheduler.say(
        f"console: {listening.url} ({where}); {acts}; metrics at {listening.url}metrics ({scraped}); "
        f"answers Host {console.hosts.shown()}"
    )
    scheduler.say(f"console: sign in at {sign_in_url(listening.url, options, token)}")
    _approval_links_to(console_base(listening.url, options), scheduler.say)
    return listening.stop


def console_base(url: str, options: Options) -> str:
    """Where a person reaches this console: the first --public-name's address, else the listener's."""
    if options.public_names:
        return f"{'https' if options.behind_tls else 'http'}://{options.public_names[0]}/"
    return url


def _approval_links_to(base: str, say) -> None:
    """Approval notifications (notify/outcomes.py) link here, unless WAKELOOP_CONSOLE_URL says elsewhere."""
    if not approval_links.console_url():
        os.environ[approval_links.CONSOLE_URL_ENV] = base
    say(f"console: approval links point at {approval_links.console_url()}")


def sign_in_url(url: str, options: Options, token: str) -> str:
    """The URL a person opens: the first --public-name's when there is one (compose names the
    host's published port so), else the listener's own."""
    return f"{console_base(url, options)}login?token={quote(token, safe='')}"
