"""`wakeloop policy check|explain`: a policy file checked, an agent's policy explained.

Not here: reading a policy (policy/), what it does to the box (sandbox/explain.py).
"""

from __future__ import annotations

from orchestrator.cli.declare import command, group, json_flag, print_json
from orchestrator.errors import EXIT_OK
from orchestrator.policy.agent import load_agent
from orchestrator.sandbox.containers.engine_client import connect
from orchestrator.sandbox.engine import DockerSandbox


def cmd_policy_check(args) -> int:
    from orchestrator.policy.ceiling import is_ceiling, load_ceiling
    from orchestrator.policy.load import load_policy

    ceiling = is_ceiling(args.file)
    (load_ceiling if ceiling else load_policy)(args.file)  # a PolicyError is the one-line reason, exit 2
    print(f"ok: {args.file}{' (a broker ceiling)' if ceiling else ''}")
    return EXIT_OK


def cmd_policy_explain(args) -> int:
    from orchestrator.sandbox.explain import explain, explain_data
    from orchestrator.sandbox.policy_check import check_against_engine
    from orchestrator.wake.tools import build_registry

    agent = load_agent(args.agent_dir)
    client = connect()
    check_against_engine(agent.policy, client)
    box = DockerSandbox(
        agent.workspace, agent.policy.sandbox, agent=agent.name, client=client, warm=0, attach=False
    )  # explains the disk, does not make it
    registry = build_registry(agent.policy, box, outbox=lambda text: None)
    if args.json:
        print_json(explain_data(agent.policy, box, registry))
    else:
        print(explain(agent.policy, box, registry), end="")
    return EXIT_OK


def add_policy(commands) -> None:
    """`wakeloop policy check FILE` and `wakeloop policy explain AGENT_DIR`."""
    policy = group(commands, "policy", "check or explain a policy", "wakeloop policy check policies/default.yaml")
    p = command(
        policy,
        "check",
        "validate a policy file (or the broker's ceiling file); exit 0, or 2 with the reason",
        "wakeloop policy check my-policy.yaml",
        cmd_policy_check,
    )
    p.add_argument("file")
    p = command(
        policy,
        "explain",
        "the tools offered and each call's container, as docker run flags",
        "wakeloop policy explain agents/mine",
        cmd_policy_explain,
    )
    p.add_argument("agent_dir")
    json_flag(p)
