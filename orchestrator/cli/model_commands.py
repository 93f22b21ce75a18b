"""`wakeloop models`: the models, their prices and lifecycle; --live asks the API.

Not here: the catalog (records/models.py), the table (views/model_table.py).
"""

from __future__ import annotations

import os
import sys

from orchestrator.cli.declare import command, json_flag, print_json
from orchestrator.errors import EXIT_FAILED, EXIT_OK
from orchestrator.policy.agent import AgentError


def cmd_models(args) -> int:
    from orchestrator.views.model_table import list_live, model_rows, render_models

    live = None
    if args.live:
        key = os.environ.get("ANTHROPIC_API_KEY", "").strip()
        if not key:
            raise AgentError("models --live: ANTHROPIC_API_KEY is not set; export it, or leave out --live")
        try:
            live = list_live(key)
        except Exception as exc:  # the SDK's errors: one line, exit 1 (the work failed)
            print(f"models --live: GET /v1/models failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
            return EXIT_FAILED
    rows = model_rows(live)
    print_json(rows) if args.json else print(render_models(rows))
    return EXIT_OK


def add_models(commands) -> None:
    """`wakeloop models [--live] [--json]`."""
    p = command(
        commands,
        "models",
        "the models: price, context window, lifecycle, the effort and thinking each accepts",
        "wakeloop models --live   # the account's own list, from GET /v1/models",
        cmd_models,
    )
    p.add_argument("--live", action="store_true", help="ask GET /v1/models with ANTHROPIC_API_KEY")
    json_flag(p, "every row whole, as JSON")
