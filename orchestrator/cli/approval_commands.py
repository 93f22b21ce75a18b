"""`wakeloop approvals`, `approve` and `deny`: the tool calls that wait for a person.

Not here: the files (records/approvals.py), the fleet's table of them (views/fleet_approvals.py).
"""

from __future__ import annotations

from orchestrator.cli.declare import command, json_flag, print_json
from orchestrator.errors import EXIT_OK
from orchestrator.policy.agent import AgentError, load_agent


def cmd_approvals(args) -> int:
    from pathlib import Path

    from orchestrator.views import fleet_approvals as view

    root = Path(args.root)
    if not root.is_dir():
        raise AgentError(f"{args.root}: no such folder; give ROOT (the folder of your agents) or an agent folder")
    found = view.rows(root)
    print_json(found) if args.json else print(view.render(found, root))
    return EXIT_OK


def cmd_decide(args) -> int:
    """`wakeloop approve|deny AGENT_DIR ID`: one line saying what was decided, or why nothing was."""
    import getpass

    from orchestrator.records import approvals

    agent = load_agent(args.agent_dir)
    approve = args.command == "approve"
    approval = approvals.decide(
        agent.state_dir,
        args.id,
        approve,
        by=f"{getpass.getuser()} (wakeloop CLI)",
        reason=getattr(args, "reason", "") or "",
    )
    if approve and args.now:
        from orchestrator.fleet.control import request_run

        request_run(agent.state_dir)
    when = "the wake requested now" if approve and args.now else "its next wake"
    print(
        f"{agent.name}: {approval.id} {approval.status} ({approval.summary()[:80]}); "
        + (f"it runs at the start of {when}" if approve else f"the agent is told at {when}")
    )
    return EXIT_OK


def add_approvals(commands) -> None:
    """`wakeloop approvals [ROOT]`, `approve AGENT_DIR ID`, `deny AGENT_DIR ID`."""
    p = command(
        commands,
        "approvals",
        "the tool calls that wait for a person (the policy's approve: rules), under ROOT or of one agent",
        "wakeloop approvals agents/ --json",
        cmd_approvals,
    )
    p.add_argument("root", nargs="?", default=".", metavar="ROOT|AGENT_DIR")
    json_flag(p, "every open approval whole (the exact call, the model's words) as a JSON list")
    p = command(
        commands,
        "approve",
        "approve a waiting call: it runs, exactly as asked, at the start of the agent's next wake",
        "wakeloop approve agents/mine a-3f2a9c1b",
        cmd_decide,
    )
    p.add_argument("agent_dir")
    p.add_argument("id")
    p.add_argument("--now", action="store_true", help="and ask serve for that wake now (as run-now does)")
    p = command(
        commands,
        "deny",
        "deny a waiting call: the agent is told at its next wake, with the reason",
        "wakeloop deny agents/mine a-3f2a9c1b --reason 'not on a Friday'",
        cmd_decide,
    )
    p.add_argument("agent_dir")
    p.add_argument("id")
    p.add_argument("--reason", default="", help="told to the agent")
