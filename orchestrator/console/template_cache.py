"""The console's compiled templates, kept between starts in a folder only the operator can write.

Compiling the templates is most of a console's first fleet view after serve restarts (~0.2 s of
CPU for the fleet page and its base, more on a loaded host). Jinja2's bytecode cache keeps the
compiled code, so the next start loads it instead. Loading code from a folder is running it, so
the folder is one nobody else can write: the user's own cache folder
($XDG_CACHE_HOME/wakeloop/templates, else ~/.cache/wakeloop/templates), made 0700 and used only
while it is a real folder (no link) owned by this user with no write bit for group or others.
Anything else (no home, another owner, a loose mode) and the templates compile as before, nothing
kept. A template changed since (an upgrade) is compiled afresh: the cache's entries carry their
source's checksum and the Python version's magic.

Not here: the templates (templates/), the environment that uses this (app.py).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import jinja2

CACHE_ENV = "XDG_CACHE_HOME"  # where the user's caches live, if not ~/.cache
FOLDER = Path("wakeloop") / "templates"  # under it


# The environment's settings that change the code a template compiles to: an entry compiled
# under other ones (autoescape off, say) must never be loaded.
COMPILED_BY = (
    "autoescape",
    "block_start_string",
    "block_end_string",
    "variable_start_string",
    "variable_end_string",
    "comment_start_string",
    "comment_end_string",
    "line_statement_prefix",
    "line_comment_prefix",
    "trim_blocks",
    "lstrip_blocks",
    "newline_sequence",
    "keep_trailing_newline",
    "optimized",
    "is_async",
)


def bytecode_cache(env: jinja2.Environment) -> jinja2.BytecodeCache | None:
    """The cache in the operator's own folder, its entries named by `env`'s compiling settings
    (and jinja2's version); or None (compile every start) when there is no safe folder."""
    folder = _folder()
    if folder is None:
        return None
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    if not only_ours(folder):
        return None
    return jinja2.FileSystemBytecodeCache(str(folder), pattern=f"__wakeloop_{settings(env)}_%s.cache")


def settings(env: jinja2.Environment) -> str:
    """A short hash of what `env` compiles by: a callable (select_autoescape) by its name, never
    by its address, which changes with each process."""
    seen = [jinja2.__version__, sorted(env.extensions)]
    for name in COMPILED_BY:
        value = getattr(env, name, None)
        seen.append(f"{value.__module__}.{value.__qualname__}" if callable(value) else repr(value))
    return hashlib.sha256(repr(seen).encode()).hexdigest()[:16]


def _folder() -> Path | None:
    base = os.environ.get(CACHE_ENV, "").strip()
    if base and Path(base).is_absolute():
        return Path(base) / FOLDER
    try:
        return Path.home() / ".cache" / FOLDER
    except RuntimeError:  # no home to be found (a service account without one)
        return None


def only_ours(folder: Path) -> bool:
    """A real folder (not a link), owned by this user, that no one else can write into."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
