"""The broker's replies: one frozen dataclass per op's result, and the one place JSON becomes them.

Each op (ops.py) answers one of the types below (`Reply`), carried as the
`result` of the wire's ok envelope (wire.py). `to_json()` is the one way a
reply goes onto the wire; `from_json(kind, result)` the one way a result
comes back as its type, or SandboxError "the sandbox broker sent a malformed
..." when it does not fit. Nothing else takes a reply apart by hand.

  op                  reply           result on the wire
  run, write, append  SandboxResult   its fields (sandbox/box.py)
  ping                Standing        {"root", "node", "rate", "room"}: placement's inputs (nodes.py)
  rate                EngineRate      {"per_s", "calls", "seconds", "latency_s"}
  check               Checked         {"agent"}
  wind_down           WoundDown       {}
  read                Text | MaybeText | Names | Size   {"value"}: by its `what` (READ_REPLIES)
  begin               Begun           {"lines", "discarded"}: workspace_changes data each
  finish              Finished        {"changes", "egress"}
  diff                WakeDiff        {"diff"} (sandbox/wakes/wake_diff.py)
  undo                UndoAnswer      {"undone": Undone's fields} or {"refused": "one line"}
  export, import      Streamed        {"sha256", "bytes", "digest", "entries"}; import's first line Ready
  drop                Dropped         {"dropped": the disk's key}

Not here: the requests (ops.py), the envelope and the line (wire.py), what
each op does (server.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from orchestrator.broker.wire import JSONObject
from orchestrator.records.event_types import WorkspaceChanges, parse_record
from orchestrator.sandbox.box import SandboxError, SandboxResult
from orchestrator.sandbox.wakes.undo_folders import Undone
from orchestrator.sandbox.wakes.wake_diff import WakeDiff

R = TypeVar("R")


@dataclass(frozen=True)
class Standing:
    """`ping`: this broker's ROOT, its node ("" on one host), the engine's rate if measured (None:
    measuring takes seconds, `rate` does it) and the bytes its disks may still promise (None: no disks)."""

    root: str
    node: str
    rate: float | None
    room: int | None


@dataclass(frozen=True)
class EngineRate:
    """`rate`: sandbox/rate.py's measurement of the broker's engine."""

    per_s: float
    calls: int
    seconds: float
    latency_s: float


@dataclass(frozen=True)
class Checked:
    """`check`: the agent would be served as its policy stands."""

    agent: str


@dataclass(frozen=True)
class WoundDown:
    """`wind_down`: a hint, obeyed; nothing to say."""


@dataclass(frozen=True)
class Text:
    """`read` read_text."""

    value: str


@dataclass(frozen=True)
class MaybeText:
    """`read` read_text_or_none."""

    value: str | None


@dataclass(frozen=True)
class Names:
    """`read` journal_names."""

    value: tuple[str, ...]


@dataclass(frozen=True)
class Size:
    """`read` journal_size."""

    value: int | None


ReadReply = Text | MaybeText | Names | Size
READ_REPLIES: dict[str, type[ReadReply]] = {  # a read's `what` (workspace_reads.READS): its reply
    "read_text": Text,
    "read_text_or_none": MaybeText,
    "journal_names": Names,
    "journal_size": Size,
}


@dataclass(frozen=True)
class Begun:
    """`begin`: what earlier wakes left, settled (one line each), and the change sets of the wakes
    that died before their commit, discarded."""

    lines: tuple[str, ...]
    discarded: tuple[WorkspaceChanges, ...]


@dataclass(frozen=True)
class Finished:
    """`finish`: the wake's changes as checked and committed or dropped, and what the allowlist
    proxy decided during it (records/egress.py's lines)."""

    changes: WorkspaceChanges
    egress: tuple[dict[str, Any], ...] = field(default=())


@dataclass(frozen=True)
class UndoAnswer:
    """`undo`: what was put back, or the one line why not (a later wake changed the same paths)."""

    undone: Undone | None = None
    refused: str | None = None


@dataclass(frozen=True)
class Streamed:
    """`export` and `import`: the stream as it went over the wire (its sha256 and bytes) and the
    tree it held (workspace_stream.Summary: its digest and entries)."""

    sha256: str
    bytes: int
    digest: str
    entries: int


@dataclass(frozen=True)
class Ready:
    """`import`'s first line: the disk is made and empty, send the frames."""

    ready: bool = True


@dataclass(frozen=True)
class Dropped:
    """`drop`: the key of the disk deleted here."""

    dropped: str


Reply = (
    SandboxResult
    | Standing
    | EngineRate
    | Checked
    | WoundDown
    | ReadReply
    | Begun
    | Finished
    | WakeDiff
    | UndoAnswer
    | Streamed
    | Ready
    | Dropped
)


# -- a reply onto the wire ------------------------------------------------------------------


def to_json(reply: Reply) -> JSONObject:
    """The reply as its result on the wire (wire.ok puts it in the envelope)."""
    match reply:
        case Begun():
            return {"lines": list(reply.lines), "discarded": [w.to_data() for w in reply.discarded]}
        case Finished():
            return {"changes": reply.changes.to_data(), "egress": list(reply.egress)}
        case WakeDiff():
            return {"diff": reply.to_json()}
        case UndoAnswer(refused=str()):
            return {"refused": reply.refused}
        case UndoAnswer():
            return {"undone": asdict(reply.undone) if reply.undone else None}
        case Names():
            return {"value": list(reply.value)}
        case _:
            return asdict(reply)


# -- a result back as its type: the one place ------------------------------------------------


class _Malformed(ValueError):
    """A part of a result that does not fit, named (a change set), for the one SandboxError."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def from_json(kind: type[R], result: JSONObject) -> R:
    """`result` (a reply's, as wire.request gives it) as the reply `kind`; SandboxError if it does not fit."""
    parse, what = _FROM[kind]
    try:
        reply = parse(result)
    except _Malformed as exc:
        what = exc.what
    except (KeyError, TypeError, ValueError, AttributeError):
        pass
    else:
        if isinstance(reply, kind):
            return reply
    raise SandboxError(f"the sandbox broker sent a malformed {what}")


def _result(r: JSONObject) -> SandboxResult:
    result = SandboxResult(**r)
    return replace(result, asked_hosts=tuple(map(str, result.asked_hosts)))


def _standing(r: JSONObject) -> Standing:
    """Not trusted to be sane (another node's broker): what does not fit is unknown, not an error."""
    root, node, rate, room = r.get("root"), r.get("node"), _amount(r.get("rate")), _amount(r.get("room"))
    return Standing(
        root if isinstance(root, str) else "",
        node if isinstance(node, str) else "",
        rate,
        None if room is None else int(room),
    )


def _amount(value: object) -> float | None:
    """A finite JSON number >= 0 (not a bool), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def _rate(r: JSONObject) -> EngineRate:
    return EngineRate(float(r["per_s"]), int(r["calls"]), float(r["seconds"]), float(r["latency_s"]))


def _checked(r: JSONObject) -> Checked:
    return Checked(_is(str, r["agent"]))


def _text(r: JSONObject) -> Text:
    return Text(_is(str, r.get("value")))


def _maybe_text(r: JSONObject) -> MaybeText:
    value = r.get("value")
    return MaybeText(None if value is None else _is(str, value))


def _names(r: JSONObject) -> Names:
    return Names(tuple(_is(str, name) for name in _is(list, r.get("value"))))


def _size(r: JSONObject) -> Size:
    value = r.get("value")
    return Size(None if value is None else _is(int, value))


def _begun(r: JSONObject) -> Begun:
    lines, discarded = _is(list, r.get("lines")), _is(list, r.get("discarded"))
    return Begun(tuple(str(line) for line in lines), tuple(_changes(data) for data in discarded))


def _finished(r: JSONObject) -> Finished:
    """The changes must fit; the egress decisions are kept as far as they are objects (checked and
    cut where they are written: records/egress.py)."""
    decisions = r.get("egress")
    egress = tuple(d for d in decisions if isinstance(d, dict)) if isinstance(decisions, list) else ()
    return Finished(_changes(r.get("changes")), egress)


def _changes(data: object) -> WorkspaceChanges:
    record = parse_record(WorkspaceChanges.TYPE, data) if isinstance(data, dict) else None
    if not isinstance(record, WorkspaceChanges):
        raise _Malformed("change set")
    return record


def _diff(r: JSONObject) -> WakeDiff:
    return WakeDiff.from_json(r.get("diff"))


def _undo(r: JSONObject) -> UndoAnswer:
    if isinstance(r.get("refused"), str):
        return UndoAnswer(refused=r["refused"])
    u = r["undone"]
    paths, forced_over = (tuple(str(p) for p in u[k]) for k in ("paths", "forced_over"))
    return UndoAnswer(Undone(str(u["run_id"]), int(u["changes"]), paths, forced_over))


def _streamed(r: JSONObject) -> Streamed:
    return Streamed(_is(str, r["sha256"]), _is(int, r["bytes"]), _is(str, r["digest"]), _is(int, r["entries"]))


def _is(kind: type[R], value: object) -> R:
    if not isinstance(value, kind):
        raise TypeError(value)
    return value


_FROM: dict[type, tuple[Callable[[JSONObject], object], str]] = {  # each reply: its parser, its name in an error
    SandboxResult: (_result, "result"),
    Standing: (_standing, "ping"),
    EngineRate: (_rate, "rate"),
    Checked: (_checked, "check"),
    WoundDown: (lambda r: WoundDown(), "reply"),
    Text: (_text, "read"),
    MaybeText: (_maybe_text, "read"),
    Names: (_names, "read"),
    Size: (_size, "read"),
    Begun: (_begun, "begin"),
    Finished: (_finished, "finish"),
    WakeDiff: (_diff, "diff"),
    UndoAnswer: (_undo, "undo"),
    Streamed: (_streamed, "stream summary"),
    Ready: (lambda r: Ready(), "reply"),
    Dropped: (lambda r: Dropped(_is(str, r["dropped"])), "drop"),
}
