"""`serve --http ADDR` and `--metrics ADDR`: what serve starts beside its scheduler, and says at start.

The console's one line at start names its address, where the token comes
from, and whether actions are on: off on a non-loopback address unless a
TLS proxy is in front (`--behind-tls`). `--published-on-loopback` is for a
container whose port the host publishes on its loopback only (compose.yaml):
the console listens on 0.0.0.0 inside, but only this host can reach it.

Not here: the scheduler (fleet/scheduler.py, which calls `attach` through
serve's `beside`), the routes (app.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from orchestrator import metrics
from orchestrator.console.auth import Access, TokenError, is_loopback, load_token
from orchestrator.errors import ConfigError


@dataclass(frozen=True)
class Options:
    http: str | None = None
    metrics: str | None = None
    behind_tls: bool = False
    published_on_loopback: bool = False


def attach(scheduler, options: Options) -> Callable[[], None]:
    """Start what the options ask for; returns how to stop it. Errors are one line (ConfigError)."""
    stops: list[Callable[[], None]] = []
    if options.metrics:
        try:
            metrics.serve_alone(options.metrics)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"--metrics {options.metrics}: {getattr(exc, 'strerror', None) or exc}") from None
        scheduler.say(f"metrics: http://{options.metrics}/metrics (Prometheus text format)")
    if options.http:
        stops.append(_console(scheduler, options))
    return lambda: [stop() for stop in stops]


def _console(scheduler, options: Options) -> Callable[[], None]:
    from orchestrator.console.app import Console, start
    try:
        host, port = metrics.split_addr(options.http)
        token, where = load_token(scheduler.root)
    except (ValueError, TokenError, OSError) as exc:
        raise ConfigError(f"--http {options.http}: {exc}") from None
    access = Access(token, loopback=is_loopback(host) or options.published_on_loopback,
                    behind_tls=options.behind_tls)
    listening = start(Console(scheduler.root, access, poke=scheduler.poke), host, port)
    if access.actions_allowed:
        acts = "actions on (sign in with the token)"
    else:
        acts = ("actions OFF: a non-loopback address without TLS in front (put a TLS proxy in front "
                "and pass --behind-tls); reading needs the token")
    scheduler.say(f"console: {listening.url} ({where}); {acts}; metrics at {listening.url}metrics")
    return listening.stop
