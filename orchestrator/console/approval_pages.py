"""The console's side of approvals: a link from a notification, its confirm page, and what waits.

`/approvals/<token>` (records/approval_links.py) is reached only signed in
(app.py's guard sends a stranger to /login and back). GET shows the call, the
model's words and one button; only the POST, past the console's CSRF and
Origin checks (app.py `_checked`), decides, and only while the approval is
pending and the link's nonce is its own: a replayed, forged, expired or
borrowed link is refused with one line and changes nothing. An approval also
asks serve for a wake now (fleet/control.py's run-now), so the call runs soon.

The fleet page lists what waits, each with console links minted here (the
console holds ROOT/approvals.key).

Not here: the routes and checks (app.py), the files (records/approvals.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.console import pages as pages_mod
from orchestrator.fleet.control import request_run
from orchestrator.records import approval_links, approvals
from orchestrator.records.approval_links import LinkError
from orchestrator.views import fleet_approvals

GONE = 410  # a link whose approval is decided, lapsed or unknown


class Refused(Exception):
    """A link that decides nothing: (HTTP status, one line)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Opened:
    link: approval_links.Link
    agent_dir: Path
    approval: approvals.Approval


def open_link(root: Path, pages: pages_mod.Pages, token: str) -> Opened:
    """The pending approval a link may decide, or Refused."""
    try:
        link = approval_links.verify(approval_links.load_key(root, create=False), token)
    except LinkError as exc:
        raise Refused(403, str(exc)) from None
    try:
        agent_dir = pages.agent_dir(link.agent)
    except pages_mod.NotFound as exc:
        raise Refused(GONE, str(exc)) from None
    approval = approvals.load(agent_dir / "state", link.approval_id)
    if approval is None or approval.nonce != link.nonce:
        raise Refused(403, "this link is not for any approval of this agent")
    if approval.lapsed(approvals.now_utc()):
        raise Refused(GONE, f"approval {approval.id} expired at {approval.expires}; the agent is told at its next wake")
    if approval.status != "pending":
        raise Refused(
            GONE,
            f"approval {approval.id} is {approval.status} already"
            + (f" (by {approval.decided_by} at {approval.decided_at})" if approval.decided_by else "")
            + "; a link decides once",
        )
    return Opened(link, agent_dir, approval)


def decide(opened: Opened, reason: str, poke) -> approvals.Approval:
    """What the POST does: the decision (nonce checked again under the approvals lock), and for an
    approval a wake now."""
    try:
        done = approvals.decide(
            opened.agent_dir / "state",
            opened.approval.id,
            opened.link.action == "approve",
            by="console",
            reason=reason,
            nonce=opened.link.nonce,
        )
    except approvals.ApprovalError as exc:
        raise Refused(GONE, str(exc)) from None
    if done.status == "approved":
        request_run(opened.agent_dir / "state")
        poke()
    return done


def waiting(root: Path) -> list[dict]:
    """Every pending approval under ROOT, with links to decide it here (paths, not URLs)."""
    found = [r for r in fleet_approvals.rows(root) if r["status"] == "pending"]
    if not found:
        return []
    key = approval_links.load_key(root)
    for r in found:
        a = approvals.load(Path(r["agent_dir"]) / "state", r["id"])
        if a is None:
            continue
        expires = int(approvals.parse_time(a.expires).timestamp())
        for action in approval_links.ACTIONS:
            r[f"{action}_path"] = "/approvals/" + approval_links.sign(
                key, approval_links.Link(r["agent"], a.id, action, expires, a.nonce)
            )
    return [r for r in found if "approve_path" in r]
