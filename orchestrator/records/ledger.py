"""The dollar ledger: what each model call cost, and whether the next may start.

Prices are data (prices.json beside this file: USD per million tokens, each
with its source), overridable by a file named in WAKELOOP_PRICES. A call's
cost comes from the usage the API reports: each rate the API bills apart
(input, output, 5-minute and 1-hour cache writes, cache read), the band of a
long prompt where a model has one (Haiku 5.5 above 100K prompt tokens: the
whole request at the higher rates) and the `inference_geo` multiplier named
by the usage. A model the SDK lists with no public price is in the table as
`unpriced` with the reason, so a USD cap refuses it by name. Before each call the worst case
is checked against the policy's `max_usd_per_wake`, `max_usd_per_day` and
`max_usd_per_month`, and against the fleet's (ROOT/budget.yaml: all agents
under ROOT together, per UTC day and month; policy/fleetbudget.py reads it):
the whole input priced as if nothing were cached (and written to the cache,
the dearest way in), plus `max_tokens` at the output price. After the call the
real cost replaces the estimate. Per-day totals (UTC) and the lifetime total
live in state/ledger.json, written atomically; a month is the sum of its
days. The fleet's spending is every agent's ledger under ROOT, each read
again only when its (inode, mtime, size) changed (FleetBooks), so a check
costs one stat per agent (100 agents: ~10-17 ms on a loaded 2-core host).
Wakes running at once each check before they call, so the
fleet can pass its cap by at most one call's worst case per running wake.

Not here: how the input is assembled (context.py) or what a stop means for the
wake (loop.py). A dry run is not billed: its usage is counted, its cost is 0.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.records.receipt import Usage
from orchestrator.safeio.atomic import locked
from orchestrator.safeio.folder import RECORD_CAP, state_folder
from orchestrator.safeio.jsontext import loads

PRICES_FILE = Path(__file__).with_name("prices.json")
PRICES_ENV = "WAKELOOP_PRICES"  # a JSON file shaped like prices.json, merged over it
LEDGER_FILE = "ledger.json"
LEDGER_LOCK = "ledger.lock"
CHARS_PER_TOKEN = 3.0  # English runs ~4 chars a token, JSON and code ~3: err high
PER_MILLION = 1_000_000
KEEP_DAYS = 400  # per-day rows kept for `status`; older ones live on in lifetime
_DATED = re.compile(r"^(.*)-\d{8}$")  # claude-sonnet-4-5-20250929 -> claude-sonnet-4-5
_PRICE_KEYS = ("input", "output", "cache_write_5m", "cache_write_1h", "cache_read")


class LedgerError(ConfigError):
    """A price table or a USD cap that cannot work: one line for the human."""


@dataclass(frozen=True)
class Price:
    input: float  # USD per million uncached input tokens
    output: float  # USD per million output tokens
    cache_write_5m: float  # USD per million tokens written to the 5-minute cache
    cache_write_1h: float  # USD per million tokens written to the 1-hour cache
    cache_read: float  # USD per million tokens read from the cache
    source: str  # where the numbers come from
    long_prompt: Price | None = None  # the rates of a request whose prompt is above long_above tokens
    long_above: int = 0
    inference_geo: Mapping[str, float] = field(default_factory=dict)  # usage.inference_geo -> every rate times this
    unpriced: str = ""  # listed by the SDK, no public price: why (price_for then answers None)

    def band(self, prompt_tokens: int) -> Price:
        """The rates one request of this many prompt tokens is billed at."""
        return self.long_prompt if self.long_prompt and prompt_tokens > self.long_above else self


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# -- prices ---------------------------------------------------------------------


def load_prices(environ: Mapping[str, str] = os.environ) -> dict[str, Price]:
    """The shipped table, with any entries from $WAKELOOP_PRICES replacing it by name."""
    table = _read_table(PRICES_FILE)
    override = environ.get(PRICES_ENV, "").strip()
    if override:
        table.update(_read_table(Path(override)))
    return table


def _read_table(path: Path) -> dict[str, Price]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LedgerError(f"{path}: cannot read the price table: {exc.strerror}") from None
    except ValueError as exc:
        raise LedgerError(f"{path}: not valid JSON: {exc}") from None
    models = raw.get("models") if isinstance(raw, dict) else None
    if not isinstance(models, dict):
        raise LedgerError(f'{path}: expected {{"models": {{"MODEL": {{"input": ..., ...}}}}}}')
    return {str(name): _price(path, str(name), entry) for name, entry in models.items()}


def _price(path: Path, name: str, entry: Any) -> Price:
    if not isinstance(entry, dict):
        raise LedgerError(f"{path}: models.{name}: expected a mapping of prices")
    unpriced = entry.get("unpriced")
    if unpriced is not None and (not isinstance(unpriced, str) or not unpriced.strip()):
        raise LedgerError(f"{path}: models.{name}.unpriced: say why the model has no price")
    rates = _rates(path, f"models.{name}", entry) if unpriced is None else (0.0, 0.0, 0.0, 0.0, 0.0)
    source = entry.get("source")
    if not isinstance(source, str) or not source.strip():
        raise LedgerError(f"{path}: models.{name}.source: say where the price comes from")
    if unpriced is not None:
        return Price(0, 0, 0, 0, 0, source=source, unpriced=unpriced)
    long = entry.get("long_prompt")
    if long is not None and not (isinstance(long, dict) and _int(long.get("above_tokens"))):
        raise LedgerError(f"{path}: models.{name}.long_prompt: expected {{above_tokens: N, input: ..., ...}}")
    return Price(
        *rates,
        source=source,
        long_prompt=Price(*_rates(path, f"models.{name}.long_prompt", long), source=source) if long else None,
        long_above=_int(long.get("above_tokens")) if long else 0,
        inference_geo=_geo(path, name, entry.get("inference_geo", {})),
    )


def _rates(path: Path, where: str, entry: dict[str, Any]) -> tuple[float, float, float, float, float]:
    """The five rates, in Price's order (_PRICE_KEYS)."""
    values: list[float] = []
    for key in _PRICE_KEYS:
        value = entry.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise LedgerError(f"{path}: {where}.{key}: expected a price in USD per million tokens, got {value!r}")
        values.append(float(value))
    return values[0], values[1], values[2], values[3], values[4]


