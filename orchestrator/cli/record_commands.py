"""`wakeloop status`, `log`, `transcript`, `diff` and `undo`: what the agents' records say,
and one wake's changes read back or put back.

Not here: the records (records/), how they are rendered (views/), the undo itself
(sandbox/wakes/undo_folders.py, through the broker under compose).
"""

from __future__ import annotations

import json
import sys

from orchestrator.cli.declare import command, json_flag, print_json
from orchestrator.cli.wake_lock import no_wake
from orchestrator.errors import EXIT_OK
from orchestrator.policy.agent import AgentError, load_agent


def cmd_status(args) -> int:
    from pathlib import Path

    from orchestrator.fleet.schedule import agent_dirs
    from orchestrator.views.agent_status import agent_status, render_agent_status
    from orchestrator.views.fleet_table import fleet_status, render_fleet

    root = Path(args.path)
    if not (root / "agent.yaml").is_file():  # a folder with agent.yaml is an agent; else a root
        if not agent_dirs(root):
            raise AgentError(
                f"{args.path}: no agent.yaml here or in its subdirectories; create one with `wakeloop init {args.path}`"
            )
        rows = fleet_status(root)
        print_json(rows) if args.json else print(render_fleet(rows, root))
        return EXIT_OK
    data = agent_status(load_agent(root))
    print_json(data) if args.json else print(render_agent_status(data))
    return EXIT_OK


def cmd_log(args) -> int:
    """The retained history, oldest first, across rotated segments; streamed."""
    from pathlib import Path

    from orchestrator.records.events import raw_history, read_history
    from orchestrator.views import logview
    from orchestrator.views.eventview import format_event

    if args.egress:  # one agent's record: a ROOT is refused by load_agent, in one line
        return _egress_log(args.agent_dir, args.run, args.json)
    if not (Path(args.agent_dir) / "agent.yaml").exists():
        from orchestrator.fleet.schedule import agent_dirs

        if agent_dirs(Path(args.agent_dir)):  # ROOT: follow every agent's events
            logview.follow_root(Path(args.agent_dir), lambda line: print(line, flush=True))
            return EXIT_OK
    if args.run is not None or args.follow:
        return _transcript(args.agent_dir, args.run, args.follow, args.json, args.system)
    agent = load_agent(args.agent_dir)
    if args.json:
        sys.stdout.writelines(raw_history(agent.state_dir))
        return EXIT_OK
    for event in read_history(agent.state_dir):
        print(format_event(event))
    return EXIT_OK


def _egress_log(agent_dir: str, run: str | None, as_json: bool) -> int:
    """Every egress decision retained (state/egress.jsonl), oldest first; --run: one wake's."""
    from orchestrator.records import egress
    from orchestrator.records.run_ids import resolve
    from orchestrator.records.transcript import find_run
    from orchestrator.views.egressview import format_decision

    agent = load_agent(agent_dir)
    if run is not None and run in ("", "last"):  # the newest wake, as for its transcript
        newest = find_run(agent.state_dir, run)
        run = newest.name.partition(".")[0] if newest else None
        if run is None:
            raise AgentError(f"{agent.name}: no wake yet; one is run by `wakeloop wake {agent_dir}`")
    elif run is not None:
        run = resolve(agent.state_dir, run, agent_dir, also=egress.runs(agent.state_dir))
    if as_json:
        lines = egress.raw_lines(agent.state_dir)
        sys.stdout.writelines(line for line in lines if run is None or egress.parse_line(line).run_id == run)
        return EXIT_OK
    shown = 0
    for line in egress.read(agent.state_dir, run):
        print(format_decision(line))
        shown += 1
    if not shown:
        print(
            f"(no egress decisions{' for run ' + repr(run) if run else ''}: a policy with "
            "`network: allowlist` records one per connection in state/egress.jsonl)"
        )
    return EXIT_OK


def cmd_transcript(args) -> int:
    if args.run and args.run_option and args.run != args.run_option:
        raise AgentError(f"transcript: two run ids ({args.run}, --run {args.run_option}); give one")
    return _transcript(args.agent_dir, args.run or args.run_option or "", args.follow, args.json, args.system)


def _transcript(agent_dir: str, run: str | None, follow: bool, as_json: bool, system: bool) -> int:
    from orchestrator.records.run_ids import resolve
    from orchestrator.records.transcript import find_run, read_lines
    from orchestrator.views import logview

    agent = load_agent(agent_dir)
    if run and run != "last":
        run = resolve(agent.state_dir, run, agent_dir)
    path = find_run(agent.state_dir, run)
    if path is None:
        raise AgentError(
            f"{agent.name}: no transcript "
            + (
                f"for run {run} (pruned, or never written; `wakeloop log {agent_dir}` lists runs)"
                if run and run != "last"
                else f"yet; one is written by every wake: `wakeloop wake {agent_dir}`"
            )
        )
    if follow:
        logview.follow_transcript(path, lambda line: print(line, flush=True))
        return EXIT_OK
    lines = list(read_lines(path))
    if as_json:
        for line in lines:
            print(json.dumps(line, ensure_ascii=False))
        return EXIT_OK
    for text in logview.render_transcript(lines, agent.state_dir, system=system):
        print(text)
    if not lines or lines[-1]["type"] != "end":
        print(f"(no end line: the wake is running, or was killed; `wakeloop log {agent_dir} -f` follows it)")
    return EXIT_OK


