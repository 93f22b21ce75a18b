"""`wakeloop`: the parser, built from the command groups in the order --help lists them, and
the dispatch (the exit codes: docs/architecture.md §4).

Each group's module declares its commands beside their handlers (an `add_*` function per run
of commands); ORDER below places them. The order is the one `wakeloop --help` and
docs/cli.md have always listed, which interleaves the groups (`sandbox`, `wake`, `disk`), so
the order is a list of those functions rather than one per module. After any command, the
disks it attached are let go and the allowlist proxies it started removed, however it ended.

Not here: any command (orchestrator/cli/ has one module per group), how a command is
declared (declare.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from orchestrator import __version__
from orchestrator.cli import (
    agent_commands,
    approval_commands,
    disk_commands,
    escape_commands,
    fleet_commands,
    model_commands,
    notify_commands,
    policy_commands,
    record_commands,
    sandbox_commands,
    swarm_commands,
    task_commands,
    wake_commands,
)
from orchestrator.errors import EXIT_ENVIRONMENT, EXIT_OK, EXIT_USAGE, WakeloopError

EPILOG = """\
exit codes: 0 ok (a wake stopped at a budget cap is ok, and says so); 1 the work
failed (dead letter, blocked, not committed, an escape); 2 bad usage or configuration; 3 the
environment (no engine, no broker, permission denied on the socket).

start here:
  wakeloop init agents/mine && wakeloop wake agents/mine    # a dry run: no API key needed
"""


# The commands, in the order --help lists them: each function adds one command, or a run of them.
ORDER = (
    agent_commands.add_init,
    sandbox_commands.add_sandbox,
    wake_commands.add_wake,
    disk_commands.add_disk,
    swarm_commands.add_swarm,
    wake_commands.add_context,
    agent_commands.add_messages,  # send, outbox
    model_commands.add_models,
    record_commands.add_status,
    task_commands.add_task,
    fleet_commands.add_serve,
    fleet_commands.add_broker,
    record_commands.add_log,  # log, transcript
    record_commands.add_changes,  # diff, undo
    swarm_commands.add_move,
    notify_commands.add_notify,
    fleet_commands.add_control,  # pause, resume, run-now
    fleet_commands.add_switch,  # stop, start
    approval_commands.add_approvals,  # approvals, approve, deny
    policy_commands.add_policy,
    sandbox_commands.add_image,
    escape_commands.add_escapes,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wakeloop",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a Claude agent unattended on a schedule; every tool call runs "
        "in a fresh, hardened, disposable container.",
    )
    parser.add_argument("--version", action="version", version=f"wakeloop {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in ORDER:
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):  # bare `wakeloop`, or `wakeloop task` alone
        parser.print_help()
        return EXIT_OK if args.command is None else EXIT_USAGE
    from orchestrator.sandbox.disks import disk, disk_attach

    held_before = disk.holding()  # an embedding process's own (tests): not this command's to let go
    try:
        return args.func(args)
    except WakeloopError as exc:
        print(f"wakeloop: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("wakeloop: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `wakeloop log DIR | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except PermissionError as exc:
        if not _in_disks_dir(exc.filename):
            raise
        # A path of root's $WAKELOOP_DISKS that a check before it did not foresee: still one line.
        print(f"wakeloop: {disk_attach.refusal(f'{exc.strerror}: {exc.filename}')}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    finally:
        _release_disks(held_before)


def _in_disks_dir(filename) -> bool:
    from orchestrator.sandbox.disks import disk

    return isinstance(filename, str) and Path(filename).is_relative_to(disk.disks_dir())


def _release_disks(held_before: frozenset) -> None:
    """Let go of every disk this command still holds (a wake, `sandbox exec`, `escapes`, any
    that attached) and the allowlist proxies it started, whatever ended it (keeper.let_go_here)."""
    from orchestrator.sandbox import keeper

    for line in keeper.let_go_here(held_before):
        print(f"wakeloop: {line}", file=sys.stderr)