def _geo(path: Path, name: str, raw: Any) -> dict[str, float]:
    ok = isinstance(raw, dict) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in raw.values()
    )
    if not ok:
        raise LedgerError(f'{path}: models.{name}.inference_geo: expected {{"us": 1.1, ...}} (multipliers)')
    return {str(k): float(v) for k, v in raw.items()}


def price_for(model: str, prices: dict[str, Price]) -> Price | None:
    """The model's price; a dated snapshot id falls back to its undated name; None for an
    unknown model and for one the table knows as unpriced."""
    entry = table_entry(model, prices)
    return entry if entry and not entry.unpriced else None


def table_entry(model: str, prices: dict[str, Price]) -> Price | None:
    """The table's entry for the model (priced or `unpriced`), by its id or its undated name."""
    if model in prices:
        return prices[model]
    dated = _DATED.match(model)
    return prices.get(dated.group(1)) if dated else None


def cost_usd(price: Price, usage: Usage, geo: str = "") -> float:
    """One request's cost: its band's rates (by its prompt size), times its inference_geo's multiplier.
    `usage` must be one request's: a sum of many would be banded by their total."""
    rates = price.band(usage.prompt_tokens)
    return (
        price.inference_geo.get(geo, 1.0)
        * (
            usage.input_tokens * rates.input
            + usage.output_tokens * rates.output
            + usage.cache_write_5m_tokens * rates.cache_write_5m
            + usage.cache_write_1h_tokens * rates.cache_write_1h
            + usage.cache_read_tokens * rates.cache_read
        )
        / PER_MILLION
    )


def estimate_tokens(*parts: Any) -> int:
    """A high estimate of the input tokens of a request made of these parts."""
    chars = sum(len(p) if isinstance(p, str) else len(json.dumps(p, default=str)) for p in parts)
    return math.ceil(chars / CHARS_PER_TOKEN)


