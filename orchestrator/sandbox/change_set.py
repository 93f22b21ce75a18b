"""What a wake changed, as every backend returns it: the changes, the refusals, what a begin settled.

The results of `Sandbox.begin` and `Sandbox.finish` (box.py), declared beside the
interface that returns them, not in an implementation: the engine's (wake_layer.py,
transaction.py), the broker's client (broker/client.py) and the records
(records/event_types.py's `WorkspaceChanges`) meet here. Imports nothing of sandbox/.

Not here: reading a wake's upper layer into Changes, checking and committing them
(transaction.py), mounting the wake's overlay (wake_layer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.records import event_types as ev

MAX_LISTED = 200  # changes (and refusals) a WakeChanges names; the rest are counted


@dataclass(frozen=True)
class Change:
    path: str  # workspace-relative, posix
    kind: str  # added | modified | deleted
    type: str  # file | dir | link | other (after; before, for a deletion)
    size: int = 0  # bytes after (a file), 0 otherwise
    mode: int = 0  # permission bits after (0 for a deletion)
    target: str | None = None  # a link's target, as written: never followed
    sha256: str | None = None  # a file's content after
    shared: bool = False  # a file whose inode has links outside the wake's upper layer (_links_outside)


@dataclass(frozen=True)
class Refused:
    change: Change
    rule: str  # the glob, `protect_git`, `set-id bit`, or SHARED


@dataclass(frozen=True)
class WakeChanges:
    """What one wake changed: committed (landed in files/) and refused (dropped), with the rule."""

    run_id: str
    committed: tuple[Change, ...] = ()
    refused: tuple[Refused, ...] = ()
    discarded: tuple[Change, ...] = ()  # a wake that died before its commit: what it had changed, dropped
    error: str = ""  # the commit could not run (one line); nothing landed
    unnamed: int = 0  # changes past the ones named (a record's cap: back from a broker's reply)
    unnamed_refused: int = 0  # refusals past the ones named

    @property
    def empty(self) -> bool:
        return not (self.committed or self.refused or self.discarded or self.error or self.count)

    @property
    def count(self) -> int:
        """Every change that landed (or, discarded, was dropped), named or not."""
        return len(self.discarded or self.committed) + self.unnamed

    @property
    def refused_count(self) -> int:
        return len(self.refused) + self.unnamed_refused

    @classmethod
    def from_record(cls, record: ev.WorkspaceChanges) -> WakeChanges:
        """Back from the event (the broker's reply): as much as the record names."""
        listed = tuple(
            Change(path, kind, type_, size)
            for path, kind, type_, size in zip(record.paths, record.kinds, record.types, record.sizes, strict=False)
        )
        refused = tuple(
            Refused(Change(path, kind, "other"), rule)
            for path, rule, kind in zip(record.refused, record.rules, record.refused_kinds, strict=False)
        )
        # A record from before `count` existed names everything it counts but `more`: all changes.
        unnamed = max(record.count - len(listed), 0) if record.count else record.more
        unnamed_refused = max(record.refused_count - len(refused), 0)
        if record.outcome == "discarded":
            return cls(record.of_run, discarded=listed, unnamed=unnamed)
        return cls(record.of_run, listed, refused, error=record.error, unnamed=unnamed, unnamed_refused=unnamed_refused)

    def record(self) -> ev.WorkspaceChanges:
        """The event (capped at MAX_LISTED changes and as many refusals; the rest counted)."""
        landed = self.discarded or self.committed
        shown, refused = landed[:MAX_LISTED], self.refused[:MAX_LISTED]
        return ev.WorkspaceChanges(
            outcome="error" if self.error else "discarded" if self.discarded else "committed",
            of_run=self.run_id,
            paths=tuple(_text(c.path) for c in shown),
            kinds=tuple(c.kind for c in shown),
            types=tuple(c.type for c in shown),
            sizes=tuple(c.size for c in shown),
            refused=tuple(_text(r.change.path) for r in refused),
            rules=tuple(r.rule for r in refused),
            refused_kinds=tuple(r.change.kind for r in refused),
            more=self.count - len(shown) + self.refused_count - len(refused),
            count=self.count,
            refused_count=self.refused_count,
            error=self.error,
        )


def _text(path: str) -> str:
    """A path as text any log can hold: a name that is not UTF-8 (`touch $'\\xff'` in the box)
    comes from scan with lone surrogates, which no UTF-8 writer takes; shown with U+FFFD."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass(frozen=True)
class Settled:
    """What begin() found an earlier wake left, for the record."""

    lines: tuple[str, ...] = ()  # recovered commits and undos, one line each
    discarded: tuple[WakeChanges, ...] = field(default=())  # wakes that never reached their commit
