"""The command line's groups all reach the parser: orchestrator/cli/ has one module per command
group, each declaring its commands in `add_*` functions beside their handlers, and
cli/wakeloop.py's ORDER places every one of them once, in the order --help lists them.

No engine needed. Not here: what each command's help says (docs/cli.md, test_docgen.py).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil

import orchestrator.cli
from orchestrator.cli.wakeloop import ORDER


def _adders() -> set:
    found = set()
    for info in pkgutil.iter_modules(orchestrator.cli.__path__):
        module = importlib.import_module(f"orchestrator.cli.{info.name}")
        found |= {f for name, f in inspect.getmembers(module, inspect.isfunction) if name.startswith("add_")}
    return found


def test_every_group_function_is_placed_once_in_the_order():
    assert len(ORDER) == len(set(ORDER))
    assert {f"{f.__module__}.{f.__name__}" for f in _adders()} == {f"{f.__module__}.{f.__name__}" for f in ORDER}


def _handlers(parser: argparse.ArgumentParser) -> list:
    """Every handler under `parser`: its own, and its subcommands' (`disk list`, `disk rm`)."""
    found = [parser.get_default("func")] if parser.get_default("func") else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _handlers(sub)
    return found


def test_each_group_declares_the_commands_of_its_own_handlers():
    """What `records.add_log` adds runs records' handlers (`log`, `transcript`), and every
    command it adds runs one: a parser beside its handlers, none reaching into another group."""
    for add in ORDER:
        parser = argparse.ArgumentParser()
        add(parser.add_subparsers())
        handlers = _handlers(parser)
        assert handlers, f"{add.__module__}.{add.__name__} adds no command that runs"
        assert {h.__module__ for h in handlers} == {add.__module__}, (add.__name__, handlers)
