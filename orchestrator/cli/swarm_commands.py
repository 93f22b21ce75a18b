"""`wakeloop swarm certs` and `wakeloop move`: past one host.

Not here: the certificates (broker/tls.py), the nodes and the move (broker/nodes.py).
"""

from __future__ import annotations

import os

from orchestrator.cli.declare import command, group
from orchestrator.cli.wake_lock import no_wake
from orchestrator.errors import EXIT_OK
from orchestrator.policy.agent import AgentError, load_agent


def cmd_swarm_certs(args) -> int:
    from pathlib import Path

    from orchestrator.broker import tls

    made = tls.make_certs(Path(args.dir))
    print(f"made a CA for this stack and the broker's and the orchestrator's certificates in {args.dir}:")
    for path in made:
        warning = "   (the CA key: keep it here, never give it to a service)" if path.name == tls.CA_KEY else ""
        print(f"  {path}{warning}")
    print(
        f"the broker gets {tls.CA}, {tls.BROKER_NAME}.pem/.key; the orchestrator {tls.CA}, "
        f"{tls.ORCHESTRATOR_NAME}.pem/.key, with WAKELOOP_BROKER=tls://HOST:PORT and {tls.TLS_DIR_ENV}=DIR"
    )
    return 0


def cmd_move(args) -> int:
    """Place an agent on another node, holding its wake lock (no wake of it runs meanwhile)."""
    from orchestrator.broker import nodes, tls
    from orchestrator.broker.wire import BROKER_ENV

    agent = load_agent(args.agent_dir)
    address = os.environ.get(BROKER_ENV, "")
    if not address.startswith(tls.SCHEME):
        raise AgentError(f"move: agents have nodes only past one host, with {BROKER_ENV}={tls.SCHEME}HOST:PORT")
    with no_wake(args.agent_dir, agent.state_dir, AgentError, "move it when the wake has ended"):
        try:
            left = nodes.move(agent.dir, address, args.to, agent.policy.sandbox.disk)
        except nodes.NodeUnavailable as exc:
            raise AgentError(f"move: {args.agent_dir}: {exc}") from None
    print(f"{agent.name}: {left or 'not placed'} -> {args.to}; its next wake's calls run there")
    return EXIT_OK


def add_swarm(commands) -> None:
    """`wakeloop swarm certs DIR`."""
    swarm = group(
        commands,
        "swarm",
        "past one host: the brokers reached over TCP with mutual TLS",
        "wakeloop swarm certs ./stack-certs",
    )
    p = command(
        swarm,
        "certs",
        "make a CA for the stack and the broker's and the orchestrator's "
        "certificates in DIR (never over existing ones; needs openssl)",
        "wakeloop swarm certs ./stack-certs",
        cmd_swarm_certs,
    )
    p.add_argument("dir", metavar="DIR")


def add_move(commands) -> None:
    """`wakeloop move AGENT_DIR --to NODE`."""
    p = command(
        commands,
        "move",
        "place an agent on another node past one host ($WAKELOOP_BROKER=tls://...), its disk streamed there "
        "and checked by hash (the old one deleted once the new is in use); refused while it wakes",
        "wakeloop move /srv/agents/mine --to node-2",
        cmd_move,
    )
    p.add_argument("agent_dir")
    p.add_argument("--to", metavar="NODE", required=True, help="the node (its broker's $WAKELOOP_NODE) to run it on")
