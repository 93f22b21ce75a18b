"""What waits for a person across a fleet: `wakeloop approvals ROOT` and the console's fleet page.

One row per approval not yet told to its agent (records/approvals.py):
pending ones first (what a person can still decide), then those decided and
waiting for the agent's next wake. A pending one past its expiry shows as
expired; it is marked so by the next wake, or by an approve/deny that comes
too late. Reading changes nothing.

Not here: the files (records/approvals.py), deciding (cli/approval_commands.py, console/app.py).
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.fleet.schedule import agent_dirs
from orchestrator.records import approvals

CALL_SHOWN = 80  # chars of a call on a table row


def rows(path: Path) -> list[dict]:
    """Every open approval under ROOT (or of one agent folder), pending first, oldest first."""
    path = Path(path)
    folders = [path] if (path / "agent.yaml").is_file() else agent_dirs(path)
    now = approvals.now_utc()
    found = []
    for folder in folders:
        for a in approvals.load_all(folder / "state"):
            if a.reported:
                continue
            status = "expired" if a.lapsed(now) else a.status
            found.append(
                {
                    "agent_dir": str(folder),
                    "agent": folder.name,
                    "id": a.id,
                    "status": status,
                    "tool": a.tool,
                    "call": a.summary(),  # every hidden character written out (safeio/shown.py)
                    "input": a.input,
                    "words": a.words,
                    "rule": a.rule,
                    "created": a.created,
                    "expires": a.expires,
                    "decided_by": a.decided_by,
                    "decided_at": a.decided_at,
                    "reason": a.reason,
                }
            )
    return sorted(found, key=lambda r: (r["status"] != "pending", r["created"], r["agent"]))


def render(found: list[dict], where: Path) -> str:
    if not found:
        return f"(nothing waits for a person under {where})"
    out = [f"{'AGENT':<16} {'ID':<10} {'STATUS':<8} {'EXPIRES':<20} CALL"]
    for r in found:
        call = " ".join(r["call"].split())
        call = call if len(call) <= CALL_SHOWN else call[:CALL_SHOWN] + "..."
        out.append(f"{r['agent']:<16} {r['id']:<10} {r['status']:<8} {r['expires']:<20} {call}")
    waiting = sum(1 for r in found if r["status"] == "pending")
    if waiting:
        out.append(f"{waiting} waiting: `wakeloop approve AGENT_DIR ID` or `wakeloop deny AGENT_DIR ID --reason TEXT`")
    return "\n".join(out)