def worst_case_usd(price: Price, input_tokens: int, max_tokens: int, cache_ttl: str = "5m") -> float:
    """Every input token at the dearest rate it can be billed at (uncached, or
    written to the cache with this TTL, in its prompt's band), every possible output
    token, and the dearest inference_geo (a workspace may default to one we never sent)."""
    rates = price.band(input_tokens)
    dearest_in = max(rates.input, rates.cache_write_1h if cache_ttl == "1h" else rates.cache_write_5m)
    geo = max(price.inference_geo.values(), default=1.0)
    return geo * (input_tokens * dearest_in + max_tokens * rates.output) / PER_MILLION


def check_caps(model: str, budget: Any, prices: dict[str, Price], where: str) -> Price | None:
    """The model's price; a LedgerError when a USD cap is set (the default) and no price is known,
    unless the policy says budget.allow_unpriced: true (then no USD cap can apply to it)."""
    price = price_for(model, prices)
    caps = [k for k in ("max_usd_per_wake", "max_usd_per_day", "max_usd_per_month") if getattr(budget, k, None)]
    if caps and price is None and not getattr(budget, "allow_unpriced", False):
        entry = table_entry(model, prices)
        why = f"has no public price ({entry.unpriced})" if entry else "has no known price"
        raise LedgerError(
            f"{where}: budget.{caps[0]} is set but model {model!r} {why}; "
            f"add it to a prices file named by {PRICES_ENV} (shape: {PRICES_FILE.name}), "
            "or set budget.allow_unpriced: true (no USD cap then applies to it)"
        )
    return price


# -- the ledger file ------------------------------------------------------------


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


@dataclass(frozen=True)
class Totals:
    usd: float = 0.0
    tokens: int = 0
    calls: int = 0
    unpriced: int = 0  # billed calls on a model with no known price: their cost is unknown, not $0
    thinking_tokens: int = 0  # of `tokens`, the output the model spent thinking


@dataclass(frozen=True)
class Book:
    days: dict[str, Totals] = field(default_factory=dict)
    lifetime: Totals = Totals()

    def day(self, date: str | None = None) -> Totals:
        return self.days.get(date or today(), Totals())

    def month(self, month: str | None = None) -> float:
        """USD spent in a UTC month ("YYYY-MM", default this one): its days summed."""
        month = month or today()[:7]
        return sum(t.usd for d, t in self.days.items() if d.startswith(month))


def read_book(state_dir: Path) -> Book:
    """What state/ledger.json holds; a missing file is an empty book. A broken one
    raises LedgerError: read as empty, it would reset the day's spending, and the
    day cap with it."""
    path = Path(state_dir) / LEDGER_FILE
    try:
        raw = loads(state_folder(state_dir).read_text(LEDGER_FILE, RECORD_CAP))
        days = {str(d): _totals(t) for d, t in raw.get("days", {}).items()}
        return Book(days, _totals(raw.get("lifetime", {})))
    except FileNotFoundError:
        return Book()
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise LedgerError(
            f"{path} is unreadable ({type(exc).__name__}: {str(exc)[:80]}); "
            "repair it or remove it (the day's spending then starts from 0)"
        ) from None


def _totals(raw: Any) -> Totals:
    if not isinstance(raw, dict):
        return Totals()
    usd = raw.get("usd", 0)
    return Totals(
        float(usd) if isinstance(usd, (int, float)) and usd >= 0 else 0.0,
        _int(raw.get("tokens", 0)),
        _int(raw.get("calls", 0)),
        _int(raw.get("unpriced", 0)),
        _int(raw.get("thinking_tokens", 0)),
    )


