"""One delivery to one channel: webhook, slack, email, command.

Each `deliver` either returns a short answer ("HTTP 200", "250 ok", "exit
0") or raises DeliveryError with one line that is safe to store and show:
every value a target expands to (the URL, its path and query, the SMTP
password) is scrubbed out of it first. The stdlib does the talking
(http.client, smtplib, subprocess): no client library earns its place here.

- webhook: POST the notification as JSON; `Idempotency-Key` and
  `X-Wakeloop-Id` carry its stable id. Any 2xx is delivered; a redirect is
  not followed (a receiver must not steer the sender to another address).
- slack: POST Slack's incoming-webhook payload ({"text": ...}).
- email: WAKELOOP_SMTP_URL=smtp[s]://user:pass@host:port[?from=addr]; smtp
  upgrades with STARTTLS when the server offers it, smtps is TLS from the
  start. Message-ID is built from the stable id.
- command: argv as written (${VAR} expanded), the notification as JSON on
  stdin, killed at timeout_s; exit 0 is delivered.

What the agent wrote (its messages, a reason that quotes it, its workspace's
names) and what an agent folder's author chose (the agent's name) is data
on every channel, never structure:

- slack: `&`, `<`, `>` escaped (so `<!channel>` and `<https://…|Approve>`
  arrive as text), controls and bidi overrides shown as `\u202e`, and every
  line of the text quoted (`>`) under our bold title: the agent cannot write
  a line that looks like the harness's own.
- email: our headers only (From, To, Subject, ids), each one line of
  printable text; the agent's words are in the body.
- webhook: JSON fields; the id in a header is percent-encoded ASCII.
- command: the JSON on stdin; argv is the operator's, and the environment
  it gets has no secret (safeio/secrets.py) in it.

Not here: retries and their timing (sender.py), what is sent (outcomes.py).
"""

from __future__ import annotations

import http.client
import json
import re
import smtplib
import socket
import ssl
import subprocess
import threading
from collections.abc import Mapping
from email.message import EmailMessage
from urllib.parse import SplitResult, parse_qs, quote, unquote, urlsplit
from urllib.request import getproxies, proxy_bypass

from orchestrator.notify.config import EMAIL, Channel, expand, referenced
from orchestrator.notify.queue import Payload
from orchestrator.records.events import scrub, secrets_from_env
from orchestrator.safeio.secrets import is_secret
from orchestrator.safeio.shown import shown

HTTP_TIMEOUT_S = 10.0  # one POST's connect, and each wait for bytes; a slow receiver is retried
HTTP_DEADLINE_S = 20.0  # one POST in all, however its bytes trickle in
SMTP_TIMEOUT_S = 15.0
SMTP_ENV = "WAKELOOP_SMTP_URL"
ERROR_CAP = 300  # chars of a receiver's answer kept in an error line
ZWJ = "\u200d"  # joins emoji (a family, a flag): the one format character kept
SLACK_CAP = 39_000  # chars of one Slack text (Slack's own limit is 40,000)
HEADER_CAP = 200  # chars of a Subject: a title is one short line
_NEWLINES = re.compile(r"\r\n|[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]")  # what some reader breaks a line at


class DeliveryError(Exception):
    """This attempt failed: one line, secret-free."""


def deliver(channel: Channel, payload: Payload, environ: Mapping[str, str]) -> str:
    written = " ".join(channel.target) if channel.kind == "command" else str(channel.target)
    secrets = secrets_from_env(environ) + referenced(written, environ)
    try:
        if channel.kind == "command":
            argv = [expand(a, environ, channel.expand) for a in channel.target]
            return _command(argv, payload, channel.timeout_s, environ)
        if channel.kind == "email":
            url = environ.get(SMTP_ENV, "")
            secrets += _pieces(url)
            return _email(expand(str(channel.target), environ, channel.expand), url, payload)
        url = expand(str(channel.target), environ, channel.expand)
        secrets += _pieces(url)
        body = payload if channel.kind == "webhook" else {"text": slack_text(payload)}
        return _post(url, body, payload["id"])
    except DeliveryError as exc:
        raise DeliveryError(scrub(str(exc), secrets)) from None
    except LookupError as exc:  # a ${VAR} not set
        raise DeliveryError(str(exc)) from None
    except Exception as exc:  # a receiver's oddity must cost one attempt, never the sender
        raise DeliveryError(scrub(f"{type(exc).__name__}: {exc}", secrets)[:ERROR_CAP]) from None


