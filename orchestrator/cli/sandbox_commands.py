"""`wakeloop sandbox exec` and `wakeloop image build`: the sandbox used directly.

Not here: the sandbox (sandbox/), the disks (disk_commands.py), the escape suite (escape_commands.py).
"""

from __future__ import annotations

import argparse
import sys

from orchestrator.cli.declare import command, group
from orchestrator.errors import EXIT_OK
from orchestrator.policy.agent import AgentError, load_agent
from orchestrator.sandbox.containers.engine_client import connect


def cmd_sandbox_exec(args) -> int:
    words = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    command = " ".join(words).strip()
    if not command:
        raise AgentError("nothing to run: give a command after --, e.g. `wakeloop sandbox exec DIR -- ls -la`")
    agent = load_agent(args.agent_dir)
    from orchestrator.wake.one_call import run_outside_a_wake

    # The broker under compose, as the bash tool; in a wake of its own when no wake runs.
    result = run_outside_a_wake(agent, command, say=lambda line: print(line, file=sys.stderr))
    print(result.for_model())
    return result.exit_code


def cmd_image_build(args) -> int:
    from orchestrator.sandbox.containers.images import build_sandbox_image

    client = connect()
    print("building the sandbox image from sandbox-image/ ...", flush=True)
    tag = build_sandbox_image(client, echo=lambda line: print(line, flush=True))
    print(f"built {tag} (also tagged wakeloop-sandbox:latest)")
    return EXIT_OK


def add_sandbox(commands) -> None:
    """`wakeloop sandbox exec AGENT_DIR -- CMD`."""
    sandbox = group(
        commands, "sandbox", "use the sandbox directly", "wakeloop sandbox exec agents/mine -- 'id; ls -la'"
    )
    p = command(
        sandbox,
        "exec",
        "run CMD exactly as the bash tool would (through the broker under "
        "compose); exit with its status (124 on timeout)",
        "wakeloop sandbox exec agents/mine -- 'df -h /workspace'",
        cmd_sandbox_exec,
    )
    p.add_argument("agent_dir")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="a shell string")


def add_image(commands) -> None:
    """`wakeloop image build`."""
    image = group(commands, "image", "the sandbox image", "wakeloop image build")
    command(
        image, "build", "build wakeloop-sandbox:latest from sandbox-image/", "wakeloop image build", cmd_image_build
    )