def record(state_dir: Path, usd: float, tokens: int, priced: bool = True, thinking: int = 0) -> Book:
    """Add one call to today's row and the lifetime total, atomically. `priced=False`:
    a billed call whose cost is unknown (no price for its model); `thinking`: of its
    tokens, those it spent thinking."""
    with locked(state_dir, LEDGER_LOCK):
        book = read_book(state_dir)
        date = today()

        def add(t: Totals) -> Totals:
            return Totals(
                t.usd + usd, t.tokens + tokens, t.calls + 1, t.unpriced + (not priced), t.thinking_tokens + thinking
            )

        days = dict(book.days)
        days[date] = add(book.day(date))
        for old in sorted(days)[:-KEEP_DAYS]:
            del days[old]
        book = Book(days, add(book.lifetime))
        state_folder(state_dir).write_atomic(
            LEDGER_FILE,
            json.dumps(
                {"version": 1, "days": {d: vars(t) for d, t in sorted(days.items())}, "lifetime": vars(book.lifetime)},
                indent=2,
            )
            + "\n",
        )
        return book


# -- one wake's meter -------------------------------------------------------------

# -- the fleet: every agent under ROOT ------------------------------------------------


@dataclass(frozen=True)
class FleetCaps:
    """What all agents under `root` may spend together (ROOT/budget.yaml, bounded by the ceiling)."""

    root: Path
    max_usd_per_day: float = 0.0  # USD per UTC day, every agent's ledger summed; 0 = no cap
    max_usd_per_month: float = 0.0  # USD per UTC month, likewise; 0 = no cap
    source: str = ""  # where the numbers come from, named in a stop's reason

    def __bool__(self) -> bool:
        return bool(self.max_usd_per_day or self.max_usd_per_month)


@dataclass(frozen=True)
class FleetSpent:
    today: float
    month: float
    agents: int  # ledgers read
    unreadable: int = 0  # ledgers left out: each blocks only its own agent (Meter._agent_over)


class FleetBooks:
    """Every agent's ledger under a ROOT, each re-read (and its day and month summed) only
    when its (inode, mtime_ns, size) moved or the date did: a check costs one stat per agent.
    Shared by the wakes of one process (serve runs them as threads), hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[Path, tuple[tuple[Any, ...], tuple[float, float]]] = {}  # ledger -> (key, (day, month))

    def spent(self, root: Path, date: str | None = None) -> FleetSpent:
        """The sums of every readable ledger. An unreadable one is left out and counted, not raised:
        any agent folder's owner can write its own ledger, and one bad file must not stop every
        agent (its own agent's day and month caps still refuse on it). The sums trust each ledger
        as its folder holds it (docs/security.md, "Known gaps")."""
        date = date or today()
        day = month = 0.0
        ledgers = _ledgers(Path(root))
        unreadable = 0
        for path in ledgers:
            try:
                d, m = self._sum(path, date)
            except LedgerError:
                unreadable += 1
                continue
            day, month = day + d, month + m
        return FleetSpent(day, month, len(ledgers) - unreadable, unreadable)

    def _sum(self, path: Path, date: str) -> tuple[float, float]:
        try:
            st = path.stat()
        except FileNotFoundError:
            return 0.0, 0.0
        # record() replaces the file (a new inode each time): with the inode in the key, two
        # writes inside one coarse mtime tick that leave the same size are still told apart.
        key = (st.st_ino, st.st_mtime_ns, st.st_size, date)
        with self._lock:
            kept = self._sums.get(path)
        if kept and kept[0] == key:
            return kept[1]
        book = read_book(path.parent)
        sums = (book.day(date).usd, book.month(date[:7]))
        with self._lock:
            self._sums[path] = (key, sums)
        return sums


def _ledgers(root: Path) -> list[Path]:
    """state/ledger.json of each folder directly under ROOT (no link followed to a folder)."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    return [
        Path(e.path) / "state" / LEDGER_FILE
        for e in entries
        if e.is_dir(follow_symlinks=False) and os.path.lexists(Path(e.path) / "state" / LEDGER_FILE)
    ]


FLEET_BOOKS = FleetBooks()  # one per process: the wakes of a serve share its reads


@dataclass(frozen=True)
class Over:
    """Why the next model call may not start: which cap, and the sentence for the receipt."""

    cap: str  # max_usd_per_wake | max_usd_per_day | max_usd_per_month | fleet.max_usd_per_*
    detail: str

    @property
    def reason(self) -> str:
        return f"{self.cap}: {self.detail}"


