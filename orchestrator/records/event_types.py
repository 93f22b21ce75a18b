"""Every event type the harness writes, declared once: a small frozen record per type.

Writers build a record and hand it to `EventLog.write` (events.py), which
puts `to_data()` in the line's `data`; readers get the same record back from
`parse_record(type, data)` (events.py's `Event.record`), so a field is named
in one place and nothing downstream calls `.get()` on a line's data.

Lines are old or foreign as often as not (any version of wakeloop wrote
them, and whoever owns the agent folder can write the file), so reading
never raises: a field a line lacks reads as its default (older versions
wrote fewer fields; tests and probes write partial lines); a line of a type
not declared here, or with a field of the wrong type, is an `Other`, which
keeps the type name and the raw data for a generic rendering. Token counts
are `Usage` and receipts `Receipt` (receipt.py), read through their own
`from_json`, which also reads the names older files used.

The on-disk shape is what it always was, `{"run_id", "type", "timestamp",
"data"}` (docs/architecture.md, which names the types a wake writes), with
the same keys in `data` but one: token counts have one name each
(`cache_read_tokens`, `cache_write_tokens`, where files before 2026-12-01
had the API's `cache_*_input_tokens` and receipts `cache_creation_tokens`;
receipt.OLD_NAMES reads them still). A field marked OMIT is left out of `data` while it is at
its default, as the writers always left it out.

Not here: the file (events.py: appending, scrubbing, rotation, reading);
what an event means for a wake (wake/loop.py), a view (views/eventview.py) or a
metric (metrics.py).
"""

from __future__ import annotations

import builtins
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints

from orchestrator.records.receipt import MAX_COUNT, Receipt, Usage, json_float

OMIT = {"omit": True}  # field metadata: not written while at its default
EXTRA = {"extra": True}  # field metadata: the keys no other field names, written flat

R = TypeVar("R", bound="EventRecord")


@dataclass(frozen=True)
class EventRecord:
    """The base of every record: its type name, and the generic encoder and decoder."""

    TYPE: ClassVar[str] = ""

    @property
    def type(self) -> str:
        return self.TYPE

    def to_data(self) -> dict[str, Any]:
        """The line's `data`: one key per field (nested records as their JSON)."""
        out: dict[str, Any] = {}
        for f in _plan(type(self)):
            value = getattr(self, f.name)
            if f.extra:
                out.update(value)
            elif not (f.omit and value == f.default):
                out[f.name] = _encode(value)
        return out

    @classmethod
    def from_data(cls: builtins.type[R], data: Mapping[str, Any]) -> R | None:
        """The record a line's data describes; None when a field has the wrong type."""
        plan = _plan(cls)
        values: dict[str, Any] = {}
        for f in plan:
            if f.extra:
                named = {g.name for g in plan}
                values[f.name] = {k: v for k, v in data.items() if k not in named}
            elif f.name in data:
                fits, value = f.fit(data[f.name])
                if not fits and not f.nullable:
                    return None
                values[f.name] = value  # a field that may be unknown (None) is unknown when it does not fit
            elif f.required:
                return None
        return cls(**values)


@dataclass(frozen=True)
class Other(EventRecord):
    """A line of a type not declared here, or one that does not fit its type: kept as it came."""

    name: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def type(self) -> str:
        return self.name

    def to_data(self) -> dict[str, Any]:
        return dict(self.data)


# -- a wake, in the order it happens (wake/loop.py) ------------------------------------


@dataclass(frozen=True)
class WakeSkipped(EventRecord):
    """A wake that never began: another holds the lock, or the fleet is stopped."""

    TYPE = "wake_skipped"
    reason: str = ""
    holder_pid: int | None = field(default=None, metadata=OMIT)  # the lock's holder
    stopped_by: str | None = field(default=None, metadata=OMIT)  # who wrote ROOT/STOP


@dataclass(frozen=True)
class Retention(EventRecord):
    TYPE = "retention"
    done: tuple[str, ...] = ()  # what retention.enforce rotated, compressed or dropped


