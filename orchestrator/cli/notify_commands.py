"""`wakeloop notify test`, and the sender's pass after a standalone wake.

Not here: channels, the queue and the sender (notify/).
"""

from __future__ import annotations

import os
import sys

from orchestrator.cli.declare import command, group
from orchestrator.errors import EXIT_FAILED, EXIT_OK
from orchestrator.policy.agent import AgentError, load_agent


def send_notifications(agent) -> None:
    """After a standalone wake: one pass of the sender over this agent's queue (progress on stderr).
    What fails waits in state/notify/ for the next pass (the next wake, or serve)."""
    import time

    from orchestrator.notify.sender import send_due

    report = send_due(agent.state_dir, agent.notify, now=time.time())
    for line in report.sent:
        print(f"notified {line}", file=sys.stderr)
    for line in report.failed + report.gave_up:
        print(f"notification not delivered: {line}", file=sys.stderr)
    if report.waiting:
        print(
            f"{report.waiting} notification(s) wait in {agent.state_dir}/notify/queue for the next "
            "attempt (serve retries them)",
            file=sys.stderr,
        )


def cmd_notify_test(args) -> int:
    import uuid

    from orchestrator.notify.channels import DeliveryError, deliver
    from orchestrator.notify.outcomes import payload

    agent = load_agent(args.agent_dir)
    if not agent.notify:
        raise AgentError(
            f"{agent.name}: no notify channels in {agent.dir / 'agent.yaml'} or {agent.dir.parent / 'notify.yaml'}"
        )
    note = payload(
        agent.name,
        "test",
        f"test/{uuid.uuid4().hex[:12]}",
        f"{agent.name}: test notification",
        f"A test from `wakeloop notify test {args.agent_dir}`: this channel works.",
    )
    failed = 0
    for channel in agent.notify:
        try:
            print(f"{channel.label}: {deliver(channel, note, os.environ)}")
        except DeliveryError as exc:
            failed += 1
            print(f"{channel.label}: FAILED: {exc}")
    return EXIT_FAILED if failed else EXIT_OK


def add_notify(commands) -> None:
    """`wakeloop notify test AGENT_DIR`."""
    notify = group(commands, "notify", "notifications: test every channel", "wakeloop notify test agents/mine")
    p = command(
        notify,
        "test",
        "send a test notification to every channel now; print what each answered",
        "wakeloop notify test agents/mine",
        cmd_notify_test,
    )
    p.add_argument("agent_dir")
