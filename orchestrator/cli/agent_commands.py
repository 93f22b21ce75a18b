"""`wakeloop init`, `send` and `outbox`: an agent's folder made, and the messages between you and it.

Not here: what a wake does with them (wake_commands.py), the agent's tasks (task_commands.py).
"""

from __future__ import annotations

from orchestrator.cli.declare import command, json_flag, print_json
from orchestrator.errors import EXIT_OK
from orchestrator.policy.agent import AgentError, init_agent, load_agent


def cmd_init(args) -> int:
    path = init_agent(args.agent_dir, policy=args.policy)
    print(f"created agent in {path}: edit mandate.md, then `wakeloop wake {args.agent_dir}`")
    return EXIT_OK


def cmd_send(args) -> int:
    from orchestrator.records.state import count_messages, peek_inbox, send_message_to_agent

    agent = load_agent(args.agent_dir)
    if not args.text.strip():
        raise AgentError("nothing to send: give the message text, e.g. `wakeloop send DIR 'hello'`")
    send_message_to_agent(agent.state_dir, args.text)
    waiting = count_messages(peek_inbox(agent.state_dir))
    print(f"queued for the next wake of {agent.name} ({waiting} message(s) waiting)")
    return EXIT_OK


def cmd_outbox(args) -> int:
    from orchestrator.records.state import mark_outbox_read, read_outbox, split_messages
    from orchestrator.sandbox.containers.output import clean

    agent = load_agent(args.agent_dir)
    text = read_outbox(agent.state_dir)
    if args.json:
        print_json({"agent": agent.name, "messages": split_messages(text)})
    else:
        print(clean(text).rstrip() if text.strip() else f"(no messages from {agent.name} yet)")
    mark_outbox_read(agent.state_dir)  # `status ROOT` counts what came after this as unread
    return EXIT_OK


def add_init(commands) -> None:
    """`wakeloop init AGENT_DIR`."""
    p = command(
        commands,
        "init",
        "create agent.yaml, mandate.md, workspace/ and state/",
        "wakeloop init agents/mine --policy ../../policies/strict.yaml",
        cmd_init,
    )
    p.add_argument("agent_dir")
    p.add_argument(
        "--policy",
        help="policy file path for agent.yaml (relative to AGENT_DIR), or the "
        "name of a shipped policy (default, strict, networked); read now, so one "
        "that is neither fails here and creates nothing",
    )


def add_messages(commands) -> None:
    """`wakeloop send AGENT_DIR TEXT` and `wakeloop outbox AGENT_DIR`."""
    p = command(
        commands,
        "send",
        "queue a message from you for the agent's next wake",
        "wakeloop send agents/mine 'look at the new data first'",
        cmd_send,
    )
    p.add_argument("agent_dir")
    p.add_argument("text")

    p = command(
        commands,
        "outbox",
        "show the messages the agent sent you (and mark them read)",
        "wakeloop outbox agents/mine --json",
        cmd_outbox,
    )
    p.add_argument("agent_dir")
    json_flag(p, "the messages as a JSON list")
