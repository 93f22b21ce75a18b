"""Links that approve or deny one approval on the console: signed, expiring, for one approval, used once.

A link is `/approvals/<token>` on the console (WAKELOOP_CONSOLE_URL, which
serve --http sets for itself when unset), where the token is

    base64url({"a": agent folder, "i": approval id, "d": approve|deny, "e": expiry, "n": nonce})
    "." base64url(HMAC-SHA256(key, "wakeloop-approval-link\\0" + that first part))

The key is ROOT/approvals.key: 32 random bytes made at first use, 0600, ours
(O_EXCL, no link followed, refused if another user owns it or others may read
it), like console.token. What makes a link:

- signed: a token whose MAC does not match is refused (`verify`);
- expiring: past `e` (the approval's own expiry) it is refused;
- for one approval: the MAC covers the agent folder, the id and the action,
  and the nonce must equal the one in that approval's file (records/approvals.py
  `decide`), so a link of one approval decides no other, even one that reuses
  the id after a folder was copied;
- used once: it decides only a pending approval, and deciding ends pending.

A link is not a sign-in: the console still asks for its token first, and the
POST that decides passes the console's CSRF and Origin checks (console/app.py).
Whom this guards against: the model in the box (it sees no key, no link,
no state/). Not against a taken-over orchestrator: it holds the key and
serves the console.

Not here: the approvals themselves (approvals.py), the routes (console/app.py).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.records.approvals import Approval

KEY_FILE = "approvals.key"  # in ROOT
KEY_BYTES = 32
TOKEN_CAP = 1024  # chars of a link token read: ours are ~250
CONSOLE_URL_ENV = "WAKELOOP_CONSOLE_URL"
ACTIONS = ("approve", "deny")
_PURPOSE = b"wakeloop-approval-link\0"


class LinkError(ConfigError):
    """A link that will not do, or a key that cannot be used: one line."""


@dataclass(frozen=True)
class Link:
    agent: str  # the agent's folder name under ROOT
    approval_id: str
    action: str  # approve | deny
    expires: int  # unix seconds
    nonce: str


def load_key(root: Path, create: bool = True) -> bytes:
    """ROOT/approvals.key, made (0600, O_EXCL) when absent and `create`."""
    path = Path(root) / KEY_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            raise LinkError(f"{path}: no key yet, so no link was ever made here") from None
        return _make_key(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkError(
                f"{path} is a symbolic link: remove it (`rm {path}`); a new key is made "
                "(links already sent stop working)"
            ) from None
        raise LinkError(f"{path}: cannot read it ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise LinkError(f"{path} is not a regular file: remove it")
        if st.st_uid != os.geteuid():
            raise LinkError(f"{path} belongs to uid {st.st_uid}, not this user: someone else made it; remove it")
        if st.st_mode & 0o077:
            raise LinkError(
                f"{path} is readable or writable by others (mode {st.st_mode & 0o777:o}): "
                f"remove it (`rm {path}`) so a new key is made"
            )
        key = f.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise LinkError(f"{path} holds no usable key ({len(key)} bytes): remove it and a new one is made")
    return key


def _make_key(path: Path) -> bytes:
    """Written whole to a name of its own, then linked into place: a reader (the console's
    warm-up, a wake's notification) never sees the file half made, and of two makers at
    once the second finds the first's key (link(2) fails with EEXIST) and uses it."""
    key = secrets.token_bytes(KEY_BYTES)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        os.link(partial, path)
    except FileExistsError:  # made meanwhile by another: use that one
        return load_key(path.parent, create=False)
    finally:
        partial.unlink(missing_ok=True)
    return key


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, body: str) -> str:
    return _b64(hmac.new(key, _PURPOSE + body.encode("ascii"), hashlib.sha256).digest())


def sign(key: bytes, link: Link) -> str:
    body = _b64(
        json.dumps(
            {"a": link.agent, "i": link.approval_id, "d": link.action, "e": link.expires, "n": link.nonce},
            separators=(",", ":"),
        ).encode("utf-8")
    )
    return f"{body}.{_mac(key, body)}"


def verify(key: bytes, token: str, now: datetime | None = None) -> Link:
    """The link a token names, or LinkError: forged, altered, expired or not one of ours."""
    if not isinstance(token, str) or len(token) > TOKEN_CAP or token.count(".") != 1:
        raise LinkError("this is not an approval link")
    body, mac = token.split(".")
    try:
        body.encode("ascii")
        good = hmac.compare_digest(_mac(key, body), mac)
    except (UnicodeEncodeError, TypeError):
        good = False
    if not good:
        raise LinkError("this approval link is not signed by this console (altered, or made for another ROOT)")
    try:
        raw = json.loads(_unb64(body))
        link = Link(str(raw["a"]), str(raw["i"]), str(raw["d"]), int(raw["e"]), str(raw["n"]))
    except (ValueError, KeyError, TypeError):
        raise LinkError("this approval link is not one of ours") from None
    if link.action not in ACTIONS:
        raise LinkError("this approval link names no action")
    now = now or datetime.now(UTC)
    if now.timestamp() >= link.expires:
        raise LinkError(f"this approval link expired at {datetime.fromtimestamp(link.expires, UTC):%Y-%m-%d %H:%M} UTC")
    return link


def links_for(root: Path, agent_folder: str, approval: Approval, base_url: str) -> dict[str, str]:
    """{approve: URL, deny: URL} for one approval (records/approvals.py's Approval)."""
    key = load_key(root)
    expires = int(datetime.fromisoformat(approval.expires.replace("Z", "+00:00")).timestamp())  # approvals.parse_time
    base = base_url.rstrip("/")
    return {
        action: f"{base}/approvals/{sign(key, Link(agent_folder, approval.id, action, expires, approval.nonce))}"
        for action in ACTIONS
    }


def console_url(environ: Mapping[str, str] = os.environ) -> str:
    """Where the console is for a person (WAKELOOP_CONSOLE_URL), or "" when nobody said."""
    url = environ.get(CONSOLE_URL_ENV, "").strip()
    return url if url.startswith(("http://", "https://")) else ""
