"""`wakeloop`: the command line (DESIGN.md §5).

Each command is a small function that takes parsed arguments and returns an
exit code. Expected failures (a bad agent.yaml, an unreachable engine) are
one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .agent import AgentError, init_agent, load_agent
from .policy import PolicyError
from .ledger import LedgerError
from .sandbox import DockerSandbox, SandboxError, connect
from .tasks import TaskError

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
    from .policy import check_against_engine
    check_against_engine(agent.policy, connect())  # image, runtime: one line naming the policy's line
    box = DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0)  # one call: no pool
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


def cmd_wake(args) -> int:
    import signal
    import threading
    from pathlib import Path
    from .loop import wake
    agent = load_agent(args.agent_dir)
    live = True if args.live else False if args.dry_run else None
    stop = threading.Event()  # SIGTERM ends the wake at the next step boundary, cleanly

    def stopping():
        stop.set()
        print("wakeloop: SIGTERM: the wake ends at its next step boundary", file=sys.stderr, flush=True)

    # From a thread: Event.set takes a lock the interrupted code may be holding.
    previous = signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=stopping).start())
    try:
        receipt = wake(agent, live=live, stop=stop, script=Path(args.script) if args.script else None,
                       echo=lambda line: print(line, flush=True))
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(receipt.to_json(), flush=True)  # always the last line: scripts parse it
    return EXIT_FAILED if receipt.status in ("dead_letter", "blocked") else EXIT_OK


def cmd_context(args) -> int:
    from datetime import datetime, timezone
    from .context import build_context
    from .state import load_state, peek_inbox
    agent = load_agent(args.agent_dir)
    state, warning = load_state(agent.state_dir)
    if warning:
        print(warning, file=sys.stderr)
    ctx = build_context(agent, wake=state.wake + 1, now=datetime.now(timezone.utc),
                        inbox=peek_inbox(agent.state_dir))
    print(ctx.render(), end="")
    return EXIT_OK


def cmd_send(args) -> int:
    from .state import count_messages, peek_inbox, send_message_to_agent
    agent = load_agent(args.agent_dir)
    if not args.text.strip():
        raise AgentError("nothing to send: give the message text, e.g. `wakeloop send DIR 'hello'`")
    send_message_to_agent(agent.state_dir, args.text)
    waiting = count_messages(peek_inbox(agent.state_dir))
    print(f"queued for the next wake of {agent.name} ({waiting} message(s) waiting)")
    return EXIT_OK


def cmd_outbox(args) -> int:
    from .output import clean
    from .state import read_outbox
    agent = load_agent(args.agent_dir)
    text = read_outbox(agent.state_dir)
    print(clean(text).rstrip() if text.strip() else f"(no messages from {agent.name} yet)")
    from .scheduler import mark_outbox_read
    mark_outbox_read(agent.state_dir)  # `status ROOT` counts what came after this as unread
    return EXIT_OK


def cmd_status(args) -> int:
    from pathlib import Path
    from .state import status_report
    root = Path(args.path)
    if not (root / "agent.yaml").is_file():  # a folder with agent.yaml is an agent; else a root
        from .scheduler import agent_dirs, status_table
        if not agent_dirs(root):
            raise AgentError(f"{args.path}: no agent.yaml here or in its subdirectories; "
                             f"create one with `wakeloop init {args.path}`")
        print(status_table(root))
        return EXIT_OK
    print(status_report(load_agent(root)))
    return EXIT_OK


def cmd_task_add(args) -> int:
    from .tasks import add_task
    agent = load_agent(args.agent_dir)
    task = add_task(agent.state_dir, args.title)
    print(f"queued {task.id} for {agent.name}: {task.title}")
    return EXIT_OK


def cmd_task_list(args) -> int:
    from .output import clean
    from .tasks import load_tasks
    agent = load_agent(args.agent_dir)
    tasks = load_tasks(agent.state_dir)
    for t in tasks:
        closed = f" ({t.finished_at}: {clean(t.note)})" if t.finished_at else ""
        print(f"{t.id:<5} {t.status:<8} {t.title}{closed}")
    if not tasks:
        print(f"(no tasks for {agent.name}; add one with `wakeloop task add {args.agent_dir} TITLE`)")
    return EXIT_OK


def cmd_serve(args) -> int:
    from .scheduler import serve
    return serve(args.root, args.max_concurrent)


def cmd_broker(args) -> int:
    from .broker import serve
    from .ceiling import load_ceiling
    return serve(args.root, args.socket, ceiling=load_ceiling(args.ceiling) if args.ceiling else None)


def cmd_log(args) -> int:
    from .events import EVENTS_FILE, format_event, read_events
    agent = load_agent(args.agent_dir)
    path = agent.state_dir / EVENTS_FILE
    if args.json:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                sys.stdout.writelines(f)
        except FileNotFoundError:
            pass
        return EXIT_OK
    for event in read_events(path):
        print(format_event(event))
    return EXIT_OK


def cmd_policy_check(args) -> int:
    from .ceiling import is_ceiling, load_ceiling
    from .policy import load_policy
    ceiling = is_ceiling(args.file)
    (load_ceiling if ceiling else load_policy)(args.file)  # a PolicyError is the one-line reason, exit 2
    print(f"ok: {args.file}{' (a broker ceiling)' if ceiling else ''}")
    return EXIT_OK


def cmd_policy_explain(args) -> int:
    from .explain import explain
    from .policy import check_against_engine
    from .tools import build_registry
    agent = load_agent(args.agent_dir)
    client = connect()
    check_against_engine(agent.policy, client)
    box = DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, client=client, warm=0)
    registry = build_registry(agent.policy, box, outbox=lambda text: None)
    print(explain(agent.policy, box, registry), end="")
    return EXIT_OK


def cmd_escapes(args) -> int:
    from .escapes.command import list_probes, run
    if args.list:
        return list_probes()
    return run(args.agent_dir, args.policy, args.runtime, args.json, args.probe)


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

    p = sub.add_parser("wake", help="one wake; prints progress, then a JSON receipt as the last line")
    p.add_argument("agent_dir")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--live", action="store_true", help="call the API (needs ANTHROPIC_API_KEY)")
    mode.add_argument("--dry-run", action="store_true", help="no API call: a scripted model drives "
                                                              "the real tools (the default)")
    p.add_argument("--script", metavar="FILE", help="a JSON dry-run script to use instead of the built-in one")
    p.set_defaults(func=cmd_wake)

    p = sub.add_parser("context", help="print the system prompt and first user message the next wake "
                                       "would send; changes nothing")
    p.add_argument("agent_dir")
    p.set_defaults(func=cmd_context)

    p = sub.add_parser("send", help="queue a message from you for the agent's next wake")
    p.add_argument("agent_dir")
    p.add_argument("text")
    p.set_defaults(func=cmd_send)

    p = sub.add_parser("outbox", help="show the messages the agent sent you")
    p.add_argument("agent_dir")
    p.set_defaults(func=cmd_outbox)

    p = sub.add_parser("status", help="wakes, tokens, last receipt, lock holder")
    p.add_argument("path", metavar="AGENT_DIR|ROOT")
    p.set_defaults(func=cmd_status)

    task = sub.add_parser("task", help="the agent's task queue (one task claimed per wake)").add_subparsers(
        dest="task_command", metavar="SUBCOMMAND", required=True)
    p = task.add_parser("add", help="queue a task for the agent's next wakes")
    p.add_argument("agent_dir")
    p.add_argument("title")
    p.set_defaults(func=cmd_task_add)
    p = task.add_parser("list", help="every task with its status")
    p.add_argument("agent_dir")
    p.set_defaults(func=cmd_task_list)

    p = sub.add_parser("serve", help="wake every agent under ROOT on its schedule until SIGTERM")
    p.add_argument("root")
    p.add_argument("--max-concurrent", type=int, default=4, metavar="K", help="wakes at once (default 4)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("broker", help="the sandbox broker: run/write for the agents under ROOT over a "
                                      "unix socket (the only process that needs Docker)")
    p.add_argument("root")
    p.add_argument("--socket", required=True, metavar="PATH", help="the unix socket to listen on")
    p.add_argument("--ceiling", metavar="FILE",
                   help="the most any agent's policy may ask for (runtimes, images, networks, max "
                        "sizes); requests over it are refused. Keep it where the orchestrator cannot "
                        "write (compose: policies/ceiling.yaml)")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("log", help="the event log, readable (--json for the raw lines)")
    p.add_argument("agent_dir")
    p.add_argument("--json", action="store_true", help="print the raw JSONL lines")
    p.set_defaults(func=cmd_log)

    policy = sub.add_parser("policy", help="check or explain a policy").add_subparsers(
        dest="policy_command", metavar="SUBCOMMAND", required=True)
    p = policy.add_parser("check", help="validate a policy file (or the broker's ceiling file); "
                                       "exit 0, or 2 with the reason")
    p.add_argument("file")
    p.set_defaults(func=cmd_policy_check)
    p = policy.add_parser("explain", help="the tools offered and each call's container, "
                                          "as docker run flags")
    p.add_argument("agent_dir")
    p.set_defaults(func=cmd_policy_explain)

    image = sub.add_parser("image", help="the sandbox image").add_subparsers(
        dest="image_command", metavar="SUBCOMMAND", required=True)
    p = image.add_parser("build", help="build wakeloop-sandbox:latest from sandbox-image/")
    p.set_defaults(func=cmd_image_build)

    p = sub.add_parser("escapes", help="run the escape suite against the live engine under a policy; "
                                       "exit 1 if anything escaped")
    p.add_argument("agent_dir", nargs="?", help="use this agent's policy (probes run in a throwaway agent)")
    p.add_argument("--policy", help="use this policy file instead (default: the default policy)")
    p.add_argument("--runtime", help="override the policy's runtime, e.g. runsc")
    p.add_argument("--json", action="store_true", help="print one JSON report instead of the table")
    p.add_argument("--probe", action="append", metavar="NAME", help="run only this probe (repeatable)")
    p.add_argument("--list", action="store_true", help="list the probes and exit")
    p.set_defaults(func=cmd_escapes)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (AgentError, PolicyError, SandboxError, TaskError, LedgerError) as exc:
        print(f"wakeloop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("wakeloop: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `wakeloop log DIR | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        _stop_network()


def _stop_network() -> None:
    """Remove the allowlist proxies this process started (network.py); quiet if none."""
    from . import network
    if network.started():
        try:
            network.shutdown(connect())
        except Exception as exc:  # shutting down must not mask the command's own result
            print(f"wakeloop: could not remove the allowlist proxy: {exc}", file=sys.stderr)
