"""What a wake used and how it ended: `Usage` (tokens by kind, summable) and `Receipt`.

One name per quantity, everywhere a count of tokens is written or shown
(events, transcript, receipt, metrics, console): `input_tokens`,
`output_tokens`, `cache_read_tokens`, `cache_write_tokens` (the 5-minute
and 1-hour writes together), `tokens` (all four), `thinking_tokens` (the part
of output_tokens the model spent thinking, `usage.output_tokens_details`:
shown beside, never added to `tokens` again), `usd`. The API's own
names (`cache_read_input_tokens`, `cache_creation_input_tokens`) are read in
one place, `Usage.from_api`. Files already on disk used others; `from_json`
reads them all (OLD_NAMES), and nothing writes them again.

Not here: what a token costs (ledger.py), where a receipt is written
(wake/loop.py: state.json's last_receipt, the `wake_finished` event, stdout)
or how it is shown (views/agent_status.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

# skipped_node: past one host, the agent's node's broker did not answer (broker/nodes.py);
# not_committed: the wake ran, but its changes to the workspace were not committed (a commit
# that failed and was rolled back, a broker lost mid-wake): nothing it changed landed.
Status = Literal[
    "done", "budget_stop", "dead_letter", "blocked", "skipped_locked", "stopped", "skipped_node", "not_committed"
]
STATUSES: tuple[Status, ...] = get_args(Status)
FAILED: tuple[Status, ...] = ("dead_letter", "blocked", "not_committed")  # the work failed: exit 1 (errors.py)

# Names a quantity had in files written before it had one (`cache_creation_tokens`: receipts;
# the rest: model_response events and transcripts, which kept the API's names).
OLD_NAMES = {
    "cache_read_tokens": ("cache_read_input_tokens",),
    "cache_write_tokens": ("cache_creation_tokens", "cache_creation_input_tokens"),
}


@dataclass(frozen=True)
class Usage:
    """Tokens of one model call, or of many summed (`a + b`, `sum(usages)`); cache writes kept
    by their TTL because each TTL has its own price (ledger.Price)."""

    input_tokens: int = 0  # uncached input
    output_tokens: int = 0
    cache_write_5m_tokens: int = 0  # written to the 5-minute cache (the API's default TTL)
    cache_write_1h_tokens: int = 0  # written to the 1-hour cache
    cache_read_tokens: int = 0
    thinking_tokens: int = 0  # of output_tokens, spent thinking (output_tokens_details.thinking_tokens)

    @property
    def prompt_tokens(self) -> int:
        """What one request's prompt held: input, cache reads and writes (a price band's measure)."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def cache_write_tokens(self) -> int:
        return self.cache_write_5m_tokens + self.cache_write_1h_tokens

    @property
    def tokens(self) -> int:
        """What max_tokens_per_wake counts: input + output + cache read + cache write."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __radd__(self, other: object) -> Usage:
        if other == 0:  # sum() starts from 0
            return self
        return NotImplemented

    def to_json(self) -> dict[str, int]:
        """The four counts, under their names (events, transcripts): their values sum to `tokens`;
        then thinking_tokens, a part of output_tokens."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "thinking_tokens": self.thinking_tokens,
        }

    @classmethod
    def from_json(cls, raw: object) -> Usage:
        """From to_json's dict, or one written before (OLD_NAMES); anything else counts 0.
        A cache write read back is a 5-minute one: the split was priced when it was booked."""
        if not isinstance(raw, dict):
            return cls()
        return cls(
            input_tokens=_count(raw.get("input_tokens")),
            output_tokens=_count(raw.get("output_tokens")),
            cache_write_5m_tokens=_named(raw, "cache_write_tokens"),
            cache_read_tokens=_named(raw, "cache_read_tokens"),
            thinking_tokens=_count(raw.get("thinking_tokens")),
        )

    @classmethod
    def from_api(cls, usage: Any) -> Usage:
        """From the SDK's `response.usage` (or its dict), in the API's names. Cache writes without the
        5m/1h breakdown are taken as 5-minute writes, the API's default TTL."""
        get = usage.get if isinstance(usage, dict) else (lambda k, d=None: getattr(usage, k, d))
        written = _count(get("cache_creation_input_tokens", 0))
        split = get("cache_creation", None)
        split_get = split.get if isinstance(split, dict) else (lambda k, d=None: getattr(split, k, d))
        w1h = _count(split_get("ephemeral_1h_input_tokens", 0)) if split is not None else 0
        w5m = _count(split_get("ephemeral_5m_input_tokens", 0)) if split is not None else written
        details = get("output_tokens_details", None)
        thinking = (
            details.get("thinking_tokens") if isinstance(details, dict) else getattr(details, "thinking_tokens", 0)
        )
        return cls(
            _count(get("input_tokens", 0)),
            _count(get("output_tokens", 0)),
            max(w5m, written - w1h),
            w1h,
            _count(get("cache_read_input_tokens", 0)),
            _count(thinking),
        )


