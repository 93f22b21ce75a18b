"""The journal trace: every wake leaves one in today's journal, and the one write the harness
makes in a workspace is how.

If today's journal did not grow during the wake (sizes taken without following a symlink),
`journal_trace` appends a stub, or, when the wake ended at its token budget, the model's
closing note (the wrap-up turn's reply, stop_reasons.py). The append is made from inside a
sandbox container (`append_in_sandbox`), which sees nothing but the workspace and refuses a
symlinked journal rather than follow it. The host never writes a workspace file itself; it
reads them with sandbox/disks/workspace_reads.py.

Not here: what the files mean (context.py) or the agent's own writes (tools.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.records import event_types as ev
from orchestrator.records.events import EventLog, scrub
from orchestrator.sandbox.box import Sandbox, SandboxError
from orchestrator.sandbox.containers.output import clean
from orchestrator.sandbox.disks.workspace_reads import JOURNAL_DIR
from orchestrator.wake.tally import Tally

if TYPE_CHECKING:
    from orchestrator.sandbox.box import Files

STUB_TIMEOUT_S = 30  # the sandbox call that appends the journal stub
CLOSING_NOTE_CAP = 32 * 1024  # chars of the final budget reply kept in the journal


def journal_trace(
    box: Sandbox,
    files: Files,
    day: str,
    before: int | None,
    *,
    wake_no: int,
    closing_note: str | None,
    tally: Tally,
    ended: str,
    events: EventLog,
    say: Callable[[str], None],
    secrets: tuple[str, ...],
) -> str:
    """Today's journal after a wake whose start found it `before` bytes long: the closing note
    or a stub appended when the agent wrote none (`ended`: the wake's status and reason).
    Returns the receipt's `journal`: "agent", the kind appended, or why it was not."""
    rel = f"{JOURNAL_DIR}/{day}.md"
    try:
        after = files.journal_size(day)
    except SandboxError as exc:  # its broker gone mid-wake (a node lost): the wake still ends with a receipt
        say(f"journal: could not read {rel}: {exc}")
        after = None
    if closing_note is not None:
        kind = "closing note"
        text = (
            f"\n## Wake #{wake_no} (closing note at the token budget, appended by the harness)\n"
            f"{clean(closing_note)[:CLOSING_NOTE_CAP] or '(the reply was empty)'}\n"
        )
    elif before is not None and after is not None and after > before:
        say(f"journal: the agent wrote {rel} (+{after - before:,} bytes)")
        return "agent"
    else:
        kind = "stub"
        text = (
            f"\n## Wake #{wake_no} (harness stub)\n"
            f"The agent ended without writing to this journal. Steps: {tally.steps}. "
            f"Tokens: {tally.tokens:,}. Tool calls: {tally.tool_calls}. "
            f"Ended: {ended}.\n"
        )
    written, detail = append_in_sandbox(box, rel, scrub(text, secrets))
    events.write(ev.JournalStub(kind=kind, path=rel, written=written, detail=detail))
    say(f"journal: {kind} {'appended to' if written else 'NOT written to'} {rel}" + ("" if written else f" ({detail})"))
    return kind if written else f"{kind} not written: {detail}"


# -- the one write: an append, from inside the box ----------------------------------


def append_in_sandbox(box: Sandbox, rel: str, text: str) -> tuple[bool, str]:
    """Append `text` to workspace-relative `rel` from inside a sandbox container:
    (ok, what the box said). The host never opens the file itself. It is
    write_file's own in-box script in append mode, so a symlinked journal (or a
    symlink on the way) is refused exactly as a write_file through it would be;
    and it is a write, not a shell command, so an agent without bash gets it too."""
    try:
        result = box.write(rel, text.encode(), STUB_TIMEOUT_S, append=True)
    except SandboxError as exc:
        return False, f"the sandbox is unavailable: {exc}"
    return result.ok, result.output.strip()[:500]