@dataclass(frozen=True)
class StateRebuilt(EventRecord):
    TYPE = "state_rebuilt"
    warning: str = ""


@dataclass(frozen=True)
class Blocked(EventRecord):
    """The USD caps cannot afford the first model request: the wake does not start."""

    TYPE = "blocked"
    reason: str = ""
    cap: str = ""


@dataclass(frozen=True)
class WakeStarted(EventRecord):
    TYPE = "wake_started"
    wake: int = 0
    agent: str = ""
    model: str = ""
    live: bool = False
    policy: str = ""  # where the policy was read from
    inbox_messages: int = 0
    took_over_lock_from: int | None = None


@dataclass(frozen=True)
class TaskError(EventRecord):
    TYPE = "task_error"
    warning: str = ""


@dataclass(frozen=True)
class TaskClaimed(EventRecord):
    TYPE = "task_claimed"
    task: str = ""
    title: str = ""


@dataclass(frozen=True)
class TaskShown(EventRecord):
    """A dry run named this task in its first message as a live wake would, and left it as it
    found it: a scripted model does no task's work (records/tasks.py)."""

    TYPE = "task_shown"
    task: str = ""
    title: str = ""
    status: str = ""  # the task's status, left as it was: todo | claimed


@dataclass(frozen=True)
class ApprovalError(EventRecord):
    TYPE = "approval_error"
    error: str = ""


@dataclass(frozen=True)
class ModelRequest(EventRecord):
    TYPE = "model_request"
    step: int = 0
    model: str = ""
    max_tokens: int = 0
    messages: int = 0  # messages in the request
    system_prompt_hash: str = ""
    tools: tuple[str, ...] = ()
    tool_choice: str = "auto"


@dataclass(frozen=True)
class ModelResponse(EventRecord):
    TYPE = "model_response"
    step: int = 0
    stop_reason: str = ""
    usage: Usage = Usage()
    tool_names: tuple[str, ...] = ()
    model: str = ""
    tokens_this_wake: int = 0


@dataclass(frozen=True)
class ToolCall(EventRecord):
    TYPE = "tool_call"
    step: int = 0  # 0: an approved call run at the start of a wake
    id: str = ""
    tool: str = ""
    input: Any = field(default=None, metadata=OMIT)  # the arguments, long strings cut (wake/tool_step.py)
    approval: str = field(default="", metadata=OMIT)  # the approval it ran under


@dataclass(frozen=True)
class ToolResult(EventRecord):
    """A tool's answer. What the sandbox said of the call is typed; what else a tool says of
    itself (tools.py's ToolResult.detail: bytes, chars, task, ...) is `detail`, written flat."""

    TYPE = "tool_result"
    step: int = 0
    id: str = ""
    tool: str = ""
    is_error: bool = False
    result_chars: int = 0
    denied: bool = field(default=False, metadata=OMIT)  # the policy refused it
    approval: str = field(default="", metadata=OMIT)
    exit_code: int | None = field(default=None, metadata=OMIT)  # a sandbox call's
    duration_ms: int | None = field(default=None, metadata=OMIT)
    timed_out: bool | None = field(default=None, metadata=OMIT)
    container_id: str | None = field(default=None, metadata=OMIT)
    no_room: str | None = field(default=None, metadata=OMIT)  # the disk guard did not start it
    detail: Mapping[str, Any] = field(default_factory=dict, metadata=EXTRA)


@dataclass(frozen=True)
class PolicyDenied(EventRecord):
    TYPE = "policy_denied"
    step: int = 0
    tool: str = ""
    reason: str = ""


@dataclass(frozen=True)
class DiskNoRoom(EventRecord):
    TYPE = "disk_no_room"
    step: int = 0
    reason: str = ""


@dataclass(frozen=True)
class NotifyError(EventRecord):
    TYPE = "notify_error"
    error: str = ""


@dataclass(frozen=True)
class Stopped(EventRecord):
    """The fleet's switch (ROOT/STOP) was found during the wake."""

    TYPE = "stopped"
    who: str = ""
    at: str = ""
    why: str = ""
    steps: int = 0