# The largest integer a float holds exactly (and so Prometheus and a browser's JSON): a count read
# back above it is a planted one, and arithmetic with floats (cost, seconds) would overflow on it.
MAX_COUNT = 2**53


def _count(value: Any) -> int:
    """A token count as read from a file anyone may have written: a positive int up to MAX_COUNT, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_COUNT else 0


def _named(raw: Mapping[str, Any], name: str) -> int:
    for key in (name, *OLD_NAMES.get(name, ())):
        if key in raw:
            return _count(raw[key])
    return 0


@dataclass(frozen=True)
class EgressSum:
    """A wake's egress decisions (records/egress.py) summed: what its receipt says of the network.
    In a receipt's flat JSON as EGRESS_KEYS; a receipt written before them reads as all 0."""

    allowed: int = 0  # connections and requests the proxy let through
    denied: int = 0  # ... and refused
    bytes_up: int = 0  # bytes the box sent, over every decision whose count is known
    bytes_down: int = 0  # bytes it received

    @property
    def decisions(self) -> int:
        return self.allowed + self.denied

    def __add__(self, other: EgressSum) -> EgressSum:
        return EgressSum(*(min(getattr(self, f.name) + getattr(other, f.name), MAX_COUNT) for f in fields(self)))

    def to_json(self) -> dict[str, int]:
        return {key: getattr(self, f.name) for key, f in zip(EGRESS_KEYS, fields(self), strict=True)}

    @classmethod
    def from_json(cls, raw: object) -> EgressSum:
        """From a receipt's dict (to_json's keys); a missing or planted count reads as 0."""
        if not isinstance(raw, dict):
            return cls()
        return cls(*(_count(raw.get(key)) for key in EGRESS_KEYS))


EGRESS_KEYS = ("egress_allowed", "egress_denied", "egress_bytes_up", "egress_bytes_down")  # EgressSum's fields


@dataclass(frozen=True)
class Receipt:
    """How one wake ended. Its JSON is flat (scripts parse `wakeloop wake`'s last line): the
    usage's four counts and `tokens` sit beside the rest, in the order they always had."""

    run_id: str
    agent: str
    wake: int
    status: Status
    reason: str
    steps: int = 0  # model requests
    usage: Usage = Usage()  # every model call of the wake, summed
    tool_calls: int = 0
    duration_ms: int = 0
    model: str = ""
    live: bool = False
    journal: str = ""  # who left today's trace: agent | stub | closing note | ...
    started_at: str = ""
    usd: float | None = 0.0  # this wake's cost from real usage (ledger.py); 0 in a dry run;
    #                                 None: billed on a model with no known price, so not known
    task: str = ""  # the task this wake had (tasks.py), if any: claimed, or named by a dry run and left as it was
    messages_waiting: int = 0  # a dry run: the human's messages left for the first live wake
    no_room: str = ""  # the last call the disk guard did not start this wake, and why
    node_lost: str = ""  # past one host: its node stopped answering mid-wake (broker/nodes.py), so its
    #                      changes were not committed: not_committed, but no failure of the agent's (no backoff)
    egress: EgressSum = EgressSum()  # the proxy's decisions for this run (records/egress.py), summed

    @property
    def tokens(self) -> int:
        return self.usage.tokens

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "usage":
                out["tokens"] = self.tokens
                out.update(self.usage.to_json())
            elif f.name == "egress":
                out.update(self.egress.to_json())
            else:
                out[f.name] = getattr(self, f.name)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: object) -> Receipt | None:
        """A receipt as to_dict wrote it, or as older versions did (OLD_NAMES); None when it is not
        one (not a mapping, or a status no wake ends with). A field of the wrong type reads as its
        default: state.json and the event log are files anyone with the folder can write."""
        if not isinstance(raw, dict) or raw.get("status") not in STATUSES:
            return None
        given: dict[str, Any] = {"run_id": "", "agent": "", "wake": 0, "reason": "", "usage": Usage.from_json(raw)}
        for name, kind in _PLAIN:  # one loop, no call per field: a year of wakes is read at a console's start
            value: Any = raw.get(name)
            if type(value) is kind and (kind is not int or 0 < value <= MAX_COUNT):
                given[name] = value
        given["usd"] = json_float(raw.get("usd", 0.0))
        given["egress"] = EgressSum.from_json(raw)
        return cls(**given)


def json_float(value: object) -> float | None:
    """A JSON number as a finite float, or None: a planted 400-digit integer overflows float(),
    and a reader of files anyone with the folder can write must not raise for it."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


# Receipt's plain fields and their JSON types (a positive int for counts): from_json's one loop.
_PLAIN: tuple[tuple[str, type[Any]], ...] = (
    ("run_id", str),
    ("agent", str),
    ("wake", int),
    ("status", str),
    ("reason", str),
    ("steps", int),
    ("tool_calls", int),
    ("duration_ms", int),
    ("model", str),
    ("live", bool),
    ("journal", str),
    ("started_at", str),
    ("task", str),
    ("messages_waiting", int),
    ("no_room", str),
    ("node_lost", str),
)
