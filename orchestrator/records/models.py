"""The models a user picks: what each accepts (effort, thinking forms, forced tool_choice), its
context window, and its lifecycle, as data (models.json beside this file, each entry with its source).

The harness reads it to build a request the model accepts (wake/model.py), to check an agent's
`effort:` and `thinking:` before its first wake (policy/agent.py), and to warn when an agent's model
is legacy or retires soon (`status`, the console, a notification; `wakeloop models`). A model the
table does not know (a proxy's, a newer SDK's) is not refused: nothing model-specific is sent for
it unless the agent asks, and the API is the judge.

Not here: prices (ledger.py, prices.json).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

MODELS_FILE = Path(__file__).with_name("models.json")
EFFORTS = ("low", "medium", "high", "xhigh", "max")  # output_config.effort, the SDK's OutputConfigParam
THINKING_TYPES = ("adaptive", "between_tools", "disabled", "enabled")  # the SDK's ThinkingConfigParam
DISPLAYS = ("summarized", "omitted")
WARN_DAYS = 60  # a retirement this close is worth a warning (the API gives at least 60 days' notice)
_DATED = re.compile(r"^(.*)-\d{8}$")  # claude-haiku-4-5-20251001 -> claude-haiku-4-5


@dataclass(frozen=True)
class ModelInfo:
    id: str
    context_window: int
    max_output: int
    lifecycle: str  # active | legacy | deprecated | retired
    retires_at: str | None  # YYYY-MM-DD, when known
    effort: tuple[str, ...]  # accepted output_config.effort levels; () = no effort parameter
    default_effort: str | None
    thinking: tuple[str, ...]  # accepted thinking.type values
    thinking_default: str  # what the model does when thinking is omitted: adaptive | off
    display: bool  # thinking.display offered, omitted by default: ask for "summarized"
    forced_tool_choice: bool  # tool_choice any/tool accepted
    source: str


@functools.cache
def catalog() -> dict[str, ModelInfo]:
    raw = json.loads(MODELS_FILE.read_text(encoding="utf-8"))["models"]
    return {
        name: ModelInfo(
            id=name,
            context_window=int(e["context_window"]),
            max_output=int(e["max_output"]),
            lifecycle=str(e["lifecycle"]),
            retires_at=e.get("retires_at"),
            effort=tuple(e["effort"]),
            default_effort=e.get("default_effort"),
            thinking=tuple(e["thinking"]),
            thinking_default=str(e["thinking_default"]),
            display=bool(e["display"]),
            forced_tool_choice=bool(e["forced_tool_choice"]),
            source=str(e["source"]),
        )
        for name, e in raw.items()
    }


def model_info(model: str) -> ModelInfo | None:
    """The model's entry, by its id or a dated snapshot's undated name; None when unknown."""
    known = catalog()
    if model in known:
        return known[model]
    dated = _DATED.match(model)
    return known.get(dated.group(1)) if dated else None


def lifecycle_warning(model: str, today: date | None = None) -> str | None:
    """One line when the model is legacy, deprecated, retired or retires within WARN_DAYS; else None."""
    info = model_info(model)
    if info is None or (info.lifecycle == "active" and not info.retires_at):
        return None
    today = today or date.today()
    left = (date.fromisoformat(info.retires_at) - today).days if info.retires_at else None
    if info.lifecycle == "retired" or (left is not None and left <= 0):
        when = info.retires_at or "date unknown"
        return f"model {model} is retired ({when}): requests to it fail; pick a current one (`wakeloop models`)"
    if left is not None and left <= WARN_DAYS:
        return (
            f"model {model} retires on {info.retires_at} ({left} days): "
            "move the agent to a current one (`wakeloop models`)"
        )
    if info.lifecycle in ("legacy", "deprecated"):
        return f"model {model} is {info.lifecycle}: a current one is cheaper or better (`wakeloop models`)"
    return None


# -- effort and thinking: what an agent asks for, checked, and the request fields it becomes ------------


@dataclass(frozen=True)
class Thinking:
    """agent.yaml's `thinking:`: a type (the API's: adaptive, between_tools, disabled, enabled; "" = the
    default, adaptive where the model thinks adaptively when left alone), its display, and enabled's budget."""

    type: str = ""
    display: str = ""  # "" = summarized where the model offers a display (so its words come back)
    budget_tokens: int = 0  # type enabled only


def check_choice(model: str, effort: str | None, thinking: Thinking) -> str | None:
    """Why the model would refuse this effort or thinking (the fix in the same line), or None.
    An unknown model is the API's to judge."""
    info = model_info(model)
    if effort is not None and effort not in EFFORTS:
        return f"effort: expected one of {', '.join(EFFORTS)}, got {effort!r}"
    if thinking.type and thinking.type not in THINKING_TYPES:
        return f"thinking: expected one of {', '.join(THINKING_TYPES)}, got {thinking.type!r}"
    if thinking.display and thinking.display not in DISPLAYS:
        return f"thinking.display: expected summarized or omitted, got {thinking.display!r}"
    if thinking.type == "enabled" and thinking.budget_tokens < 1024:
        return "thinking.budget_tokens: type enabled needs a budget of at least 1024 tokens"
    if info is None:
        return None
    if effort is not None and effort not in info.effort:
        accepted = ", ".join(info.effort) if info.effort else "none (leave effort out)"
        return f"effort: {model} does not accept {effort!r} (it accepts: {accepted})"
    if thinking.type and thinking.type not in info.thinking:
        hint = " (between_tools turns thinking off on it)" if "between_tools" in info.thinking else ""
        return f"thinking: {model} does not accept {thinking.type!r} (it accepts: {', '.join(info.thinking)}){hint}"
    if thinking.display and not info.display:
        return f"thinking.display: {model} offers no display setting (leave it out)"
    if info.id == "claude-opus-5" and thinking.type == "disabled" and effort in ("xhigh", "max"):
        return f"thinking: {model} turns thinking off only at effort high or below (effort is {effort})"
    return None


def request_fields(model: str, effort: str | None, thinking: Thinking) -> dict[str, Any]:
    """The request's `output_config` and `thinking` for this choice (check_choice passed): nothing
    the model does not take. By default, adaptive thinking where the model thinks adaptively when
    left alone (5.x), with its summaries asked for where the display defaults to omitted (else the
    model's words between tool calls come back as empty thinking blocks)."""
    info = model_info(model)
    fields: dict[str, Any] = {"output_config": {"effort": effort}} if effort else {}
    # unasked, the model's own default: adaptive where it thinks by default (5.x); an older model that
    # only offers it is not switched to thinking behind an existing agent's back
    kind = thinking.type or ("adaptive" if info and info.thinking_default == "adaptive" else "")
    if not kind:
        return fields
    config: dict[str, Any] = {"type": kind}
    if kind == "enabled":
        config["budget_tokens"] = thinking.budget_tokens
    offered = info.display if info else bool(thinking.display)  # an unknown model: only when asked
    if kind in ("adaptive", "enabled") and offered:
        config["display"] = thinking.display or "summarized"
    fields["thinking"] = config
    return fields