@dataclass(frozen=True)
class BudgetStop(EventRecord):
    TYPE = "budget_stop"
    cap: str = ""
    reason: str = ""
    steps: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class DeadLetter(EventRecord):
    TYPE = "dead_letter"
    reason: str = ""
    step: int = 0


@dataclass(frozen=True)
class NotCommitted(EventRecord):
    """The wake's changes to the workspace did not land (its `workspace_changes` has outcome
    error): the wake ends `not_committed`, whatever its conversation ended with (loop.py)."""

    TYPE = "not_committed"
    reason: str = ""  # why: the commit's error (a full disk, a broker gone)
    ended: str = ""  # what the conversation ended with: done, budget_stop, stopped
    node_lost: str = field(default="", metadata=OMIT)  # past one host: its node went mid-wake (no backoff)


@dataclass(frozen=True)
class JournalStub(EventRecord):
    TYPE = "journal_stub"
    kind: str = ""  # stub | closing note
    path: str = ""
    written: bool = False
    detail: str = ""


@dataclass(frozen=True)
class TranscriptsPruned(EventRecord):
    TYPE = "transcripts_pruned"
    files: int = 0
    bytes: int = 0
    prompts: int = 0


@dataclass(frozen=True)
class TranscriptError(EventRecord):
    TYPE = "transcript_error"
    error: str = ""


@dataclass(frozen=True)
class WakeFinished(EventRecord):
    TYPE = "wake_finished"
    status: str = ""
    reason: str = ""
    tokens: int = 0
    steps: int = 0
    task: str = field(default="", metadata=OMIT)  # the task the wake had (claimed, or a dry run's shown)
    receipt: Receipt | None = None


# -- approvals (records/approvals.py, wake/approval_gate.py) ----------------------------


@dataclass(frozen=True)
class ApprovalAsked(EventRecord):
    TYPE = "approval_asked"
    id: str = ""
    tool: str = ""
    rule: str = ""
    expires: str = ""


@dataclass(frozen=True)
class _Decision(EventRecord):
    id: str = ""
    tool: str = ""
    by: str = ""  # who decided (console user, CLI)
    reason: str = field(default="", metadata=OMIT)


@dataclass(frozen=True)
class ApprovalApproved(_Decision):
    TYPE = "approval_approved"


@dataclass(frozen=True)
class ApprovalDenied(_Decision):
    TYPE = "approval_denied"


@dataclass(frozen=True)
class ApprovalExpired(EventRecord):
    TYPE = "approval_expired"
    id: str = ""
    tool: str = ""
    expires: str = ""


@dataclass(frozen=True)
class _Closed(EventRecord):
    id: str = ""
    tool: str = ""
    reason: str = ""


@dataclass(frozen=True)
class ApprovalVoid(_Closed):
    """It will never run: the policy as it stands refuses it, or it was given up."""

    TYPE = "approval_void"


@dataclass(frozen=True)
class ApprovalDeferred(_Closed):
    """Approved, not run this wake (the fleet stopped, no room): approved again, for a later one."""

    TYPE = "approval_deferred"


@dataclass(frozen=True)
class ApprovalRan(EventRecord):
    TYPE = "approval_ran"
    id: str = ""
    tool: str = ""
    chars: int = 0


@dataclass(frozen=True)
class ApprovalReported(EventRecord):
    TYPE = "approval_reported"
    id: str = ""
    tool: str = ""
    status: str = ""


# -- notifications, health, the scheduler (notify/, fleet/scheduler.py) -----------------


@dataclass(frozen=True)
class NotifyQueued(EventRecord):
    TYPE = "notify_queued"
    id: str = ""
    event: str = ""
    channels: int = 1


@dataclass(frozen=True)
class NotifySent(EventRecord):
    TYPE = "notify_sent"
    id: str = ""
    channel: str = ""
    event: str = ""
    attempts: int = 0
    answer: str = ""


