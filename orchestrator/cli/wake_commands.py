"""`wakeloop wake` and `wakeloop context`: one wake, and what the next one sends.

Not here: the wake itself (wake/loop.py), the notifications sent after it (notify_commands.py).
"""

from __future__ import annotations

import sys
from datetime import UTC

from orchestrator.cli.declare import command, json_flag, print_json
from orchestrator.cli.notify_commands import send_notifications
from orchestrator.errors import EXIT_FAILED, EXIT_OK
from orchestrator.policy.agent import load_agent
from orchestrator.records.receipt import FAILED
from orchestrator.sandbox.engine import DockerSandbox


def cmd_wake(args) -> int:
    from orchestrator import tracing

    tracing.setup()
    import signal
    import threading
    from pathlib import Path

    from orchestrator.wake.loop import wake

    agent = load_agent(args.agent_dir)
    live = True if args.live else False if args.dry_run else None
    stop = threading.Event()  # SIGTERM ends the wake at the next step boundary, cleanly

    def stopping():
        stop.set()
        print("wakeloop: SIGTERM: the wake ends at its next step boundary", file=sys.stderr, flush=True)

    # From a thread: Event.set takes a lock the interrupted code may be holding.
    previous = signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=stopping).start())
    try:
        receipt = wake(
            agent,
            live=live,
            stop=stop,
            script=Path(args.script) if args.script else None,
            echo=lambda line: print(line, file=sys.stderr, flush=True),
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(receipt.to_json(), flush=True)  # always the last line: scripts parse it
    send_notifications(agent)
    return EXIT_FAILED if receipt.status in FAILED else EXIT_OK


def cmd_context(args) -> int:
    """What the next wake sends (context.next_wake): dry or live as `wake` would decide, or as asked."""
    from datetime import datetime

    from orchestrator.records.state import load_state
    from orchestrator.wake.context import next_wake

    agent = load_agent(args.agent_dir)
    live = True if args.live else False if args.dry_run else not agent.dry_run
    state, warning = load_state(agent.state_dir)
    if warning:
        print(warning, file=sys.stderr)
    from orchestrator.broker.client import broker_socket, open_files
    from orchestrator.sandbox.box import SandboxError

    box = None
    if agent.policy.sandbox.disk and not broker_socket() and _has_disk(agent):
        # The memory is on the agent's disk: attached for this reading, released after.
        try:
            box = DockerSandbox(
                agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0, folder=agent.dir.resolve()
            )
        except SandboxError as exc:
            print(f"wakeloop: the workspace is read from the folder, not the agent's disk ({exc})", file=sys.stderr)
    try:
        files = box.files() if box else open_files(agent)
        upcoming = next_wake(agent, live=live, wake=state.wake + 1, now=datetime.now(UTC), files=files)
    finally:
        if box:
            box.close()
    if args.json:
        print_json(upcoming.to_json(agent.name))
        return EXIT_OK
    print(upcoming.render(), end="")
    return EXIT_OK


def _has_disk(agent) -> bool:
    """The agent folder has a disk here (else its workspace/ is what its first wake copies)."""
    from orchestrator.sandbox.disks import disk, disk_index

    key = disk_index.lookup(agent.dir.resolve())
    return bool(key and disk.path_of(key, "img").exists())


# wake --script FILE: the format wake/model.py's load_script reads and ScriptedModel plays
# (tests/test_docgen.py plays this example).
SCRIPT_FORMAT = """\
--script FILE: the dry run's model, scripted. A JSON list of turns (or
`{"turns": [...]}`), one per model call, in order; at most 1 MiB. Each turn
is an object with any of `"text"` (what the model says), `"tool_calls"` (a
list of `{"name": TOOL, "input": {...}}`: each runs for real, in the sandbox,
as the model's call would; the script does not read the result) and
`"stop_reason"` (default: `tool_use` when the turn calls a tool, else
`end_turn`, which ends the wake). `{wake}` and `{today}` in any string become
the wake's number and its UTC date (YYYY-MM-DD). After the last turn the
model says "(end of script)" and the wake ends. The file is checked before
the wake starts (a bad one is one line naming the turn); not with --live.

  [
    {"text": "Looking around.", "tool_calls": [{"name": "bash", "input": {"command": "ls -la"}}]},
    {"tool_calls": [{"name": "write_file",
                     "input": {"path": "notes/{today}.md", "content": "wake {wake}\\n"}}]},
    {"text": "Done for today."}
  ]

  wakeloop wake agents/mine --script script.json
"""


def add_wake(commands) -> None:
    """`wakeloop wake AGENT_DIR [--live|--dry-run] [--script FILE]`."""
    p = command(
        commands,
        "wake",
        "one wake; progress on stderr, its JSON receipt alone on stdout",
        "wakeloop wake agents/mine --live | jq .status",
        cmd_wake,
        more=SCRIPT_FORMAT,
    )
    p.add_argument("agent_dir")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--live", action="store_true", help="call the API (needs ANTHROPIC_API_KEY)")
    mode.add_argument(
        "--dry-run", action="store_true", help="no API call: a scripted model drives the real tools (the default)"
    )
    p.add_argument(
        "--script", metavar="FILE", help="a JSON dry-run script to use instead of the built-in one (its format: below)"
    )


def add_context(commands) -> None:
    """`wakeloop context AGENT_DIR [--live|--dry-run]`."""
    p = command(
        commands,
        "context",
        "print exactly the system prompt and first user message the next wake sends (its task and, if live, "
        "your queued messages), and whether it is a dry run or live; changes nothing",
        "wakeloop context agents/mine | less",
        cmd_context,
    )
    p.add_argument("agent_dir")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--live", action="store_true", help="as a live wake would send it (`wake --live`)")
    mode.add_argument("--dry-run", action="store_true", help="as a dry run would (`wake --dry-run`)")
    json_flag(p)