class Meter:
    """One wake's spending: `check()` before each model call, `record()` after.

    `billed=False` (a dry run) counts tokens but costs nothing and never stops."""

    def __init__(
        self,
        state_dir: Path,
        model: str,
        budget: Any,
        prices: dict[str, Price] | None,
        *,
        billed: bool = True,
        where: str = "policy",
        cache_ttl: str = "5m",
        fleet: FleetCaps | None = None,
    ):
        self.state_dir = Path(state_dir)
        self.fleet = fleet  # ROOT/budget.yaml's caps, or None
        self.cache_ttl = cache_ttl  # the loop's cache breakpoints: what a cache write costs
        self.budget = budget
        self.billed = billed
        self.price = check_caps(model, budget, prices or {}, where) if billed else None
        self.usd = 0.0  # this wake, reconciled from real usage
        self.tokens = 0

    def check(self, input_tokens: int, max_tokens: int) -> Over | None:
        """Why the next call may not start, or None."""
        if not self.billed or self.price is None:
            return None
        worst = worst_case_usd(self.price, input_tokens, max_tokens, self.cache_ttl)
        per_wake = getattr(self.budget, "max_usd_per_wake", None)
        if per_wake and self.usd + worst > per_wake:
            return Over(
                "max_usd_per_wake",
                f"the next model call could cost up to ${worst:.4f} "
                f"(~{input_tokens:,} input tokens, {max_tokens:,} max output); with "
                f"${self.usd:.4f} spent this wake that passes the cap of ${per_wake:.4f}",
            )
        return self._agent_over(worst) or self._fleet_over(worst)

    def _agent_over(self, worst: float) -> Over | None:
        per_day = getattr(self.budget, "max_usd_per_day", None)
        per_month = getattr(self.budget, "max_usd_per_month", None)
        if not (per_day or per_month):
            return None
        try:
            book = read_book(self.state_dir)
        except LedgerError as exc:
            return (
                Over("max_usd_per_day", f"today's spending is unknown: {exc}")
                if per_day
                else Over("max_usd_per_month", f"this month's spending is unknown: {exc}")
            )
        for cap, limit, spent, when in (
            ("max_usd_per_day", per_day, book.day().usd, "today (UTC)"),
            ("max_usd_per_month", per_month, book.month(), "this month (UTC)"),
        ):
            if limit and spent + worst > limit:
                return Over(
                    cap,
                    f"the next model call could cost up to ${worst:.4f}; with "
                    f"${spent:.4f} spent {when} that passes the cap of ${limit:.4f}",
                )
        return None

    def _fleet_over(self, worst: float) -> Over | None:
        fleet = self.fleet
        if not fleet:
            return None
        spent = FLEET_BOOKS.spent(fleet.root)
        for cap, limit, total, when in (
            ("max_usd_per_day", fleet.max_usd_per_day, spent.today, "today (UTC)"),
            ("max_usd_per_month", fleet.max_usd_per_month, spent.month, "this month (UTC)"),
        ):
            if limit and total + worst > limit:
                return Over(
                    f"fleet.{cap}",
                    f"{fleet.source}: the next model call could cost up to ${worst:.4f}; "
                    f"with ${total:.4f} spent {when} by the {spent.agents} agent(s) under {fleet.root} "
                    f"that passes the fleet's cap of ${limit:.4f}",
                )
        return None

    def record(self, usage: Usage, geo: str = "") -> float:
        """Book one request's real usage (geo: its usage.inference_geo); returns its cost in USD."""
        usd = cost_usd(self.price, usage, geo) if self.billed and self.price else 0.0
        self.usd += usd
        self.tokens += usage.tokens
        try:
            record(
                self.state_dir,
                usd,
                usage.tokens,
                priced=not self.billed or self.price is not None,
                thinking=usage.thinking_tokens,
            )
        except LedgerError:
            pass  # left as found, for a human: check() refuses the next call while a day cap needs it
        return usd