@dataclass(frozen=True)
class NotifyFailed(EventRecord):
    """One attempt failed; the sender tries again in retry_in_s."""

    TYPE = "notify_failed"
    id: str = ""
    channel: str = ""
    event: str = ""
    attempts: int = 0
    error: str = ""
    retry_in_s: float = 0.0


@dataclass(frozen=True)
class NotifyGaveUp(EventRecord):
    TYPE = "notify_gave_up"
    id: str = ""
    channel: str = ""
    event: str = ""
    attempts: int = 0
    error: str = ""


@dataclass(frozen=True)
class Health(EventRecord):
    TYPE = "health"
    said: tuple[str, ...] = ()  # the transitions: failing, paused, recovered
    failures: int = 0
    paused: bool = False
    reason: str = ""


@dataclass(frozen=True)
class WakeNotStarted(EventRecord):
    """serve could not start a wake (bad config, no engine, no broker)."""

    TYPE = "wake_not_started"
    reason: str = ""


@dataclass(frozen=True)
class TickSkipped(EventRecord):
    TYPE = "tick_skipped"
    tick: str = ""  # the missed tick, ISO 8601
    reason: str = ""


@dataclass(frozen=True)
class WorkspaceChanges(EventRecord):
    """What a wake changed in the workspace, checked at its end (sandbox/wakes/wake_layer.py). Lists run
    in parallel (one entry per change), capped in count: the rest are counted in `more`."""

    TYPE = "workspace_changes"
    outcome: str = "committed"  # committed | discarded (died before its commit) | error (nothing landed)
    of_run: str = ""  # the wake they are of: this one, or a dead one's at the next start
    paths: tuple[str, ...] = ()  # what landed (or, discarded, what was dropped), in commit order
    kinds: tuple[str, ...] = ()  # added | modified | deleted
    types: tuple[str, ...] = ()  # file | dir | link | other
    sizes: tuple[int, ...] = ()  # bytes after (a file), else 0
    refused: tuple[str, ...] = ()  # paths the policy refused: dropped
    rules: tuple[str, ...] = ()  # the rule that refused each: a workspace.protect glob, protect_git, set-id bit
    refused_kinds: tuple[str, ...] = ()  # added | modified | deleted, one per refused path
    more: int = 0  # changes and refusals past the cap, counted, not named
    count: int = 0  # every change that landed (or, discarded, was dropped), named or not
    refused_count: int = 0  # every refusal, named or not
    error: str = field(default="", metadata=OMIT)  # why nothing landed (outcome error)


@dataclass(frozen=True)
class WorkspaceUndone(EventRecord):
    """`wakeloop undo` put back what one wake changed (sandbox/wakes/undo_folders.py)."""

    TYPE = "workspace_undone"
    undone_run: str = ""  # the wake undone
    changes: int = 0  # paths put back
    paths: tuple[str, ...] = ()  # the first 20 of them (undo_folders.UNDONE_PATHS)
    forced_over: tuple[str, ...] = ()  # later wakes that changed the same paths (--force)


def tool_result(
    *,
    step: int,
    id: str,
    tool: str,
    is_error: bool,
    result_chars: int,
    denied: bool = False,
    approval: str = "",
    detail: Mapping[str, Any],
) -> ToolResult:
    """A tool's answer, with what the tool said of itself (tools.py's ToolResult.detail) read into
    the fields that name it: the record holds it as a reader of the line would."""
    data = {
        "step": step,
        "id": id,
        "tool": tool,
        "is_error": is_error,
        "result_chars": result_chars,
        "denied": denied,
        "approval": approval,
        **detail,
    }
    return ToolResult.from_data(data) or ToolResult(
        step, id, tool, is_error, result_chars, denied, approval, detail=dict(detail)
    )


