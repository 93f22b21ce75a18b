"""The transcript of one wake: `state/transcripts/<run_id>.jsonl`, every word, as it happens.

The event log (events.py) says *that* the model was called and a tool ran;
the transcript keeps *what* was said: each user message the harness sent
(the first one, its notes), the model's whole reply (text, tool_use inputs,
stop reason, usage, the wake's cost so far), and each tool result exactly as
the model saw it, with its exit code and duration. The system prompt is
stable across wakes, so a line names its hash and the text is stored once per
hash in `state/transcripts/prompts/<hash>.txt`.

Kept as the event log is, for the same reasons: one JSON object a line, each
written with a single write(2) on an O_APPEND descriptor the moment it
happens, so a wake killed with -9 leaves a readable prefix; secrets scrubbed
from every line before it is written (events.scrub); state/ is never mounted
into a box, so the agent can neither read nor forge it.

Bounded: past `max_wake_bytes` a wake's lines are counted, not kept (one
`truncated` line says so, and the `end` line is always written); `prune`
removes transcripts older than `retention_days`, then the oldest until the
agent's all fit `max_agent_bytes`, and prompts no transcript names.

Every read, write and delete goes through safeio/folder.py from the agent folder:
`state`, `transcripts` or `prompts` planted as a link (to a folder elsewhere)
is refused, never followed, so no wake writes or deletes outside state/;
only regular files named as ours (<run_id>.jsonl, <hash>.txt) are deleted.

Line types: wake (start), system (prompt hash), user, assistant,
tool_result, truncated, end. Every line has "type", "t" (UTC time) and the
run_id in its file name.

Not here: what a wake records (wake/loop.py), how a transcript is shown
(views/logview.py), the policy keys (policy/schema.py TranscriptPolicy).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.records import retention
from orchestrator.records.events import now_iso, scrub
from orchestrator.safeio.folder import state_folder
from orchestrator.safeio.jsontext import loads

TRANSCRIPTS_DIR = "transcripts"  # under state/
PROMPTS_DIR = "prompts"  # under state/transcripts/: one text per system prompt hash
SUFFIX = ".jsonl"
END_RESERVE = 4096  # bytes kept back from max_wake_bytes so the `end` line always fits
PROMPT_CAP = 4 * 2**20  # bytes of a stored system prompt read back (ours are under 300 KiB)


def transcripts_dir(state_dir: Path) -> Path:
    return Path(state_dir) / TRANSCRIPTS_DIR


def transcript_path(state_dir: Path, run_id: str) -> Path:
    return transcripts_dir(state_dir) / f"{run_id}{SUFFIX}"


class Transcript:
    """Appends one wake's lines to its file; never raises past a full disk (the wake matters more)."""

    def __init__(self, state_dir: Path, run_id: str, max_wake_bytes: int, secrets: tuple[str, ...]):
        self.dir = transcripts_dir(state_dir)
        self.path = transcript_path(state_dir, run_id)
        self.folder = state_folder(state_dir)
        self.rel = f"{TRANSCRIPTS_DIR}/{run_id}{SUFFIX}"
        self.max_bytes = max_wake_bytes
        self.secrets = secrets
        self.written = 0
        self.dropped_lines = self.dropped_bytes = 0
        self.error: str | None = None  # the first write that failed, for the wake to report once

    def system(self, text: str, sha: str) -> None:
        """The system prompt by hash; its text once per hash, in prompts/."""
        prompt = f"{TRANSCRIPTS_DIR}/{PROMPTS_DIR}/{sha}.txt"
        if not self.folder.is_file(prompt):
            try:
                self.folder.write_atomic(prompt, scrub(text, self.secrets), create_dirs=True)
            except OSError as exc:
                self._failed(exc)
        self.add("system", hash=sha, chars=len(text))

    def add(self, type: str, **data: Any) -> None:
        line = (
            scrub(json.dumps({"type": type, "t": now_iso(), **data}, ensure_ascii=False, default=str), self.secrets)
            + "\n"
        )
        raw = line.encode("utf-8")
        if type != "end" and self.written + len(raw) > self.max_bytes - END_RESERVE:
            self._drop(len(raw))
            return
        self._write(raw)

    def end(self, **data: Any) -> None:
        if self.dropped_lines:
            data = {**data, "dropped_lines": self.dropped_lines, "dropped_bytes": self.dropped_bytes}
        self.add("end", **data)

    def _drop(self, size: int) -> None:
        if not self.dropped_lines:  # said once, where the gap begins
            self._write(
                json.dumps(
                    {"type": "truncated", "t": now_iso(), "max_wake_bytes": self.max_bytes}, ensure_ascii=False
                ).encode()
                + b"\n"
            )
        self.dropped_lines += 1
        self.dropped_bytes += size

    def _write(self, raw: bytes) -> None:
        try:
            self.folder.append(self.rel, raw, create_dirs=True)
            self.written += len(raw)
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if self.error is None:
            self.error = f"the transcript {self.path} could not be written: {exc.strerror or exc}"


