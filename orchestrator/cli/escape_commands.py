"""`wakeloop escapes`: the escape suite against the live engine.

Not here: the probes, the runner and the report (escapes/).
"""

from __future__ import annotations

from orchestrator.cli.declare import command, json_flag
from orchestrator.policy.agent import AgentError


def cmd_escapes(args) -> int:
    from orchestrator.escapes.command import Through, list_probes, run

    if args.list:
        return list_probes(as_json=args.json)
    through = None
    if args.broker or args.root or args.node:
        if not (args.broker and args.root):
            raise AgentError("escapes: --broker ADDRESS and --root ROOT go together (--node with them)")
        through = Through(args.broker, args.root, args.node)
    return run(args.agent_dir, args.policy, args.runtime, args.json, args.probe, through)


def add_escapes(commands) -> None:
    """`wakeloop escapes [AGENT_DIR|--policy FILE] [--runtime R] [--json]`."""
    p = command(
        commands,
        "escapes",
        "run the escape suite against the live engine under a policy; exit 1 if anything escaped",
        "wakeloop escapes --runtime runsc --policy policies/networked.yaml",
        cmd_escapes,
    )
    p.add_argument("agent_dir", nargs="?", help="use this agent's policy (probes run in a throwaway agent)")
    p.add_argument("--policy", help="use this policy file instead (default: the default policy)")
    p.add_argument("--runtime", help="override the policy's runtime, e.g. runsc")
    json_flag(p, "one JSON report instead of the table (with --list: the probes)")
    p.add_argument("--probe", action="append", metavar="NAME", help="run only this probe (repeatable)")
    p.add_argument("--list", action="store_true", help="list the probes and exit")
    p.add_argument(
        "--broker",
        metavar="ADDRESS",
        help="run the box's probes through this broker (tls://HOST:PORT with $WAKELOOP_TLS_DIR, or a socket)",
    )
    p.add_argument("--root", help="with --broker: the agents folder it serves, as this process sees it")
    p.add_argument("--node", help="with --broker tls://tasks.SERVICE:PORT: this node's broker (default: the first)")