def cmd_diff(args) -> int:
    """One wake's changes, read from its undo folder on the agent's disk (the broker's, under compose)."""
    from orchestrator.broker.client import read_wake_diff
    from orchestrator.records.run_ids import resolve
    from orchestrator.views.diffview import render_text

    agent = load_agent(args.agent_dir)
    run = None if args.run is None else resolve(agent.state_dir, args.run, args.agent_dir)
    diff = read_wake_diff(agent, run)
    if args.json:
        print_json(diff.change_set())
    else:
        sys.stdout.write(render_text(diff))
    return EXIT_OK


def cmd_undo(args) -> int:
    """Put back what one wake changed, holding the agent's wake lock (no wake runs meanwhile)."""
    from orchestrator.broker.client import undo_wake
    from orchestrator.records import event_types as ev
    from orchestrator.records.events import EVENTS_FILE, EventLog
    from orchestrator.records.run_ids import resolve
    from orchestrator.sandbox.wakes.undo_folders import UndoRefused

    agent = load_agent(args.agent_dir)
    run = resolve(agent.state_dir, args.run, args.agent_dir)
    with no_wake(args.agent_dir, agent.state_dir, UndoRefused, "undo when the wake has ended"):
        undone = undo_wake(agent, run, args.force)
        EventLog(agent.state_dir / EVENTS_FILE, undone.run_id).write(
            ev.WorkspaceUndone(
                undone_run=undone.run_id, changes=undone.changes, paths=undone.paths, forced_over=undone.forced_over
            )
        )
    over = f", over later wake(s) {', '.join(undone.forced_over)}" if undone.forced_over else ""
    print(f"undid wake {undone.run_id}: {undone.changes} change(s) put back{over}")
    return EXIT_OK


def add_status(commands) -> None:
    """`wakeloop status AGENT_DIR|ROOT`."""
    p = command(
        commands,
        "status",
        "wakes, tokens, cost, last receipt, lock holder; for ROOT, one table of every agent",
        "wakeloop status agents/   # or agents/mine",
        cmd_status,
    )
    p.add_argument("path", metavar="AGENT_DIR|ROOT")
    json_flag(p, "every field whole, as JSON")


def add_log(commands) -> None:
    """`wakeloop log AGENT_DIR|ROOT` and `wakeloop transcript AGENT_DIR [ID]`."""
    p = command(
        commands,
        "log",
        "the event log, readable; --run ID: one wake's transcript; -f: follow the "
        "running wake; ROOT: follow every agent's events",
        "wakeloop log agents/mine --run last   # or: wakeloop log agents/ (follows all)",
        cmd_log,
    )
    p.add_argument("agent_dir", metavar="AGENT_DIR|ROOT")
    p.add_argument(
        "--run",
        metavar="ID",
        help="show this wake's transcript (a run id or a unique prefix of 4+ hex digits; `last` or empty: the newest)",
    )
    p.add_argument("-f", "--follow", action="store_true", help="follow the newest wake's transcript until it ends")
    p.add_argument("--system", action="store_true", help="with a transcript: print the system prompt too")
    p.add_argument(
        "--egress",
        action="store_true",
        help="the egress proxy's decisions instead (state/egress.jsonl): one line per connection or "
        "request, allowed or denied, the rule that decided, bytes each way; with --run, one wake's",
    )
    json_flag(p, "the raw JSONL lines")

    p = command(
        commands,
        "transcript",
        "one wake's transcript: who spoke, what ran, exit codes, timings, cost",
        "wakeloop transcript agents/mine 3f2a   # the newest wake without an id",
        cmd_transcript,
    )
    p.add_argument("agent_dir")
    p.add_argument(
        "run", nargs="?", metavar="ID", help="a run id or a unique prefix of 4+ hex digits (default: the newest)"
    )
    p.add_argument("--run", dest="run_option", metavar="ID", help="the same, as `log --run` takes it")
    p.add_argument("-f", "--follow", action="store_true", help="follow it until the wake ends")
    p.add_argument("--system", action="store_true", help="print the system prompt too")
    json_flag(p, "the raw JSONL lines")


def add_changes(commands) -> None:
    """`wakeloop diff AGENT_DIR [--run ID]` and `wakeloop undo AGENT_DIR --run ID`."""
    p = command(
        commands,
        "diff",
        "what one wake changed in the workspace, as a unified diff (binary files by size and sha256, links as links)",
        "wakeloop diff agents/mine --run 3f2a9c0b",
        cmd_diff,
    )
    p.add_argument("agent_dir")
    p.add_argument(
        "--run",
        metavar="ID",
        help="the wake's run id, or a unique prefix of 4+ hex digits (default: the last wake that committed changes)",
    )
    json_flag(p, "the change set as JSON")
    p = command(
        commands,
        "undo",
        "put back what one wake changed; refused while the agent wakes, or when a later wake "
        "changed the same paths, or an earlier one undone since did (unless --force)",
        "wakeloop undo agents/mine --run 3f2a9c0b",
        cmd_undo,
    )
    p.add_argument("agent_dir")
    p.add_argument(
        "--run",
        metavar="ID",
        required=True,
        help="the wake's run id, or a unique prefix of 4+ hex digits (`wakeloop log` shows the first 8)",
    )
    p.add_argument("--force", action="store_true", help="undo it even over other wakes that changed the same paths")