def _pieces(url: str) -> tuple[str, ...]:
    """The parts of a target that may be secret: the whole, its path and query, its password."""
    parts = urlsplit(url) if "://" in url else None
    found = [url]
    if parts is not None:
        found += [parts.path, parts.query, parts.password or "", unquote(parts.password or "")]
    return tuple(p for p in found if len(p) >= 4 and p != "/")


def _post(url: str, body: Payload, id: str) -> str:
    if urlsplit(url).scheme not in ("http", "https"):
        raise DeliveryError("the target is not an http(s) URL")
    header_id = header_safe_id(id)
    status, answer = _request(
        url,
        json.dumps(body, ensure_ascii=False).encode("utf-8"),
        {
            "Content-Type": "application/json",
            "Idempotency-Key": header_id,
            "X-Wakeloop-Id": header_id,
            "User-Agent": "wakeloop",
        },
    )
    if 200 <= status < 300:
        return f"HTTP {status}"
    if 300 <= status < 400:
        raise DeliveryError(f"HTTP {status}: a redirect, not followed; point the channel at the final address")
    said = " ".join(answer.decode("utf-8", "replace").split())
    raise DeliveryError(f"HTTP {status}{': ' + said if said else ''}")


def _request(url: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """One POST, one answer: (status, the first ERROR_CAP bytes of the body). Never a redirect
    followed (a receiver must not steer the sender elsewhere), and done within HTTP_DEADLINE_S
    in all: a receiver that answers a byte at a time has its socket shut at the deadline, so it
    cannot hold serve's one sender thread (and every other agent's notifications) for longer."""
    parts = urlsplit(url)
    conn, path = _connection(parts)
    late = threading.Event()

    def cut() -> None:
        late.set()
        if conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(HTTP_DEADLINE_S, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.request("POST", path, data, headers)
        response = conn.getresponse()
        return response.status, response.read(ERROR_CAP)
    except (OSError, http.client.HTTPException) as exc:
        if late.is_set():
            raise DeliveryError(f"no whole answer within {HTTP_DEADLINE_S:g}s") from None
        if isinstance(exc, TimeoutError):
            raise DeliveryError(f"no answer within {HTTP_TIMEOUT_S:g}s") from None
        raise DeliveryError(f"cannot reach the receiver: {getattr(exc, 'strerror', None) or exc}") from None
    finally:
        timer.cancel()
        conn.close()


def _connection(parts: SplitResult) -> tuple[http.client.HTTPConnection, str]:
    """A connection to the target, through the proxy the environment names for its scheme
    (HTTPS_PROXY, HTTP_PROXY, NO_PROXY, as urllib reads them), and the path to ask for."""
    if not parts.hostname:  # http:///x, https://:443/x (a ${VAR}'s value, or a load that let it by)
        raise DeliveryError("the target URL names no host")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    proxy = getproxies().get(parts.scheme)
    if not proxy or proxy_bypass(parts.hostname or ""):
        return kind(parts.hostname, parts.port, timeout=HTTP_TIMEOUT_S), path
    via = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if not via.hostname:
        raise DeliveryError(f"the {parts.scheme} proxy the environment names has no host")
    if parts.scheme == "https":  # a CONNECT tunnel: TLS is end to end, the proxy sees the host only
        conn = kind(via.hostname, via.port or 8080, timeout=HTTP_TIMEOUT_S)
        conn.set_tunnel(parts.hostname, parts.port or 443)
        return conn, path
    return http.client.HTTPConnection(via.hostname, via.port or 8080, timeout=HTTP_TIMEOUT_S), parts.geturl()


def header_safe_id(id: str) -> str:
    """A notification id for a header: ASCII, no space or control (an agent's name is in it)."""
    return quote(id, safe="/:@._-~+")


def slack_text(payload: Payload) -> str:
    """Our bold title, then the text quoted line by line, both escaped: nothing in either can
    ping, link, or start a line of its own (Slack's mrkdwn: https://api.slack.com/reference/surfaces/formatting)."""
    title = slack_escape(one_line(payload["title"]).replace("*", ""))  # an agent's name cannot end our bold
    lines = _NEWLINES.sub("\n", shown(payload["text"], keep="\t\n\r\v\f\x85\u2028\u2029" + ZWJ)).split("\n")
    text = f"*{title}*\n" + "\n".join(f"> {slack_escape(line)}" for line in lines)
    if len(text) > SLACK_CAP:  # Slack cuts past 40,000 chars without a word; we say so
        text = text[:SLACK_CAP] + f"\n(cut: {len(text) - SLACK_CAP:,} more characters)"
    return text


def slack_escape(text: str) -> str:
    """Slack's three control characters, as Slack says to escape them."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def one_line(text: str, cap: int = HEADER_CAP) -> str:
    """One printable line: line breaks become spaces, other controls are written out, capped."""
    return shown(" ".join(_NEWLINES.sub(" ", text).split()), keep=ZWJ)[:cap]


def _email(to: str, url: str, payload: Payload) -> str:
    if not url:
        raise DeliveryError(f"{SMTP_ENV} is not set (smtp[s]://user:pass@host:port)")
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise DeliveryError(f"{SMTP_ENV} must be smtp://… or smtps://… with a host")
    sender = (parse_qs(parts.query).get("from") or [f"wakeloop@{parts.hostname}"])[0]
    for role, address in (("to", to), ("from", sender)):  # ${VAR} and ?from= are read only now
        if not EMAIL.match(address):
            raise DeliveryError(f"the {role} address is not one plain address (no name, comma or line break)")
    msg = _message(to, sender, payload)
    port = parts.port or (465 if parts.scheme == "smtps" else 25)
    smtp_class = smtplib.SMTP_SSL if parts.scheme == "smtps" else smtplib.SMTP
    try:
        with smtp_class(parts.hostname, port, timeout=SMTP_TIMEOUT_S) as smtp:
            smtp.ehlo()
            if parts.scheme == "smtp" and smtp.has_extn("starttls"):
                smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
            if parts.username:
                smtp.login(unquote(parts.username), unquote(parts.password or ""))
            refused = smtp.send_message(msg, from_addr=sender, to_addrs=[to])  # never a header's list
    except smtplib.SMTPException as exc:
        raise DeliveryError(f"SMTP: {exc}") from None
    except OSError as exc:
        raise DeliveryError(f"cannot reach the SMTP server {parts.hostname}:{port}: {exc.strerror or exc}") from None
    if refused:
        raise DeliveryError(f"SMTP refused {', '.join(refused)}")
    return "250 accepted"


def _message(to: str, sender: str, payload: Payload) -> EmailMessage:
    """Our headers, each one printable line; the agent's words only in the body."""
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = sender, to, one_line(payload["title"])
    msg["Message-ID"] = f"<{header_safe_id(payload['id'])}@wakeloop>"
    msg["X-Wakeloop-Id"] = header_safe_id(payload["id"])
    msg.set_content(f"{payload['text']}\n\n-- \n{json.dumps(payload, ensure_ascii=False, indent=2)}\n")
    return msg


def _command(argv: list[str], payload: Payload, timeout_s: float, environ: Mapping[str, str]) -> str:
    env = {k: v for k, v in environ.items() if not is_secret(k)}  # the operator's program, not the key's holder
    try:
        done = subprocess.run(
            argv,
            input=json.dumps(payload, ensure_ascii=False),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except FileNotFoundError:
        raise DeliveryError(f"{argv[0]}: no such program") from None
    except PermissionError:
        raise DeliveryError(f"{argv[0]}: not executable") from None
    except subprocess.TimeoutExpired:
        raise DeliveryError(f"{argv[0]}: killed after {timeout_s:g}s") from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[:ERROR_CAP]
        raise DeliveryError(f"exit {done.returncode}{': ' + said if said else ''}")
    return "exit 0"