RECORDS: dict[str, type[EventRecord]] = {
    cls.TYPE: cls
    for cls in (
        WakeSkipped,
        Retention,
        StateRebuilt,
        Blocked,
        WakeStarted,
        TaskError,
        TaskClaimed,
        TaskShown,
        ApprovalError,
        ModelRequest,
        ModelResponse,
        ToolCall,
        ToolResult,
        PolicyDenied,
        DiskNoRoom,
        NotifyError,
        Stopped,
        BudgetStop,
        DeadLetter,
        NotCommitted,
        JournalStub,
        TranscriptsPruned,
        TranscriptError,
        WakeFinished,
        ApprovalAsked,
        ApprovalApproved,
        ApprovalDenied,
        ApprovalExpired,
        ApprovalVoid,
        ApprovalDeferred,
        ApprovalRan,
        ApprovalReported,
        NotifyQueued,
        NotifySent,
        NotifyFailed,
        NotifyGaveUp,
        Health,
        WakeNotStarted,
        TickSkipped,
        WorkspaceChanges,
        WorkspaceUndone,
    )
}


def parse_record(type_name: str, data: Mapping[str, Any]) -> EventRecord:
    """The record of one line's type and data: its declared record, else `Other`. Never raises."""
    cls = RECORDS.get(type_name)
    record = cls.from_data(data) if cls is not None else None
    return record if record is not None else Other(type_name, dict(data))


# -- the decoder's checks, made once per record class ---------------------------------------

Fit = Callable[[Any], tuple[bool, Any]]  # a JSON value -> (whether it fits, the value as the field holds it)


@dataclass(frozen=True)
class _Field:
    name: str
    fit: Fit
    nullable: bool  # `| None`: a value that does not fit reads as None
    required: bool  # no default: a line without it is an Other
    omit: bool  # OMIT: not written while at its default
    extra: bool  # EXTRA: the keys no other field names
    default: Any


_PLANS: dict[type[EventRecord], tuple[_Field, ...]] = {}


def _plan(cls: type[EventRecord]) -> tuple[_Field, ...]:
    plan = _PLANS.get(cls)
    if plan is None:
        hints = get_type_hints(cls)
        plan = _PLANS[cls] = tuple(
            _Field(
                f.name,
                _fitter(hints[f.name]),
                _fitter(hints[f.name])(None)[0],
                f.default is MISSING and f.default_factory is MISSING,
                bool(f.metadata.get("omit")),
                bool(f.metadata.get("extra")),
                f.default,
            )
            for f in fields(cls)
        )
    return plan


def _fitter(hint: Any) -> Fit:
    """The check of one field's type, for values as JSON gives them."""
    origin = get_origin(hint)
    if hint is Any:
        return lambda v: (True, v)
    if origin in (Union, types.UnionType):
        arms = [_fitter(arm) for arm in get_args(hint)]

        def either(v: Any) -> tuple[bool, Any]:
            for arm in arms:
                fits, held = arm(v)
                if fits:
                    return True, held
            return False, None

        return either
    if hint is type(None):
        return lambda v: (v is None, None)
    if hint is int:  # JSON gives an int exactly (a bool is no int here); not a planted 400 digits
        return lambda v: (type(v) is int and -MAX_COUNT <= v <= MAX_COUNT, v)
    if hint in (bool, str):
        return lambda v: (type(v) is hint, v)
    if hint is float:
        return lambda v: (False, None) if (f := json_float(v)) is None else (True, f)
    if origin is tuple:  # tuple[str, ...] or tuple[int, ...]: a JSON list of them
        item = get_args(hint)[0]
        return lambda v: (True, tuple(v)) if isinstance(v, list) and all(type(x) is item for x in v) else (False, None)
    if hint is Usage:
        return lambda v: (isinstance(v, dict), Usage.from_json(v))
    if hint is Receipt:

        def receipt(v: Any) -> tuple[bool, Any]:
            r = Receipt.from_json(v)
            return r is not None, r

        return receipt
    if origin is not None and issubclass(origin, Mapping):
        return lambda v: (True, dict(v)) if isinstance(v, dict) else (False, None)
    raise TypeError(f"event_types: no reader for fields of type {hint!r}")


def _encode(value: Any) -> Any:
    if isinstance(value, Usage):
        return value.to_json()
    if isinstance(value, Receipt):
        return value.to_dict()
    if isinstance(value, tuple):
        return list(value)
    return value
