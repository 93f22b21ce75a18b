"""The one write the harness makes in a workspace: the journal stub, appended
from inside a sandbox container (`append_in_sandbox`), which sees nothing but
the workspace and refuses a symlinked journal rather than follow it. The host
never writes a workspace file itself; it reads them with sandbox/disks/workspace_reads.py.

Not here: what the files mean (context.py) or the agent's own writes (tools.py).
"""

from __future__ import annotations

from orchestrator.sandbox.box import Sandbox, SandboxError

STUB_TIMEOUT_S = 30  # the sandbox call that appends the journal stub


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
