"""Which Host headers the console answers: its own names, never a name someone else controls.

A page the operator opens can point a name of its own at 127.0.0.1 (DNS
rebinding) and then read the console as a same-origin page of that name:
the browser sends `Host: rebind.example:8765`. So a request is answered only
when its Host is one of the console's names, checked before anything else
(every route: pages, /metrics, /login, static files):

- the address it listens on, with its port (`127.0.0.1:8765`, `[::1]:8765`);
- on a loopback listener, `localhost`, `127.0.0.1` and `[::1]` with that
  port. Under `--published-on-loopback` (compose) with any port: the port the
  host publishes is not known inside the container, and a loopback name
  cannot be rebound by anyone, so its port adds nothing;
- each `--public-name NAME` (a reverse proxy's name): `NAME:PORT` exactly, or
  `NAME` alone with any port or none (the proxy's port is its own).

Matching is exact, after lowercasing: no trailing dot, no suffix
(`127.0.0.1.nip.io` is somebody's name), a bracketed IPv6 literal as the
browser writes it. Anything else, or no Host at all, is a 421 and one line.

Not here: the token and CSRF (auth.py), the middleware that calls this (app.py).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

from orchestrator.errors import ConfigError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
# A Host header: a name or IPv4 literal, or a bracketed IPv6 literal; an optional port.
HOST = re.compile(r"(?P<name>\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bracketed(host: str) -> str:
    """An address as it appears in a URL or a Host header."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@dataclass(frozen=True)
class Hosts:
    exact: frozenset[str]  # NAME:PORT accepted as is
    any_port: frozenset[str]  # NAME accepted with any port, or none

    @classmethod
    def of(cls, listen_host: str, port: int, public_names=(), published_on_loopback: bool = False) -> Hosts:
        own = bracketed(listen_host.lower())
        exact = {f"{own}:{port}"}
        any_port: set[str] = set()
        if published_on_loopback:
            any_port |= set(LOOPBACK_NAMES)
        elif is_loopback(listen_host):
            exact |= {f"{name}:{port}" for name in LOOPBACK_NAMES}
        for name in public_names:
            name = name.strip().lower()
            match = HOST.fullmatch(name)
            if not match:
                raise ValueError(f"--public-name {name!r} is not a host name (NAME or NAME:PORT)")
            (exact if match["port"] else any_port).add(name)
        return cls(frozenset(exact), frozenset(any_port))

    def answers(self, host: str | None) -> bool:
        """Whether a request with this Host header is for this console."""
        if not host:
            return False
        host = host.lower()
        match = HOST.fullmatch(host)
        if not match:
            return False
        return host in self.exact or match["name"] in self.any_port

    def shown(self) -> str:
        """The names, for serve's line at start."""
        return ", ".join(sorted(self.exact) + sorted(f"{name}[:any port]" for name in self.any_port))


def refused_line(host: str | None) -> str:
    return (
        f"421: this console does not answer to Host {(host or '')[:80]!r}: open it by its own address, "
        "or start serve with --public-name NAME for a name of yours\n"
    )


def bind(host: str, port: int, flag: str) -> socket.socket:
    """A socket bound to HOST:PORT (the console's, or a check of --metrics'), or the one line
    that says why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{flag} {bracketed(host)}:{port}: cannot listen there ({exc.strerror})") from None
    return sock