# -- reading ------------------------------------------------------------------


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    """Every well-formed line in order; a torn last line (a killed wake) is skipped,
    and so is a transcript that is not ours (a link, a FIFO)."""
    try:
        with retention.open_text(path) as lines:
            for text in lines:
                line = parse_line(text)
                if line is not None:
                    yield line
    except OSError:
        return


def parse_line(text: str) -> dict[str, Any] | None:
    """One transcript line, or None for a torn or foreign one."""
    try:
        line = loads(text)
    except ValueError:
        return None
    return line if isinstance(line, dict) and isinstance(line.get("type"), str) else None


def runs(state_dir: Path) -> list[Path]:
    """The agent's transcripts, oldest first (by their last write)."""
    found = state_folder(state_dir).files(TRANSCRIPTS_DIR)  # regular files, never through a link
    folder = transcripts_dir(state_dir)
    return [
        folder / n
        for n, _ in sorted(
            ((n, st) for n, st in found.items() if n.endswith(SUFFIX)), key=lambda e: (e[1].st_mtime_ns, e[0])
        )
    ]


def find_run(state_dir: Path, run_id: str | None) -> Path | None:
    """A run's transcript by its whole id (run_ids.resolve makes one of a prefix); the newest
    without one, or with `last`."""
    every = runs(state_dir)
    if not run_id or run_id == "last":
        return every[-1] if every else None
    return next((p for p in every if p.name == f"{run_id}{SUFFIX}"), None)


def prompt_text(state_dir: Path, sha: str) -> str | None:
    try:
        return state_folder(state_dir).read_text(f"{TRANSCRIPTS_DIR}/{PROMPTS_DIR}/{sha}.txt", PROMPT_CAP)
    except (OSError, ValueError):
        return None


# -- retention ------------------------------------------------------------------


@dataclass(frozen=True)
class Pruned:
    files: int = 0
    bytes: int = 0
    prompts: int = 0


def prune(
    state_dir: Path, *, max_agent_bytes: int, retention_days: int, keep: str = "", now: float | None = None
) -> Pruned:
    """Transcript retention, for one agent; called at the end of every wake: the
    one expiry rule of state/ (retention.expire) with the transcript's limits,
    then the prompt texts no remaining transcript names. The transcript of run
    `keep` (the wake that is ending) is never removed. Returns what it removed."""
    when = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    every = runs(state_dir)
    spare = frozenset(p for p in every if p.stem == keep)
    gone = retention.expire(every, retention_days, max_agent_bytes, when, spare)
    return Pruned(
        files=len(gone),
        bytes=sum(gone.values()),
        prompts=_prune_prompts(state_dir, [p for p in every if p not in gone]),
    )


def _prompt_hash(path: Path) -> str | None:
    """The hash a transcript's system line names (near the top: the rest is not read)."""
    for line in read_lines(path):
        if line["type"] == "system":
            return line.get("hash")
    return None


def _prune_prompts(state_dir: Path, kept: list[Path]) -> int:
    named = {_prompt_hash(p) for p in kept}
    folder, rel = state_folder(state_dir), f"{TRANSCRIPTS_DIR}/{PROMPTS_DIR}"
    return sum(
        folder.unlink(f"{rel}/{name}") for name in folder.files(rel) if name.endswith(".txt") and name[:-4] not in named
    )
