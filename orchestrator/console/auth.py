"""Who may see and who may act: the console token, the session cookie, CSRF.

- The token is WAKELOOP_CONSOLE_TOKEN, or one generated at the first start
  into ROOT/console.token: created by us, 0600, never a file someone else
  made (`load_token`). serve prints a sign-in URL carrying it at every start
  (as Jupyter does): `/login?token=...` sets the session cookie and
  redirects, so the token does not stay in the address bar.
- A browser signs in at /login; the session cookie holds an HMAC of the token
  (not the token), HttpOnly and SameSite=Strict. Scripts may send
  `Authorization: Bearer TOKEN` instead.
- Reading: signed in, on loopback too (any local user can reach a loopback
  port). Only /metrics stays open on a loopback listener (app.py).
- Acting (run now, pause, resume, send, add, cancel or remove a task, run the escape suite,
  sign out), whatever headers come with the request (`why_not_act`):
  * `Sec-Fetch-Site`, when the browser sends it, is `same-origin` or `none`
    (a person's own navigation); `cross-site` and `same-site` (a page on
    another port of this host) are refused;
  * `Origin`, when sent, is this console (scheme and Host; the Host is
    already one of ours, hosts.py); `null` is refused;
  * a request that carries any cookie, or no valid bearer token, must carry
    the form's CSRF field (an HMAC of the token), and be signed in;
  * only a request with a valid `Authorization: Bearer TOKEN` and no cookie
    at all may act without the CSRF field. Why that is safe against a
    cross-site form or fetch: a form can set no header at all, and a script
    on another origin can send `Authorization` only after a CORS preflight
    (it is not a CORS-safelisted header), which this console never grants:
    an OPTIONS request gets no Access-Control-Allow-* header. A browser adds
    `Authorization` by itself only for HTTP Basic/Digest credentials, never
    `Bearer`, and a garbage or wrong bearer counts for nothing. So a bearer
    request was written by whoever holds the token; and one that also
    carries a cookie came through a browser, which gets the CSRF rule.
  * and only on loopback or behind TLS (`--behind-tls`): a token sent in
    clear over a network is a token given away, so without TLS in front
    actions are refused, and serve says so when it starts.

Not here: the routes (app.py), which Host names are answered (hosts.py).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

TOKEN_ENV = "WAKELOOP_CONSOLE_TOKEN"
TOKEN_FILE = "console.token"  # in ROOT, when the variable is unset
COOKIE = "wakeloop_session"
MIN_TOKEN_CHARS = 16  # shorter is guessable; a generated one is 32 (24 random bytes)
TOKEN_FILE_CAP = 4096  # bytes read of console.token: a token is a line
FETCH_SITES_OK = ("same-origin", "none")  # Sec-Fetch-Site values that may act


class TokenError(ValueError):
    """A console token that will not do: one line for the human, with the fix."""


def load_token(root: Path, environ=os.environ) -> tuple[str, str]:
    """(token, where it came from: one line for serve to print, without the token)."""
    given = environ.get(TOKEN_ENV, "").strip()
    if given:
        if len(given) < MIN_TOKEN_CHARS:
            raise TokenError(
                f"{TOKEN_ENV} is too short ({len(given)} characters): use at least "
                f"{MIN_TOKEN_CHARS}, e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(24))'`"
            )
        return given, f"token from {TOKEN_ENV}"
    path = Path(root) / TOKEN_FILE
    kept = _read_own_token(path)
    if kept is not None:
        return kept, f"token in {path} (or set {TOKEN_ENV})"
    token = secrets.token_urlsafe(24)
    try:
        # O_EXCL: never a file someone made before us, even an empty one; O_NOFOLLOW: never through a link.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise TokenError(
            f"{path} appeared while serve was making it: remove it (`rm {path}`) and start serve again"
        ) from None
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # whatever the umask
        f.write(token + "\n")
    return token, f"token generated, kept in {path}"


def _read_own_token(path: Path) -> str | None:
    """The token in PATH if it is ours to use; None if there is no such file; else TokenError."""
    try:
        # O_NONBLOCK: a FIFO planted here must not hang serve; O_NOFOLLOW: a link is refused.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TokenError(
                f"{path} is a symbolic link: remove it (`rm {path}`); serve makes a new token file"
            ) from None
        raise TokenError(f"{path}: cannot read it ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise TokenError(f"{path} is not a regular file: remove it (`rm -r {path}`); serve makes a new one")
    with os.fdopen(fd, "rb") as f:
        if st.st_uid != os.geteuid():
            raise TokenError(
                f"{path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()}): someone "
                f"else made it; remove it (`rm {path}`) and serve makes a new one"
            )
        if st.st_mode & 0o077:
            raise TokenError(
                f"{path} is readable or writable by others (mode {st.st_mode & 0o777:o}): "
                f"`chmod 600 {path}`, and change the token if others may have read it"
            )
        kept = f.read(TOKEN_FILE_CAP).decode("utf-8", "replace").strip()
    if len(kept) < MIN_TOKEN_CHARS:
        raise TokenError(
            f"{path} holds no usable token ({len(kept)} characters): remove it (`rm {path}`) and serve makes a new one"
        )
    return kept


@dataclass(frozen=True)
class Access:
    token: str
    loopback: bool  # the listen address is loopback (or published only on the host's)
    behind_tls: bool = False  # the operator says a TLS proxy is in front

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

    def bearer_ok(self, headers) -> bool:
        bearer = headers.get("authorization", "")
        return bearer.startswith("Bearer ") and self.token_ok(bearer[len("Bearer ") :].strip())

    def signed_in(self, cookies: dict, headers) -> bool:
        if hmac.compare_digest(cookies.get(COOKIE, "").encode(), self.session.encode()):
            return True
        return self.bearer_ok(headers)

    def may_read(self, cookies: dict, headers) -> bool:
        return self.signed_in(cookies, headers)

    def why_not_act(self, cookies: dict, headers, form: dict, own_origin: str) -> str | None:
        """None when this request may act; else the one line that says why not (see the docstring)."""
        if not self.actions_allowed:
            return (
                "actions are off: this console listens on a non-loopback address without TLS in front "
                "(restart serve with --behind-tls once a TLS proxy is in front)"
            )
        site = headers.get("sec-fetch-site")
        if site is not None and site not in FETCH_SITES_OK:
            return f"refused: a {site} request (Sec-Fetch-Site), not one from this console's own pages"
        origin = headers.get("origin")
        if origin is not None and origin != own_origin:
            return f"refused: a request from {origin[:80]}, not from this console"
        if not self.signed_in(cookies, headers):
            return "sign in with the console token first"
        script = self.bearer_ok(headers) and "cookie" not in headers
        if not script and not self.csrf_ok(form):
            return "refused: the form's CSRF token is missing or wrong (reload the page)"
        return None

    def csrf_ok(self, form: dict) -> bool:
        return hmac.compare_digest(str(form.get("csrf", "")).encode(), self.csrf.encode())


def _mac(token: str, purpose: str) -> str:
    return hmac.new(token.encode(), purpose.encode(), hashlib.sha256).hexdigest()
