"""`wakeloop serve`, `broker`, `pause|resume|run-now` and the one switch `stop|start`: the
processes that run the fleet, and what a person asks of them.

Not here: the scheduler (fleet/), the broker (broker/), the switch's file (records/stopswitch.py).
"""

from __future__ import annotations

import os

from orchestrator.cli.declare import command
from orchestrator.errors import EXIT_OK, ConfigError
from orchestrator.policy.agent import AgentError, load_agent


def cmd_serve(args) -> int:
    from functools import partial

    from orchestrator import tracing
    from orchestrator.console.listen import Options, attach, check
    from orchestrator.fleet.scheduler import serve

    options = Options(args.http, args.metrics, args.behind_tls, args.published_on_loopback, tuple(args.public_name))
    check(options)  # a mistyped address said at once, not after K is measured
    tracing.setup()
    return serve(args.root, args.max_concurrent, beside=partial(attach, options=options))


def cmd_broker(args) -> int:
    from pathlib import Path

    from orchestrator.broker.transport import serve
    from orchestrator.policy.agent import CEILING_ENV
    from orchestrator.policy.ceiling import load_ceiling

    if args.ceiling:  # the broker loads agents too: under the same notify rules as serve's (agent.py)
        os.environ.setdefault(CEILING_ENV, str(Path(args.ceiling).resolve()))
    if args.listen and not args.tls_dir:
        raise ConfigError("--listen tls://HOST:PORT needs --tls-dir DIR (make one with `wakeloop swarm certs DIR`)")
    if args.plain_container:
        from orchestrator.broker import plain_container

        if not args.listen:
            raise ConfigError("--plain-container is for a swarm task's broker: it needs --listen tls://HOST:PORT")
        return plain_container.run(args.root, args.listen, Path(args.tls_dir), args.ceiling)
    return serve(
        args.root,
        args.socket or args.listen,
        ceiling=load_ceiling(args.ceiling) if args.ceiling else None,
        tls_dir=Path(args.tls_dir) if args.tls_dir else None,
    )


def cmd_pause(args) -> int:
    from orchestrator.records.health import set_paused

    agent = load_agent(args.agent_dir)
    set_paused(agent.state_dir, args.command == "pause")
    print(
        f"{agent.name}: paused: serve runs none of its ticks until `wakeloop resume {args.agent_dir}`"
        if args.command == "pause"
        else f"{agent.name}: resumed: failures forgotten, ticks run again"
    )
    return EXIT_OK


def cmd_run_now(args) -> int:
    from orchestrator.fleet.control import request_run, scheduler_note

    agent = load_agent(args.agent_dir)
    request_run(agent.state_dir)
    note = scheduler_note(agent.dir.parent)
    print(
        f"{agent.name}: one wake requested; "
        + (f"it runs when serve starts ({note})" if note else "the running serve starts it within seconds")
    )
    return EXIT_OK


def cmd_stop(args) -> int:
    from orchestrator.fleet.control import scheduler_note
    from orchestrator.records import stopswitch

    root = _fleet_root(args.root)
    halted = stopswitch.stop(root, why=args.reason or "")
    note = scheduler_note(root)
    print(f"STOPPED: {halted.describe()}")
    print(
        "nothing starts now: no wake, no sandbox call (the broker refuses too); calls in flight are killed "
        f"within {stopswitch.POLL_S:g}s and running wakes end at their next step with a `stopped` receipt"
        + (f" ({note})" if note else "")
    )
    return EXIT_OK


def cmd_start(args) -> int:
    from orchestrator.records import stopswitch

    root = _fleet_root(args.root)
    was = stopswitch.start(root)
    print(
        f"started: the fleet under {root} runs again (it was stopped since {was.at} by {was.who})"
        if was
        else f"{root} was not stopped: nothing to do"
    )
    return EXIT_OK


def _fleet_root(path: str):
    from pathlib import Path

    root = Path(path)
    if not root.is_dir():
        raise AgentError(f"{path} is not a folder; give ROOT, the folder that holds your agents")
    if (root / "agent.yaml").is_file():
        raise AgentError(
            f"{path} is an agent; the switch is for the whole fleet: give its ROOT "
            f"({root.resolve().parent}), or `wakeloop pause {path}` for this agent alone"
        )
    return root


