"""`wakeloop`: the command line (DESIGN.md §5).

Each command is a small function that takes parsed arguments and returns an
exit code. Expected failures (a bad agent.yaml, an unreachable engine) are
one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .agent import AgentError, init_agent, load_agent
from .policy import PolicyError
from .sandbox import DockerSandbox, SandboxError, connect

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def cmd_init(args) -> int:
    path = init_agent(args.agent_dir, policy=args.policy)
    print(f"created agent in {path}: edit mandate.md, then `wakeloop wake {args.agent_dir}`")
    return EXIT_OK


def cmd_sandbox_exec(args) -> int:
    words = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    command = " ".join(words).strip()
    if not command:
        raise AgentError("nothing to run: give a command after --, e.g. `wakeloop sandbox exec DIR -- ls -la`")
    agent = load_agent(args.agent_dir)
    box = DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name)
    if box.warning:
        print(box.warning, file=sys.stderr)
    bash = agent.policy.tools.bash
    result = box.run(command, timeout_s=bash.timeout_s, max_output_chars=bash.max_output_chars)
    print(result.for_model())
    return result.exit_code


def cmd_image_build(args) -> int:
    from .images import build_sandbox_image
    client = connect()
    print("building the sandbox image from sandbox-image/ ...", flush=True)
    tag = build_sandbox_image(client, echo=lambda line: print(line, flush=True))
    print(f"built {tag} (also tagged wakeloop-sandbox:latest)")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wakeloop",
        description="Run a Claude agent unattended on a schedule; every tool call runs "
                    "in a fresh, hardened, disposable container.")
    parser.add_argument("--version", action="version", version=f"wakeloop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("init", help="create agent.yaml, mandate.md, workspace/ and state/")
    p.add_argument("agent_dir")
    p.add_argument("--policy", help="policy file path for agent.yaml (relative to AGENT_DIR)")
    p.set_defaults(func=cmd_init)

    sandbox = sub.add_parser("sandbox", help="use the sandbox directly").add_subparsers(
        dest="sandbox_command", metavar="SUBCOMMAND", required=True)
    p = sandbox.add_parser("exec", help="run CMD exactly as the bash tool would; exit with its status "
                                        "(124 on timeout)")
    p.add_argument("agent_dir")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="a shell string")
    p.set_defaults(func=cmd_sandbox_exec)

    image = sub.add_parser("image", help="the sandbox image").add_subparsers(
        dest="image_command", metavar="SUBCOMMAND", required=True)
    p = image.add_parser("build", help="build wakeloop-sandbox:latest from sandbox-image/")
    p.set_defaults(func=cmd_image_build)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (AgentError, PolicyError, SandboxError) as exc:
        print(f"wakeloop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("wakeloop: interrupted", file=sys.stderr)
        return 130
