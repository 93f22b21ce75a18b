"""Approvals: tool calls that wait for a person, one JSON file each in state/approvals/.

A call that matches the policy's `approve:` rules is not run: the wake asks
(`ask`), and a file `state/approvals/<id>.json` holds the exact call, the
model's words just before it, who asked (run id) and when it lapses. A person
decides (`decide`: `wakeloop approve|deny`, or a console link) while nobody
waits; the agent's next wake takes every decided one (`take`) and hears how
it went (`finish`).

An approval moves

    pending -> approved | denied | expired   (a person, or the clock)
    approved -> started -> ran | void         (the next wake runs it, or the policy no longer allows it)
    pending | approved -> void                (the policy no longer offers the tool at all)

and is `reported` once the model has been told; its file is deleted
KEEP_DAYS after it was asked (a wake's `take` prunes). state/ is mounted in no
sandbox: the model can ask, never decide; a file it writes in /workspace is
no approval. Every change is a read-modify-write under an flock
(approvals.lock), each file written whole (safeio/folder.py: no link
followed, capped), so `wakeloop approve` never races a wake's `take`.

Not here: which calls ask (policy/schema.py's Approve), running one and the
model's words (wake/approval_gate.py), links (records/approval_links.py),
the notification (notify/outcomes.py).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.records import event_types as ev
from orchestrator.records.events import EVENTS_FILE, EventLog
from orchestrator.safeio.atomic import locked
from orchestrator.safeio.folder import TooBig, state_folder
from orchestrator.safeio.jsontext import loads
from orchestrator.safeio.shown import shown

APPROVALS_DIR = "approvals"
APPROVALS_LOCK = "approvals.lock"
APPROVAL_CAP = 4 * 2**20  # bytes of one approval file: the call whole (write_file's content too)
MAX_OPEN = 32  # approvals waiting or decided-not-yet-told per agent: a model cannot flood state/
WORDS_CAP = 2000  # chars of the model's words kept beside the call
RESULT_CAP = 8000  # chars of an approved call's result kept (the transcript has it whole)
REASON_CAP = 500  # chars of a person's reason for a denial
KEEP_DAYS = 30  # days a told approval's file is kept (from its creation), then deleted
STATUSES = ("pending", "approved", "denied", "expired", "started", "ran", "void")
DECIDED = ("approved", "denied", "expired", "void")  # the next wake takes these


class ApprovalError(ConfigError):
    """A bad approve/deny: one line for the person (no such id, already decided, expired)."""


@dataclass(frozen=True)
class Approval:
    id: str  # a-<8 hex>: short enough to type
    tool: str
    input: dict[str, object]  # the exact call, as the model asked
    rule: str  # the rule it matched ("tool: bash, match 'git push*'")
    words: str = ""  # the model's text just before the call
    run_id: str = ""  # the wake that asked
    created: str = ""
    expires: str = ""  # ISO UTC: unanswered by then, it counts as denied
    status: str = "pending"
    decided_by: str = ""
    decided_at: str = ""
    reason: str = ""  # a denial's, an expiry's or a void's
    nonce: str = ""  # the links' secret part: a link names it, so it is for this approval only
    result: str = ""  # what the approved call returned
    ran_by: str = ""  # run id of the wake that ran it
    reported: bool = False  # the model has been told the outcome
    extra: dict[str, object] = field(default_factory=dict)
    hosts: tuple[str, ...] = ()  # a bash call's hosts outside allow_hosts (network_host): granted to its run

    def summary(self) -> str:
        """The call, for people and the model: every character that does not show itself written
        out (safeio/shown.py), so what reads is what runs."""
        hosts = f" (reaching {', '.join(self.hosts)}, outside allow_hosts)" if self.hosts else ""
        return shown(self._call(), keep="\n\t") + hosts

    def _call(self) -> str:
        if self.tool == "bash":
            return f"bash: {self.input.get('command', '')}"
        if self.tool == "write_file":
            return f"write_file {self.input.get('path', '')} ({len(str(self.input.get('content', ''))):,} chars)"
        return f"{self.tool} {json.dumps(self.input, ensure_ascii=False)}"

    def lapsed(self, now: datetime) -> bool:
        return self.status == "pending" and bool(self.expires) and parse_time(self.expires) <= now


def now_utc() -> datetime:
    return datetime.now(UTC)


def iso(when: datetime) -> str:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _rel(approval_id: str) -> str:
    if not _valid_id(approval_id):
        raise ApprovalError(
            f"{approval_id!r} is not an approval id (they look like a-3f2a9c1b; `wakeloop approvals ROOT` lists them)"
        )
    return f"{APPROVALS_DIR}/{approval_id}.json"


def _valid_id(approval_id: str) -> bool:
    return (
        isinstance(approval_id, str)
        and len(approval_id) == 10
        and approval_id.startswith("a-")
        and all(c in "0123456789abcdef" for c in approval_id[2:])
    )


# -- reading ------------------------------------------------------------------------


def load(state_dir: Path, approval_id: str) -> Approval | None:
    """One approval, or None when there is none by that id (or its file is not one of ours)."""
    try:
        raw = loads(state_folder(state_dir).read_text(_rel(approval_id), APPROVAL_CAP))
    except (OSError, ValueError):
        return None
    return _from(raw, approval_id)


_TEXT = (
    "id",
    "tool",
    "rule",
    "words",
    "run_id",
    "created",
    "expires",
    "status",
    "decided_by",
    "decided_at",
    "reason",
    "nonce",
    "result",
    "ran_by",
)


def _from(raw: object, approval_id: str) -> Approval | None:
    """An approval file as ours wrote it, or None: the agent folder's owner can write state/, so a
    field of another type or a time that does not parse (an aware one) is not an approval."""
    if not isinstance(raw, dict) or raw.get("id") != approval_id or raw.get("status") not in STATUSES:
        return None
    known = set(Approval.__dataclass_fields__)
    hosts = raw.get("hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        return None
    try:
        approval = Approval(**{k: v for k, v in raw.items() if k in known} | {"hosts": tuple(hosts)})
    except TypeError:
        return None
    if (
        not all(isinstance(getattr(approval, name), str) for name in _TEXT)
        or not isinstance(approval.input, dict)
        or not isinstance(approval.extra, dict)
        or not isinstance(approval.reported, bool)
        or not _aware(approval.created)
        or approval.expires
        and not _aware(approval.expires)
    ):
        return None
    return approval


def _aware(stamp: str) -> bool:
    try:
        return parse_time(stamp).tzinfo is not None
    except ValueError:
        return False


def load_all(state_dir: Path) -> list[Approval]:
    """Every approval of one agent, oldest first; files that are not ours are left out."""
    names = state_folder(state_dir).files(APPROVALS_DIR)
    found = [load(state_dir, name[:-5]) for name in names if name.endswith(".json") and _valid_id(name[:-5])]
    return sorted((a for a in found if a is not None), key=lambda a: (a.created, a.id))


def waiting(state_dir: Path, now: datetime | None = None) -> list[Approval]:
    """What waits for a person: pending and not lapsed."""
    now = now or now_utc()
    return [a for a in load_all(state_dir) if a.status == "pending" and not a.lapsed(now)]


def _save(state_dir: Path, approval: Approval) -> None:
    data = json.dumps(asdict(approval), ensure_ascii=False, indent=1) + "\n"
    if len(data.encode("utf-8")) > APPROVAL_CAP:
        raise TooBig(len(data.encode("utf-8")), APPROVAL_CAP, f"{state_dir}/{_rel(approval.id)}")
    state_folder(state_dir).write_atomic(_rel(approval.id), data, create_dirs=True)


def _event(state_dir: Path, run_id: str, record: ev.EventRecord) -> None:
    EventLog(Path(state_dir) / EVENTS_FILE, run_id or "approvals").write(record)


# -- the wake asks ------------------------------------------------------------------


@dataclass(frozen=True)
class Asked:
    approval: Approval | None  # None: refused (too many open)
    new: bool = False  # False: the same call already waited (same id given again)
    refusal: str = ""


def ask(
    state_dir: Path,
    tool: str,
    args: dict[str, object],
    rule: str,
    words: str,
    run_id: str,
    expires_s: float,
    now: datetime | None = None,
    hosts: tuple[str, ...] = (),
) -> Asked:
    """File a call for a person (`hosts`: those it reached that ask, for a bash call that ran).
    The same call asked again while it waits gets the same id."""
    now = now or now_utc()
    with locked(state_dir, APPROVALS_LOCK):
        current = [a for a in load_all(state_dir) if not a.reported]
        same = next(
            (
                a
                for a in current
                if a.status == "pending"
                and not a.lapsed(now)
                and (a.tool, a.input, a.hosts) == (tool, args, tuple(hosts))
            ),
            None,
        )
        if same is not None:
            return Asked(same)
        if len(current) >= MAX_OPEN:
            return Asked(
                None,
                refusal=f"{len(current)} approvals of this agent are open already (at most "
                f"{MAX_OPEN}); wait for a person to answer them",
            )
        approval = Approval(
            id=f"a-{secrets.token_hex(4)}",
            tool=tool,
            input=args,
            rule=rule,
            words=words[-WORDS_CAP:],
            run_id=run_id,
            created=iso(now),
            expires=iso(now + timedelta(seconds=expires_s)),
            nonce=secrets.token_urlsafe(16),
            hosts=tuple(hosts),
        )
        while load(state_dir, approval.id) is not None:  # 2^32 ids: a clash is rare, never reused
            approval = replace(approval, id=f"a-{secrets.token_hex(4)}")
        _save(state_dir, approval)
    _event(state_dir, run_id, ev.ApprovalAsked(id=approval.id, tool=approval.tool, rule=rule, expires=approval.expires))
    return Asked(approval, new=True)


# -- a person decides ---------------------------------------------------------------------


def decide(
    state_dir: Path,
    approval_id: str,
    approve: bool,
    by: str,
    reason: str = "",
    nonce: str | None = None,
    now: datetime | None = None,
) -> Approval:
    """Approve or deny one pending approval. `nonce`: a link's, which must be this approval's.
    ApprovalError, one line, when there is no such approval or it is no longer pending."""
    now = now or now_utc()
    _rel(approval_id)  # ApprovalError: not an id at all
    with locked(state_dir, APPROVALS_LOCK):
        approval = load(state_dir, approval_id)
        if approval is None:
            raise ApprovalError(
                f"no approval {approval_id} in {state_dir}/{APPROVALS_DIR}/ "
                "(`wakeloop approvals ROOT` lists what waits)"
            )
        if nonce is not None and not secrets.compare_digest(nonce, approval.nonce):
            raise ApprovalError(f"this link is not for approval {approval_id}")
        if approval.lapsed(now):
            approval = _expire(state_dir, approval)
        if approval.status != "pending":
            when = f" at {approval.decided_at}" if approval.decided_at else ""
            raise ApprovalError(
                f"approval {approval_id} is {approval.status} already{when}"
                + (f" by {approval.decided_by}" if approval.decided_by else "")
                + "; nothing changed"
            )
        approval = replace(
            approval,
            status="approved" if approve else "denied",
            decided_by=by,
            decided_at=iso(now),
            reason=" ".join(reason.split())[:REASON_CAP],
        )
        _save(state_dir, approval)
    decided = ev.ApprovalApproved if approval.status == "approved" else ev.ApprovalDenied
    _event(state_dir, "", decided(id=approval.id, tool=approval.tool, by=by, reason=approval.reason))
    return approval


def _expire(state_dir: Path, approval: Approval) -> Approval:
    approval = replace(
        approval,
        status="expired",
        decided_by="nobody",
        decided_at=approval.expires,
        reason=f"nobody answered by {approval.expires}",
    )
    _save(state_dir, approval)
    _event(state_dir, "", ev.ApprovalExpired(id=approval.id, tool=approval.tool, expires=approval.expires))
    return approval


def settle(state_dir: Path, now: datetime | None = None) -> list[Approval]:
    """Lapsed pending approvals marked expired (each an event); every approval after."""
    now = now or now_utc()
    with locked(state_dir, APPROVALS_LOCK):
        return [_expire(state_dir, a) if a.lapsed(now) else a for a in load_all(state_dir)]


# -- the next wake hears ---------------------------------------------------------------------


def take(state_dir: Path, run_id: str, offered: frozenset[str], now: datetime | None = None) -> list[Approval]:
    """The decided approvals a wake must report, oldest first. Approved ones become `started` (this
    wake runs them: never twice, even if it dies); one whose tool the policy no longer offers,
    approved or still pending, becomes `void`; one a dead wake started is reported as such."""
    now = now or now_utc()
    taken = []
    with locked(state_dir, APPROVALS_LOCK):
        for a in load_all(state_dir):
            if a.reported:
                _prune(state_dir, a, now)
                continue
            if a.lapsed(now):
                a = _expire(state_dir, a)
            if a.status in ("pending", "approved") and a.tool not in offered:
                a = replace(
                    a,
                    status="void",
                    reason=f"this agent's policy no longer offers the {a.tool} tool, so the call was not run",
                )
                _save(state_dir, a)
                _event(state_dir, run_id, ev.ApprovalVoid(id=a.id, tool=a.tool, reason=a.reason))
            if a.status == "approved":
                a = replace(a, status="started", ran_by=run_id)
                _save(state_dir, a)
            elif a.status == "started":  # a wake took it and died before it said how it went
                a = replace(
                    a,
                    result="(the wake that ran it ended before it recorded the result; it was not run again)",
                    status="ran",
                )
            if a.status in (*DECIDED, "started", "ran"):
                taken.append(a)
    return taken


def _prune(state_dir: Path, approval: Approval, now: datetime) -> None:
    """A told approval's file goes KEEP_DAYS after it was asked: state/ stays bounded (its events stay)."""
    if parse_time(approval.created) < now - timedelta(days=KEEP_DAYS):
        state_folder(state_dir).unlink(_rel(approval.id))


def unstart(state_dir: Path, approval: Approval, run_id: str, why: str) -> Approval:
    """A started call that could not run this wake (the fleet stopped, no room on the disks): approved
    again, for the next wake to run, and not reported."""
    with locked(state_dir, APPROVALS_LOCK):
        again = replace(approval, status="approved", ran_by="")
        _save(state_dir, again)
    _event(state_dir, run_id, ev.ApprovalDeferred(id=again.id, tool=again.tool, reason=why))
    return again


def finish(state_dir: Path, approval: Approval, run_id: str, result: str = "", ran: bool = False) -> Approval:
    """The outcome told to the model: `reported`, and an approved call's result kept."""
    with locked(state_dir, APPROVALS_LOCK):
        done = replace(
            approval,
            status="ran" if ran or approval.status in ("started", "ran") else approval.status,
            result=result[:RESULT_CAP] if ran else approval.result,
            reported=True,
        )
        _save(state_dir, done)
    if ran:
        _event(state_dir, run_id, ev.ApprovalRan(id=done.id, tool=done.tool, chars=len(result)))
    return done
