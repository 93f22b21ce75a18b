"""`wakeloop models`: every model the harness knows, with its price, context window, lifecycle and
what it accepts; with `--live`, the account's own answer from GET /v1/models laid over it.

A row joins three sources: the model catalog (records/models.json: lifecycle, context window, effort
levels, thinking forms), the price table (records/prices.json, or WAKELOOP_PRICES) and, when asked,
the API's list (lifecycle, retires_at, max_input_tokens, max_tokens, the capabilities it reports).
The API wins where it answers: it knows this account and today.

Not here: the warnings themselves (records/models.py `lifecycle_warning`), prices (records/ledger.py).
"""

from __future__ import annotations

from datetime import date
from typing import Any

from orchestrator.records.ledger import Price, load_prices, table_entry
from orchestrator.records.models import catalog, lifecycle_warning
from orchestrator.sandbox.containers.output import clean

HEADER = ["MODEL", "LIFECYCLE", "RETIRES", "CONTEXT", "MAX OUT", "USD IN/OUT/READ per MTok", "EFFORT", "THINKING"]


def model_rows(live: list[dict] | None = None, today: date | None = None) -> list[dict]:
    """One dict a model: the catalog's and the price table's models, and any the API lists."""
    prices = load_prices()
    known = catalog()
    listed = {str(m.get("id")): m for m in live or []}
    rows = []
    for name in dict.fromkeys([*known, *listed, *(p for p in prices if p not in known)]):
        info = known.get(name)
        row: dict[str, Any] = {
            "id": name,
            "lifecycle": info.lifecycle if info else None,
            "retires_at": info.retires_at if info else None,
            "context_window": info.context_window if info else None,
            "max_output": info.max_output if info else None,
            "effort": list(info.effort) if info else None,
            "thinking": list(info.thinking) if info else None,
            "price": _price(table_entry(name, prices)),
            "source": info.source if info else None,
            "live": name in listed,
        }
        if name in listed:
            row.update(_from_api(listed[name]))
        row["warning"] = _warning(row, today)
        rows.append(row)
    return rows


def _price(price: Price | None) -> dict | None:
    if price is None:
        return None
    if price.unpriced:
        return {"unpriced": price.unpriced, "source": price.source}
    out: dict[str, Any] = {
        k: getattr(price, k) for k in ("input", "output", "cache_write_5m", "cache_write_1h", "cache_read")
    }
    if price.long_prompt:
        out["above_tokens"] = price.long_above
        out["long_prompt"] = _price(price.long_prompt)
    if price.inference_geo:
        out["inference_geo"] = dict(price.inference_geo)
    out["source"] = price.source
    return out


def _from_api(m: dict) -> dict:
    """What GET /v1/models says of one model, in the row's names (only the fields it gave)."""
    out: dict[str, Any] = {}
    if m.get("lifecycle"):
        out["lifecycle"] = m["lifecycle"]
    if m.get("retires_at"):
        out["retires_at"] = str(m["retires_at"])[:10]
    if m.get("max_input_tokens"):
        out["context_window"] = m["max_input_tokens"]
    if m.get("max_tokens"):
        out["max_output"] = m["max_tokens"]
    caps = m.get("capabilities") or {}
    effort = caps.get("effort") if isinstance(caps, dict) else None
    if isinstance(effort, dict) and "supported" in effort:
        out["effort"] = [k for k in ("low", "medium", "high", "xhigh", "max") if _yes(effort.get(k))]
    types = ((caps.get("thinking") or {}).get("types") or {}) if isinstance(caps, dict) else {}
    if isinstance(types, dict) and types:
        out["thinking"] = [k for k in ("adaptive", "between_tools", "disabled", "enabled") if _yes(types.get(k))]
    return out


def _yes(support: Any) -> bool:
    return isinstance(support, dict) and bool(support.get("supported"))


def _warning(row: dict, today: date | None) -> str | None:
    """The catalog's warning, or one from the API's lifecycle and retires_at when they say more."""
    today = today or date.today()
    if row["live"] and row["lifecycle"] in ("deprecated", "retired"):
        when = f", retires {row['retires_at']}" if row.get("retires_at") else ""
        return f"model {row['id']} is {row['lifecycle']} (GET /v1/models{when})"
    return lifecycle_warning(row["id"], today)


def list_live(api_key: str) -> list[dict]:
    """GET /v1/models with the key (the SDK honours ANTHROPIC_BASE_URL), every page, as plain dicts."""
    import anthropic

    with anthropic.Anthropic(api_key=api_key, max_retries=2) as client:
        return [m.model_dump(mode="json") for m in client.models.list(limit=1000)]


def render_models(rows: list[dict]) -> str:
    table = [HEADER]
    for r in rows:
        table.append(
            [
                r["id"] + (" *" if r["live"] else ""),
                r["lifecycle"] or "?",
                r["retires_at"] or "",
                _tokens(r["context_window"]),
                _tokens(r["max_output"]),
                _rates(r["price"]),
                ",".join(r["effort"]) if r["effort"] else "-" if r["effort"] is not None else "?",
                ",".join(r["thinking"]) if r["thinking"] else "?",
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    soon = [r for r in rows if r["warning"] and r["retires_at"] and r["lifecycle"] != "retired"]
    lines += [f"! {clean(r['warning'])}" for r in soon]
    if any(r["live"] for r in rows):
        lines.append("* listed by GET /v1/models for this key")
    return "\n".join(lines)


def _tokens(n: int | None) -> str:
    if not n:
        return "?"
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}K"


def _rates(price: dict | None) -> str:
    if price is None:
        return "no price"
    if "unpriced" in price:
        return "unpriced"
    band = f" (>{price['above_tokens'] // 1000}K: {_rates(price['long_prompt'])})" if "long_prompt" in price else ""
    return f"{price['input']:g}/{price['output']:g}/{price['cache_read']:g}{band}"
