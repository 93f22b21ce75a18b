"""The one list of environment variables wakeloop treats as secret.

Their values are scrubbed from every line wakeloop writes (records/events.py's
`scrub`), never expanded into a notification target (notify/config.py),
never handed to a notification command (notify/channels.py), and a
notify.yaml or ceiling entry that would allow one is refused at load.
Add a name here and every one of those places knows it.

Not here: scrubbing itself (records/events.py), what a notification may expand
(notify/config.py's allowed names).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

SECRET_NAMES = (
    "ANTHROPIC_API_KEY",  # the model's key
    "ANTHROPIC_AUTH_TOKEN",
    "WAKELOOP_CONSOLE_TOKEN",  # console/auth.py's TOKEN_ENV: who may act on the console
    "WAKELOOP_SMTP_URL",  # holds the SMTP password (notify/channels.py)
)
SECRET_PREFIXES = ("ANTHROPIC_",)  # whatever the SDK reads next is the provider's, hence secret
MIN_SECRET_LEN = 8  # shorter values would scrub ordinary words
# The variables a loaded policy's sandbox.credentials name (policy/load.py notes them as it
# reads one): their values are the proxy's to send, and scrubbed like the rest wherever this
# process holds them (the local CLI; under compose only the broker has them).
CREDENTIAL_NAMES: set[str] = set()


def is_secret(name: str) -> bool:
    return name in SECRET_NAMES or name.startswith(SECRET_PREFIXES) or name in CREDENTIAL_NAMES


def is_wakeloop_own(name: str) -> bool:
    """The model's key and wakeloop's own variables: never a credential a policy may name."""
    return name in SECRET_NAMES or name.startswith(SECRET_PREFIXES) or name.upper().startswith("WAKELOOP_")


def note_credentials(names: tuple[str, ...]) -> None:
    """Count these variables as secrets from now on, in this process."""
    CREDENTIAL_NAMES.update(names)


def pattern_reaches_secret(pattern: str) -> bool:
    """Whether an fnmatch pattern (`SLACK_*`, `*`, `ANTHROPIC*`) admits any secret name:
    a known one, or one a secret prefix could start (tried with a sample tail)."""
    if pattern.startswith(SECRET_PREFIXES):
        return True
    samples = SECRET_NAMES + tuple(p + "X" for p in SECRET_PREFIXES)
    return any(fnmatch.fnmatchcase(name, pattern) for name in samples)


def secret_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values that must never be written anywhere we control."""
    return tuple(v for k, raw in list(environ.items()) if is_secret(k) and len(v := str(raw).strip()) >= MIN_SECRET_LEN)
