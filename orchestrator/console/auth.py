"""Who may see and who may act: the console token, the session cookie, CSRF.

- The token is WAKELOOP_CONSOLE_TOKEN, or one generated at the first start
  and kept in ROOT/console.token (0600), printed once then.
- A browser signs in at /login with the token; the session cookie holds an
  HMAC of the token (not the token), HttpOnly and SameSite=Strict. Scripts
  may send `Authorization: Bearer TOKEN` instead.
- Reading: open on a loopback address; elsewhere, signed in only.
- Acting (run now, pause, resume, send, add a task, run the escape suite):
  signed in, with the form's CSRF field (an HMAC of the token) and, when the
  browser sends one, an Origin that is this console; and only on loopback or
  behind TLS (`--behind-tls`): a token sent in clear over a network is a
  token given away, so without TLS in front actions are refused, and serve
  says so when it starts.

Not here: the routes (app.py).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

TOKEN_ENV = "WAKELOOP_CONSOLE_TOKEN"
TOKEN_FILE = "console.token"        # in ROOT, when the variable is unset
COOKIE = "wakeloop_session"
MIN_TOKEN_CHARS = 16                # shorter is guessable; a generated one is 32 (24 random bytes)


class TokenError(ValueError):
    """A console token that will not do: one line for the human, with the fix."""


def load_token(root: Path, environ=os.environ) -> tuple[str, str]:
    """(token, where it came from: one line for serve to print). Never logs the token,
    except the one time it is generated (a person has to learn it somehow)."""
    given = environ.get(TOKEN_ENV, "").strip()
    if given:
        if len(given) < MIN_TOKEN_CHARS:
            raise TokenError(f"{TOKEN_ENV} is too short ({len(given)} characters): use at least "
                             f"{MIN_TOKEN_CHARS}, e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(24))'`")
        return given, f"token from {TOKEN_ENV}"
    path = Path(root) / TOKEN_FILE
    try:
        kept = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        kept = ""
    if len(kept) >= MIN_TOKEN_CHARS:
        return kept, f"token in {path} (or set {TOKEN_ENV})"
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, f"token generated, kept in {path}: {token}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    token: str
    loopback: bool                  # the listen address is loopback (or published only on the host's)
    behind_tls: bool = False        # the operator says a TLS proxy is in front

    @property
    def session(self) -> str:
        return _mac(self.token, "session")

    @property
    def csrf(self) -> str:
        return _mac(self.token, "csrf")

    @property
    def actions_allowed(self) -> bool:
        return self.loopback or self.behind_tls

    def token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token.encode())

    def signed_in(self, cookies: dict, headers) -> bool:
        if hmac.compare_digest(cookies.get(COOKIE, "").encode(), self.session.encode()):
            return True
        bearer = headers.get("authorization", "")
        return bearer.startswith("Bearer ") and self.token_ok(bearer[len("Bearer "):].strip())

    def may_read(self, cookies: dict, headers) -> bool:
        return self.loopback or self.signed_in(cookies, headers)

    def why_not_act(self, cookies: dict, headers, form: dict, own_origin: str) -> str | None:
        """None when this request may act; else the one line that says why not."""
        if not self.actions_allowed:
            return ("actions are off: this console listens on a non-loopback address without TLS in front "
                    "(restart serve with --behind-tls once a TLS proxy is in front)")
        if not self.signed_in(cookies, headers):
            return "sign in with the console token first"
        origin = headers.get("origin")
        if origin and origin != own_origin:
            return f"refused: a request from {origin}, not from this console"
        if "authorization" not in headers and not hmac.compare_digest(form.get("csrf", "").encode(),
                                                                       self.csrf.encode()):
            return "refused: the form's CSRF token is missing or wrong (reload the page)"
        return None


def _mac(token: str, purpose: str) -> str:
    return hmac.new(token.encode(), purpose.encode(), hashlib.sha256).hexdigest()