def add_serve(commands) -> None:
    """`wakeloop serve ROOT [--http HOST:PORT]`."""
    p = command(
        commands,
        "serve",
        "wake every agent under ROOT on its schedule until SIGTERM; optionally a web console and Prometheus metrics",
        "wakeloop serve agents/ --http 127.0.0.1:8765   # then open http://127.0.0.1:8765/",
        cmd_serve,
    )
    p.add_argument("root")
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        metavar="K",
        help="wakes at once (default: fitted to the host's cores, memory and engine, said at start)",
    )
    p.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve the web console (and /metrics) here, e.g. 127.0.0.1:8765. Reading and acting "
        "need the token (WAKELOOP_CONSOLE_TOKEN, or one generated and kept in ROOT/console.token; "
        "serve prints a sign-in URL); /metrics is open on loopback; off loopback actions need "
        "TLS in front (--behind-tls)",
    )
    p.add_argument(
        "--metrics", metavar="HOST:PORT", help="serve Prometheus metrics alone at http://HOST:PORT/metrics (no console)"
    )
    p.add_argument(
        "--behind-tls",
        action="store_true",
        help="a TLS-terminating proxy is in front of --http: allow actions on a non-loopback address",
    )
    p.add_argument(
        "--published-on-loopback",
        action="store_true",
        help="--http listens in a container whose port the host publishes on 127.0.0.1 only "
        "(compose.override.yaml): treat it as loopback",
    )
    p.add_argument(
        "--public-name",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="a Host name the console answers besides its own address (a proxy's name; "
        "repeatable); any other Host gets 421. The first one is the sign-in URL's",
    )


def add_broker(commands) -> None:
    """`wakeloop broker ROOT --socket PATH|--listen tls://HOST:PORT`."""
    p = command(
        commands,
        "broker",
        "the sandbox broker: run/write for the agents under ROOT over a "
        "unix socket (the only process that needs Docker)",
        "wakeloop broker agents/ --socket /run/wakeloop/broker.sock --ceiling policies/ceiling.yaml",
        cmd_broker,
    )
    p.add_argument("root")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", metavar="PATH", help="the unix socket to listen on (one host)")
    where.add_argument(
        "--listen",
        metavar="tls://HOST:PORT",
        help="listen on TCP with mutual TLS (more than one host): only a client with the "
        "stack's orchestrator certificate is answered; needs --tls-dir",
    )
    p.add_argument(
        "--tls-dir",
        metavar="DIR",
        help="with --listen: the folder with wakeloop-ca.pem and wakeloop-broker.pem/.key (`wakeloop swarm certs`)",
    )
    p.add_argument(
        "--ceiling",
        metavar="FILE",
        help="the most any agent's policy may ask for (runtimes, images, networks, max "
        "sizes); requests over it are refused. Keep it where the orchestrator cannot "
        "write (compose: policies/ceiling.yaml)",
    )
    p.add_argument(
        "--plain-container",
        action="store_true",
        help="with --listen, in a swarm task: run the broker as a plain container of this node's "
        "engine, in this task's network, with the loop devices a workspace disk needs (a swarm "
        "service cannot be given devices); this process stays as its parent",
    )


def add_control(commands) -> None:
    """`wakeloop pause|resume|run-now AGENT_DIR`: asked of a running serve."""
    for name, summary in (
        ("pause", "stop serve from waking this agent (a running serve sees it at the next tick)"),
        ("resume", "let serve wake this agent again; forgets its failures"),
    ):
        p = command(commands, name, summary, f"wakeloop {name} agents/mine", cmd_pause)
        p.add_argument("agent_dir")
    p = command(
        commands,
        "run-now",
        "ask serve (running, or the next one started) for one wake of this agent now",
        "wakeloop run-now agents/mine",
        cmd_run_now,
    )
    p.add_argument("agent_dir")


def add_switch(commands) -> None:
    """`wakeloop stop ROOT` and `wakeloop start ROOT`: the one switch."""
    p = command(
        commands,
        "stop",
        "the one switch: nothing under ROOT starts (no wake, no sandbox call; the "
        "broker refuses too), running calls are killed and running wakes end "
        "`stopped`; holds across restarts until `wakeloop start ROOT`",
        "wakeloop stop agents/ --reason 'an agent is misbehaving'",
        cmd_stop,
    )
    p.add_argument("root", metavar="ROOT")
    p.add_argument("--reason", metavar="TEXT", help="why, kept in ROOT/STOP and shown by status and the console")
    p = command(
        commands,
        "start",
        "undo `wakeloop stop ROOT`: remove ROOT/STOP; serve's next ticks run",
        "wakeloop start agents/",
        cmd_start,
    )
    p.add_argument("root", metavar="ROOT")
