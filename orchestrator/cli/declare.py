"""How a command is declared and what every command prints alike: its --help (a description,
an example, then more after a blank line: docgen renders them into docs/cli.md), a subcommand
group, the --json flag, and JSON as a person may safely read it.

Not here: any command (each group's module), the order of the commands (wakeloop.py).
"""

from __future__ import annotations

import argparse

from orchestrator.safeio.shown import json_shown


def print_json(data) -> None:
    print(json_shown(data))  # exact when parsed; on a terminal no bidi or zero-width character hides


def command(sub, name: str, summary: str, example: str, func=None, more: str = "", **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose --help has a description and an example, then `more` (a file format,
    say), after a blank line: docgen renders both into docs/cli.md."""
    p = sub.add_parser(
        name,
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=f"example:\n  {example}" + (f"\n\n{more}" if more else ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kwargs,
    )
    if func:
        p.set_defaults(func=func)
    return p


def group(sub, name: str, summary: str, example: str):
    """A command of subcommands (`wakeloop disk list|release|rm`): the subparsers to add them to."""
    return command(sub, name, summary, example).add_subparsers(
        dest=f"{name}_command", metavar="SUBCOMMAND", required=True
    )


def json_flag(p: argparse.ArgumentParser, what: str = "the same data as JSON") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what}, for scripts")
