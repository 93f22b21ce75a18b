"""One delivery to one channel: webhook, slack, email, command.

Each `deliver` either returns a short answer ("HTTP 200", "250 ok", "exit
0") or raises DeliveryError with one line that is safe to store and show:
every value a target expands to (the URL, its path and query, the SMTP
password) is scrubbed out of it first. The stdlib does the talking
(urllib, smtplib, subprocess): no client library earns its place here.

- webhook: POST the notification as JSON; `Idempotency-Key` and
  `X-Wakeloop-Id` carry its stable id. Any 2xx is delivered.
- slack: POST Slack's incoming-webhook payload ({"text": ...}).
- email: WAKELOOP_SMTP_URL=smtp[s]://user:pass@host:port[?from=addr]; smtp
  upgrades with STARTTLS when the server offers it, smtps is TLS from the
  start. Message-ID is built from the stable id.
- command: argv as written (${VAR} expanded), the notification as JSON on
  stdin, killed at timeout_s; exit 0 is delivered.

Not here: retries and their timing (sender.py), what is sent (outcomes.py).
"""

from __future__ import annotations

import json
import smtplib
import ssl
import subprocess
import urllib.error
import urllib.request
from email.message import EmailMessage
from urllib.parse import parse_qs, unquote, urlsplit

from orchestrator.notify.config import Channel, expand, referenced
from orchestrator.records.events import scrub, secrets_from_env

HTTP_TIMEOUT_S = 10.0               # one POST; a slow receiver is retried, not waited on
SMTP_TIMEOUT_S = 15.0
SMTP_ENV = "WAKELOOP_SMTP_URL"
ERROR_CAP = 300                     # chars of a receiver's answer kept in an error line


class DeliveryError(Exception):
    """This attempt failed: one line, secret-free."""


def deliver(channel: Channel, payload: dict, environ) -> str:
    written = " ".join(channel.target) if channel.kind == "command" else str(channel.target)
    secrets = secrets_from_env(environ) + referenced(written, environ)
    try:
        if channel.kind == "command":
            argv = [expand(a, environ) for a in channel.target]
            return _command(argv, payload, channel.timeout_s)
        if channel.kind == "email":
            url = environ.get(SMTP_ENV, "")
            secrets += _pieces(url)
            return _email(expand(str(channel.target), environ), url, payload)
        url = expand(str(channel.target), environ)
        secrets += _pieces(url)
        body = payload if channel.kind == "webhook" else {"text": slack_text(payload)}
        return _post(url, body, payload["id"])
    except DeliveryError as exc:
        raise DeliveryError(scrub(str(exc), secrets)) from None
    except LookupError as exc:      # a ${VAR} not set
        raise DeliveryError(str(exc)) from None
    except Exception as exc:        # a receiver's oddity must cost one attempt, never the sender
        raise DeliveryError(scrub(f"{type(exc).__name__}: {exc}", secrets)[:ERROR_CAP]) from None


def _pieces(url: str) -> tuple[str, ...]:
    """The parts of a target that may be secret: the whole, its path and query, its password."""
    parts = urlsplit(url) if "://" in url else None
    found = [url]
    if parts is not None:
        found += [parts.path, parts.query, parts.password or "", unquote(parts.password or "")]
    return tuple(p for p in found if len(p) >= 4 and p != "/")


def _post(url: str, body: dict, id: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise DeliveryError("the target is not an http(s) URL")
    request = urllib.request.Request(url, data=json.dumps(body, ensure_ascii=False).encode("utf-8"),
                                     method="POST", headers={"Content-Type": "application/json",
                                                             "Idempotency-Key": id, "X-Wakeloop-Id": id,
                                                             "User-Agent": "wakeloop"})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        answer = exc.read(ERROR_CAP).decode("utf-8", "replace").strip()
        raise DeliveryError(f"HTTP {exc.code}{': ' + ' '.join(answer.split()) if answer else ''}") from None
    except urllib.error.URLError as exc:
        raise DeliveryError(f"cannot reach the receiver: {exc.reason}") from None
    except TimeoutError:
        raise DeliveryError(f"no answer within {HTTP_TIMEOUT_S:g}s") from None


def slack_text(payload: dict) -> str:
    return f"*{payload['title']}*\n{payload['text']}"


def _email(to: str, url: str, payload: dict) -> str:
    if not url:
        raise DeliveryError(f"{SMTP_ENV} is not set (smtp[s]://user:pass@host:port)")
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise DeliveryError(f"{SMTP_ENV} must be smtp://… or smtps://… with a host")
    sender = (parse_qs(parts.query).get("from") or [f"wakeloop@{parts.hostname}"])[0]
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = sender, to, payload["title"]
    msg["Message-ID"] = f"<{payload['id']}@wakeloop>"
    msg["X-Wakeloop-Id"] = payload["id"]
    msg.set_content(f"{payload['text']}\n\n-- \n{json.dumps(payload, ensure_ascii=False, indent=2)}\n")
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
            refused = smtp.send_message(msg)
    except smtplib.SMTPException as exc:
        raise DeliveryError(f"SMTP: {exc}") from None
    except OSError as exc:
        raise DeliveryError(f"cannot reach the SMTP server {parts.hostname}:{port}: {exc.strerror or exc}") from None
    if refused:
        raise DeliveryError(f"SMTP refused {', '.join(refused)}")
    return "250 accepted"


def _command(argv: list[str], payload: dict, timeout_s: float) -> str:
    try:
        done = subprocess.run(argv, input=json.dumps(payload, ensure_ascii=False), capture_output=True,
                              text=True, timeout=timeout_s)
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
