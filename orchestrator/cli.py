"""`wakeloop`: the command line (the commands: docs/cli.md; the exit codes: docs/architecture.md §4).

Each command is a small function that takes parsed arguments and returns an
exit code. Expected failures are one line on stderr, never a traceback, with
the exit code their error class carries (errors.py): 2 bad usage or
configuration, 3 the environment (no engine, no broker, no permission).
A failed piece of work (a dead letter, a blocked wake, an escape) is exit 1.
Every command that reads takes --json; `wake` prints progress on stderr and
only its receipt on stdout.

Not here: what any command does (each calls into its package), how records
are rendered (views/status.py).
"""

from __future__ import annotations

import argparse
import os
import sys

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator import __version__
from orchestrator.errors import EXIT_ENVIRONMENT, EXIT_FAILED, EXIT_OK, EXIT_USAGE, ConfigError, WakeloopError
from orchestrator.policy.agent import AgentError, init_agent, load_agent
from orchestrator.records.receipt import FAILED
from orchestrator.records.shown import json_shown
from orchestrator.sandbox.engine import DockerSandbox
from orchestrator.sandbox.containers.engine_client import connect


def _print_json(data) -> None:
    print(json_shown(data))  # exact when parsed; on a terminal no bidi or zero-width character hides


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


def cmd_wake(args) -> int:
    from orchestrator import tracing

    tracing.setup()
    import signal
    import threading
    from pathlib import Path
    from orchestrator.wake.loop import wake

    agent = load_agent(args.agent_dir)
    live = True if args.live else False if args.dry_run else None
    stop = threading.Event()  # SIGTERM ends the wake at the next step boundary, cleanly

    def stopping():
        stop.set()
        print("wakeloop: SIGTERM: the wake ends at its next step boundary", file=sys.stderr, flush=True)

    # From a thread: Event.set takes a lock the interrupted code may be holding.
    previous = signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=stopping).start())
    try:
        receipt = wake(
            agent,
            live=live,
            stop=stop,
            script=Path(args.script) if args.script else None,
            echo=lambda line: print(line, file=sys.stderr, flush=True),
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(receipt.to_json(), flush=True)  # always the last line: scripts parse it
    _send_notifications(agent)
    return EXIT_FAILED if receipt.status in FAILED else EXIT_OK


def _send_notifications(agent) -> None:
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


def cmd_context(args) -> int:
    """What the next wake sends (context.next_wake): dry or live as `wake` would decide, or as asked."""
    from datetime import datetime, timezone
    from orchestrator.wake.context import next_wake
    from orchestrator.records.state import load_state

    agent = load_agent(args.agent_dir)
    live = True if args.live else False if args.dry_run else not agent.dry_run
    state, warning = load_state(agent.state_dir)
    if warning:
        print(warning, file=sys.stderr)
    from orchestrator.broker.client import broker_socket, open_files
    from orchestrator.sandbox.box import SandboxError

    box = None
    if agent.policy.sandbox.disk and not broker_socket() and _has_disk(agent):
        # The memory is on the agent's disk: attached for this reading, released after.
        try:
            box = DockerSandbox(
                agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0, folder=agent.dir.resolve()
            )
        except SandboxError as exc:
            print(f"wakeloop: the workspace is read from the folder, not the agent's disk ({exc})", file=sys.stderr)
    try:
        files = box.files() if box else open_files(agent)
        upcoming = next_wake(agent, live=live, wake=state.wake + 1, now=datetime.now(timezone.utc), files=files)
    finally:
        if box:
            box.close()
    if args.json:
        _print_json(upcoming.to_json(agent.name))
        return EXIT_OK
    print(upcoming.render(), end="")
    return EXIT_OK


def _has_disk(agent) -> bool:
    """The agent folder has a disk here (else its workspace/ is what its first wake copies)."""
    from orchestrator.sandbox.disks import disk, disk_index

    key = disk_index.lookup(agent.dir.resolve())
    return bool(key and disk.path_of(key, "img").exists())


def cmd_disk_list(args) -> int:
    from pathlib import Path
    from orchestrator.views.status import disk_record, render_disks
    from orchestrator.sandbox.disks import disk, disk_survey

    root = Path(args.root) if args.root else None
    if root and not root.is_dir():
        raise AgentError(f"{root} is not a folder; give the folder that holds the agents")
    try:
        records = disk_survey.survey(root)
    except PermissionError:
        raise disk.DiskError(
            f"cannot read {disk.disks_dir()} (the disks' folder is root's): run `sudo wakeloop disk list`"
        ) from None
    if args.json:
        _print_json([disk_record(r) for r in records])
    else:
        print(render_disks(records, disk.disks_dir(), disk_survey.filesystem() if records else None), end="")
    return EXIT_OK


def _disk_of(agent_dir: str):
    """(the agent folder, its disk's key) for `disk release|rm`, or one line saying why not."""
    from pathlib import Path
    from orchestrator.sandbox.disks import disk, disk_index

    folder = Path(agent_dir).resolve()
    if not folder.is_dir():
        raise AgentError(f"{agent_dir} is not a folder; give an agent's folder, e.g. agents/mine")
    key = disk_index.lookup(folder)
    if key is None or not disk.path_of(key, "img").exists():
        raise disk.DiskError(
            f"{agent_dir} has no disk in {disk.disks_dir()} (`wakeloop disk list` shows every disk and its folder)"
        )
    return folder, key


def cmd_disk_release(args) -> int:
    from orchestrator.sandbox.disks import disk, disk_attach

    _need_root(disk)  # first: without root the index cannot be read, and no disk would be found
    folder, key = _disk_of(args.agent_dir)
    if not disk_attach.release(connect(), key):
        raise disk.DiskError(
            f"the disk of {args.agent_dir} is in use (a wake, a `sandbox exec` or the "
            "broker holds it); it is released when that ends"
        )
    print(f"released the disk of {folder}: unmounted and detached; the image {disk.path_of(key, 'img')} is kept")
    return EXIT_OK


@contextmanager
def _no_wake(shown: str, state_dir: Path, error: type[Exception], then: str) -> Iterator[None]:
    """Hold the agent's wake lock for a command that must not run beside one of its wakes
    (`disk rm`, `undo`, `move`): `error`, in one line, if a wake runs or the lock cannot be taken."""
    from orchestrator.records.state import WakeLock

    lock = WakeLock(state_dir)
    try:
        holder = lock.acquire()
    except OSError as exc:  # state/ missing, or its wake.lock a link: not a wake we can rule out
        raise error(f"cannot take the wake lock of {shown} ({exc.strerror}); `wakeloop status` says why") from None
    if holder is not None:
        raise error(f"{shown} is waking ({holder.describe()}); {then}")
    try:
        yield
    finally:
        lock.release()


def cmd_disk_rm(args) -> int:
    from orchestrator.sandbox.disks import disk, disk_attach

    _need_root(disk)  # first: without root the index cannot be read, and no disk would be found
    folder, key = _disk_of(args.agent_dir)
    image = disk.path_of(key, "img")
    if not args.yes:
        raise AgentError(
            f"this deletes {image}, the workspace's files of {folder}, for good; "
            f"add --yes: `wakeloop disk rm {args.agent_dir} --yes`"
        )
    # held while we delete: no wake starts on a disk going away
    with _no_wake(args.agent_dir, folder / "state", disk.DiskError, "try again when the wake ends"):
        if not disk_attach.release(connect(), key, delete=True):
            raise disk.DiskError(
                f"the disk of {args.agent_dir} is in use (a `sandbox exec` or the broker "
                "holds it); try again when that ends"
            )
    print(f"deleted the disk of {folder} ({image}); its next wake makes a new one from workspace/")
    return EXIT_OK


def _need_root(disk) -> None:
    if os.geteuid() != 0:
        raise disk.DiskError("releasing or deleting a disk needs root (umount, losetup): run it with sudo")


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
    from orchestrator.sandbox.containers.output import clean
    from orchestrator.records.state import mark_outbox_read, read_outbox, split_messages

    agent = load_agent(args.agent_dir)
    text = read_outbox(agent.state_dir)
    if args.json:
        _print_json({"agent": agent.name, "messages": split_messages(text)})
    else:
        print(clean(text).rstrip() if text.strip() else f"(no messages from {agent.name} yet)")
    mark_outbox_read(agent.state_dir)  # `status ROOT` counts what came after this as unread
    return EXIT_OK


def cmd_status(args) -> int:
    from pathlib import Path
    from orchestrator.fleet.schedule import agent_dirs
    from orchestrator.views.status import agent_status, fleet_status, render_agent_status, render_fleet

    root = Path(args.path)
    if not (root / "agent.yaml").is_file():  # a folder with agent.yaml is an agent; else a root
        if not agent_dirs(root):
            raise AgentError(
                f"{args.path}: no agent.yaml here or in its subdirectories; create one with `wakeloop init {args.path}`"
            )
        rows = fleet_status(root)
        _print_json(rows) if args.json else print(render_fleet(rows, root))
        return EXIT_OK
    data = agent_status(load_agent(root))
    _print_json(data) if args.json else print(render_agent_status(data))
    return EXIT_OK


def cmd_models(args) -> int:
    from orchestrator.views.model_table import list_live, model_rows, render_models

    live = None
    if args.live:
        key = os.environ.get("ANTHROPIC_API_KEY", "").strip()
        if not key:
            raise AgentError("models --live: ANTHROPIC_API_KEY is not set; export it, or leave out --live")
        try:
            live = list_live(key)
        except Exception as exc:  # the SDK's errors: one line, exit 1 (the work failed)
            print(f"models --live: GET /v1/models failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
            return EXIT_FAILED
    rows = model_rows(live)
    _print_json(rows) if args.json else print(render_models(rows))
    return EXIT_OK


def cmd_task_add(args) -> int:
    from orchestrator.records.tasks import add_task

    agent = load_agent(args.agent_dir)
    task = add_task(agent.state_dir, args.title)
    print(f"queued {task.id} for {agent.name}: {task.title}")
    return EXIT_OK


def cmd_task_cancel(args) -> int:
    from orchestrator.records.tasks import cancel

    agent = load_agent(args.agent_dir)
    task = cancel(agent.state_dir, args.id, args.note or "")
    print(f"cancelled {task.id} of {agent.name}: no wake takes it; `wakeloop task rm` removes it from the list")
    return EXIT_OK


def cmd_task_rm(args) -> int:
    from orchestrator.records.tasks import remove

    agent = load_agent(args.agent_dir)
    task = remove(agent.state_dir, args.id)
    print(f"removed {task.id} ({task.status}) from the tasks of {agent.name}: {task.title}")
    return EXIT_OK


def cmd_task_list(args) -> int:
    from orchestrator.sandbox.containers.output import clean
    from orchestrator.records.tasks import load_tasks

    agent = load_agent(args.agent_dir)
    tasks = load_tasks(agent.state_dir)
    if args.json:
        from dataclasses import asdict

        _print_json([asdict(t) for t in tasks])
        return EXIT_OK
    for t in tasks:
        closed = f" ({t.finished_at}: {clean(t.note)})" if t.finished_at else ""
        print(f"{t.id:<5} {t.status:<8} {t.title}{closed}")
    if not tasks:
        print(f"(no tasks for {agent.name}; add one with `wakeloop task add {args.agent_dir} TITLE`)")
    return EXIT_OK


def cmd_approvals(args) -> int:
    from pathlib import Path
    from orchestrator.views import fleet_approvals as view

    root = Path(args.root)
    if not root.is_dir():
        raise AgentError(f"{args.root}: no such folder; give ROOT (the folder of your agents) or an agent folder")
    found = view.rows(root)
    _print_json(found) if args.json else print(view.render(found, root))
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


def _approval_commands(sub) -> None:
    p = _command(
        sub,
        "approvals",
        "the tool calls that wait for a person (the policy's approve: rules), under ROOT or of one agent",
        "wakeloop approvals agents/ --json",
        cmd_approvals,
    )
    p.add_argument("root", nargs="?", default=".", metavar="ROOT|AGENT_DIR")
    _json_flag(p, "every open approval whole (the exact call, the model's words) as a JSON list")
    p = _command(
        sub,
        "approve",
        "approve a waiting call: it runs, exactly as asked, at the start of the agent's next wake",
        "wakeloop approve agents/mine a-3f2a9c1b",
        cmd_decide,
    )
    p.add_argument("agent_dir")
    p.add_argument("id")
    p.add_argument("--now", action="store_true", help="and ask serve for that wake now (as run-now does)")
    p = _command(
        sub,
        "deny",
        "deny a waiting call: the agent is told at its next wake, with the reason",
        "wakeloop deny agents/mine a-3f2a9c1b --reason 'not on a Friday'",
        cmd_decide,
    )
    p.add_argument("agent_dir")
    p.add_argument("id")
    p.add_argument("--reason", default="", help="told to the agent")


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
    from orchestrator.broker.transport import serve
    from pathlib import Path
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


def cmd_log(args) -> int:
    """The retained history, oldest first, across rotated segments; streamed."""
    from pathlib import Path
    from orchestrator.records.events import raw_history, read_history
    from orchestrator.views.status import format_event
    from orchestrator.views import logview

    if args.egress:  # one agent's record: a ROOT is refused by load_agent, in one line
        return _egress_log(args.agent_dir, args.run, args.json)
    if not (Path(args.agent_dir) / "agent.yaml").exists():
        from orchestrator.fleet.schedule import agent_dirs

        if agent_dirs(Path(args.agent_dir)):  # ROOT: follow every agent's events
            logview.follow_root(Path(args.agent_dir), lambda line: print(line, flush=True))
            return EXIT_OK
    if args.run is not None or args.follow:
        return _transcript(args.agent_dir, args.run, args.follow, args.json, args.system)
    agent = load_agent(args.agent_dir)
    if args.json:
        sys.stdout.writelines(raw_history(agent.state_dir))
        return EXIT_OK
    for event in read_history(agent.state_dir):
        print(format_event(event))
    return EXIT_OK


def _egress_log(agent_dir: str, run: str | None, as_json: bool) -> int:
    """Every egress decision retained (state/egress.jsonl), oldest first; --run: one wake's."""
    from orchestrator.records import egress
    from orchestrator.records.run_ids import resolve
    from orchestrator.records.transcript import find_run
    from orchestrator.views.egressview import format_decision

    agent = load_agent(agent_dir)
    if run is not None and run in ("", "last"):  # the newest wake, as for its transcript
        newest = find_run(agent.state_dir, run)
        run = newest.name.partition(".")[0] if newest else None
        if run is None:
            raise AgentError(f"{agent.name}: no wake yet; one is run by `wakeloop wake {agent_dir}`")
    elif run is not None:
        run = resolve(agent.state_dir, run, agent_dir, also=egress.runs(agent.state_dir))
    if as_json:
        lines = egress.raw_lines(agent.state_dir)
        sys.stdout.writelines(line for line in lines if run is None or egress.parse_line(line).run_id == run)
        return EXIT_OK
    shown = 0
    for line in egress.read(agent.state_dir, run):
        print(format_decision(line))
        shown += 1
    if not shown:
        print(
            f"(no egress decisions{' for run ' + repr(run) if run else ''}: a policy with "
            "`network: allowlist` records one per connection in state/egress.jsonl)"
        )
    return EXIT_OK


def cmd_transcript(args) -> int:
    if args.run and args.run_option and args.run != args.run_option:
        raise AgentError(f"transcript: two run ids ({args.run}, --run {args.run_option}); give one")
    return _transcript(args.agent_dir, args.run or args.run_option or "", args.follow, args.json, args.system)


def _transcript(agent_dir: str, run: str | None, follow: bool, as_json: bool, system: bool) -> int:
    from orchestrator.views import logview
    from orchestrator.records.run_ids import resolve
    from orchestrator.records.transcript import find_run, read_lines

    agent = load_agent(agent_dir)
    if run and run != "last":
        run = resolve(agent.state_dir, run, agent_dir)
    path = find_run(agent.state_dir, run)
    if path is None:
        raise AgentError(
            f"{agent.name}: no transcript "
            + (
                f"for run {run} (pruned, or never written; `wakeloop log {agent_dir}` lists runs)"
                if run and run != "last"
                else f"yet; one is written by every wake: `wakeloop wake {agent_dir}`"
            )
        )
    if follow:
        logview.follow_transcript(path, lambda line: print(line, flush=True))
        return EXIT_OK
    lines = list(read_lines(path))
    if as_json:
        for line in lines:
            print(json.dumps(line, ensure_ascii=False))
        return EXIT_OK
    for text in logview.render_transcript(lines, agent.state_dir, system=system):
        print(text)
    if not lines or lines[-1]["type"] != "end":
        print(f"(no end line: the wake is running, or was killed; `wakeloop log {agent_dir} -f` follows it)")
    return EXIT_OK


def cmd_diff(args) -> int:
    """One wake's changes, read from its undo folder on the agent's disk (the broker's, under compose)."""
    from orchestrator.broker.client import read_wake_diff
    from orchestrator.records.run_ids import resolve
    from orchestrator.views.diffview import render_text

    agent = load_agent(args.agent_dir)
    run = None if args.run is None else resolve(agent.state_dir, args.run, args.agent_dir)
    diff = read_wake_diff(agent, run)
    if args.json:
        _print_json(diff.change_set())
    else:
        sys.stdout.write(render_text(diff))
    return EXIT_OK


def cmd_move(args) -> int:
    """Place an agent on another node, holding its wake lock (no wake of it runs meanwhile)."""
    from orchestrator.broker import nodes, tls
    from orchestrator.broker.wire import BROKER_ENV

    agent = load_agent(args.agent_dir)
    address = os.environ.get(BROKER_ENV, "")
    if not address.startswith(tls.SCHEME):
        raise AgentError(f"move: agents have nodes only past one host, with {BROKER_ENV}={tls.SCHEME}HOST:PORT")
    with _no_wake(args.agent_dir, agent.state_dir, AgentError, "move it when the wake has ended"):
        try:
            left = nodes.move(agent.dir, address, args.to, agent.policy.sandbox.disk)
        except nodes.NodeUnavailable as exc:
            raise AgentError(f"move: {args.agent_dir}: {exc}") from None
    print(f"{agent.name}: {left or 'not placed'} -> {args.to}; its next wake's calls run there")
    return EXIT_OK


def cmd_undo(args) -> int:
    """Put back what one wake changed, holding the agent's wake lock (no wake runs meanwhile)."""
    from orchestrator.broker.client import undo_wake
    from orchestrator.records import event_types as ev
    from orchestrator.records.events import EVENTS_FILE, EventLog
    from orchestrator.records.run_ids import resolve
    from orchestrator.sandbox.wakes.undo_folders import UndoRefused

    agent = load_agent(args.agent_dir)
    run = resolve(agent.state_dir, args.run, args.agent_dir)
    with _no_wake(args.agent_dir, agent.state_dir, UndoRefused, "undo when the wake has ended"):
        undone = undo_wake(agent, run, args.force)
        EventLog(agent.state_dir / EVENTS_FILE, undone.run_id).write(
            ev.WorkspaceUndone(
                undone_run=undone.run_id, changes=undone.changes, paths=undone.paths, forced_over=undone.forced_over
            )
        )
    over = f", over later wake(s) {', '.join(undone.forced_over)}" if undone.forced_over else ""
    print(f"undid wake {undone.run_id}: {undone.changes} change(s) put back{over}")
    return EXIT_OK


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
        _print_json(explain_data(agent.policy, box, registry))
    else:
        print(explain(agent.policy, box, registry), end="")
    return EXIT_OK


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


def _command(
    sub, name: str, summary: str, example: str, func=None, more: str = "", **kwargs
) -> argparse.ArgumentParser:
    """A subcommand whose --help has a description and an example, then `more` (a file format,
    say), after a blank line: docgen renders both into docs/cli.md."""
    p = sub.add_parser(
        name,
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=f"example:\n  {example}" + (f"\n\n{more}" if more else ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kwargs,
    )
    if func:
        p.set_defaults(func=func)
    return p


def _group(sub, name: str, summary: str, example: str):
    """A command of subcommands (`wakeloop disk list|release|rm`): the subparsers to add them to."""
    return _command(sub, name, summary, example).add_subparsers(
        dest=f"{name}_command", metavar="SUBCOMMAND", required=True
    )


def _json_flag(p: argparse.ArgumentParser, what: str = "the same data as JSON") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what}, for scripts")


# wake --script FILE: the format wake/model.py's load_script reads and ScriptedModel plays
# (tests/test_docgen.py plays this example).
SCRIPT_FORMAT = """\
--script FILE: the dry run's model, scripted. A JSON list of turns (or
`{"turns": [...]}`), one per model call, in order; at most 1 MiB. Each turn
is an object with any of `"text"` (what the model says), `"tool_calls"` (a
list of `{"name": TOOL, "input": {...}}`: each runs for real, in the sandbox,
as the model's call would; the script does not read the result) and
`"stop_reason"` (default: `tool_use` when the turn calls a tool, else
`end_turn`, which ends the wake). `{wake}` and `{today}` in any string become
the wake's number and its UTC date (YYYY-MM-DD). After the last turn the
model says "(end of script)" and the wake ends. The file is checked before
the wake starts (a bad one is one line naming the turn); not with --live.

  [
    {"text": "Looking around.", "tool_calls": [{"name": "bash", "input": {"command": "ls -la"}}]},
    {"tool_calls": [{"name": "write_file",
                     "input": {"path": "notes/{today}.md", "content": "wake {wake}\\n"}}]},
    {"text": "Done for today."}
  ]

  wakeloop wake agents/mine --script script.json
"""

EPILOG = """\
exit codes: 0 ok (a wake stopped at a budget cap is ok, and says so); 1 the work
failed (dead letter, blocked, not committed, an escape); 2 bad usage or configuration; 3 the
environment (no engine, no broker, permission denied on the socket).

start here:
  wakeloop init agents/mine && wakeloop wake agents/mine    # a dry run: no API key needed
"""


def _swarm_commands(sub) -> None:
    swarm = _group(
        sub,
        "swarm",
        "past one host: the brokers reached over TCP with mutual TLS",
        "wakeloop swarm certs ./stack-certs",
    )
    p = _command(
        swarm,
        "certs",
        "make a CA for the stack and the broker's and the orchestrator's "
        "certificates in DIR (never over existing ones; needs openssl)",
        "wakeloop swarm certs ./stack-certs",
        cmd_swarm_certs,
    )
    p.add_argument("dir", metavar="DIR")


def _disk_commands(sub) -> None:
    disks = _group(sub, "disk", "the agents' workspace disks: list, release, delete", "wakeloop disk list agents/")
    p = _command(
        disks,
        "list",
        "every disk in $WAKELOOP_DISKS: its agent folder, size, bytes on the host, attached or not (reads only)",
        "wakeloop disk list agents/ --json",
        cmd_disk_list,
    )
    p.add_argument("root", nargs="?", metavar="ROOT", help="find each disk's folder among the agents here")
    _json_flag(p, "the disks as a JSON list")
    p = _command(
        disks,
        "release",
        "unmount and detach an agent's disk now (the image is kept; the next wake attaches it again)",
        "sudo wakeloop disk release agents/mine",
        cmd_disk_release,
    )
    p.add_argument("agent_dir")
    p = _command(
        disks,
        "rm",
        "delete an agent's disk, its workspace's files with it (refused while it wakes)",
        "sudo wakeloop disk rm agents/old --yes",
        cmd_disk_rm,
    )
    p.add_argument("agent_dir")
    p.add_argument("--yes", action="store_true", help="yes, delete the workspace's files for good")


def _transaction_commands(sub) -> None:
    p = _command(
        sub,
        "diff",
        "what one wake changed in the workspace, as a unified diff (binary files by size and sha256, links as links)",
        "wakeloop diff agents/mine --run 3f2a9c0b",
        cmd_diff,
    )
    p.add_argument("agent_dir")
    p.add_argument(
        "--run",
        metavar="ID",
        help="the wake's run id, or a unique prefix of 4+ hex digits (default: the last wake that committed changes)",
    )
    _json_flag(p, "the change set as JSON")
    p = _command(
        sub,
        "undo",
        "put back what one wake changed; refused while the agent wakes, or when a later wake "
        "changed the same paths, or an earlier one undone since did (unless --force)",
        "wakeloop undo agents/mine --run 3f2a9c0b",
        cmd_undo,
    )
    p.add_argument("agent_dir")
    p.add_argument(
        "--run",
        metavar="ID",
        required=True,
        help="the wake's run id, or a unique prefix of 4+ hex digits (`wakeloop log` shows the first 8)",
    )
    p.add_argument("--force", action="store_true", help="undo it even over other wakes that changed the same paths")
    p = _command(
        sub,
        "move",
        "place an agent on another node past one host ($WAKELOOP_BROKER=tls://...), its disk streamed there "
        "and checked by hash (the old one deleted once the new is in use); refused while it wakes",
        "wakeloop move /srv/agents/mine --to node-2",
        cmd_move,
    )
    p.add_argument("agent_dir")
    p.add_argument("--to", metavar="NODE", required=True, help="the node (its broker's $WAKELOOP_NODE) to run it on")


def _notify_commands(sub) -> None:
    notify = _group(sub, "notify", "notifications: test every channel", "wakeloop notify test agents/mine")
    p = _command(
        notify,
        "test",
        "send a test notification to every channel now; print what each answered",
        "wakeloop notify test agents/mine",
        cmd_notify_test,
    )
    p.add_argument("agent_dir")
    for name, summary in (
        ("pause", "stop serve from waking this agent (a running serve sees it at the next tick)"),
        ("resume", "let serve wake this agent again; forgets its failures"),
    ):
        p = _command(sub, name, summary, f"wakeloop {name} agents/mine", cmd_pause)
        p.add_argument("agent_dir")
    p = _command(
        sub,
        "run-now",
        "ask serve (running, or the next one started) for one wake of this agent now",
        "wakeloop run-now agents/mine",
        cmd_run_now,
    )
    p.add_argument("agent_dir")


def _switch_commands(sub) -> None:
    p = _command(
        sub,
        "stop",
        "the one switch: nothing under ROOT starts (no wake, no sandbox call; the "
        "broker refuses too), running calls are killed and running wakes end "
        "`stopped`; holds across restarts until `wakeloop start ROOT`",
        "wakeloop stop agents/ --reason 'an agent is misbehaving'",
        cmd_stop,
    )
    p.add_argument("root", metavar="ROOT")
    p.add_argument("--reason", metavar="TEXT", help="why, kept in ROOT/STOP and shown by status and the console")
    p = _command(
        sub,
        "start",
        "undo `wakeloop stop ROOT`: remove ROOT/STOP; serve's next ticks run",
        "wakeloop start agents/",
        cmd_start,
    )
    p.add_argument("root", metavar="ROOT")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wakeloop",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a Claude agent unattended on a schedule; every tool call runs "
        "in a fresh, hardened, disposable container.",
    )
    parser.add_argument("--version", action="version", version=f"wakeloop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = _command(
        sub,
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

    sandbox = _group(sub, "sandbox", "use the sandbox directly", "wakeloop sandbox exec agents/mine -- 'id; ls -la'")
    p = _command(
        sandbox,
        "exec",
        "run CMD exactly as the bash tool would (through the broker under "
        "compose); exit with its status (124 on timeout)",
        "wakeloop sandbox exec agents/mine -- 'df -h /workspace'",
        cmd_sandbox_exec,
    )
    p.add_argument("agent_dir")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="a shell string")

    p = _command(
        sub,
        "wake",
        "one wake; progress on stderr, its JSON receipt alone on stdout",
        "wakeloop wake agents/mine --live | jq .status",
        cmd_wake,
        more=SCRIPT_FORMAT,
    )
    p.add_argument("agent_dir")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--live", action="store_true", help="call the API (needs ANTHROPIC_API_KEY)")
    mode.add_argument(
        "--dry-run", action="store_true", help="no API call: a scripted model drives the real tools (the default)"
    )
    p.add_argument(
        "--script", metavar="FILE", help="a JSON dry-run script to use instead of the built-in one (its format: below)"
    )

    _disk_commands(sub)
    _swarm_commands(sub)

    p = _command(
        sub,
        "context",
        "print exactly the system prompt and first user message the next wake sends (its task and, if live, "
        "your queued messages), and whether it is a dry run or live; changes nothing",
        "wakeloop context agents/mine | less",
        cmd_context,
    )
    p.add_argument("agent_dir")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--live", action="store_true", help="as a live wake would send it (`wake --live`)")
    mode.add_argument("--dry-run", action="store_true", help="as a dry run would (`wake --dry-run`)")
    _json_flag(p)

    p = _command(
        sub,
        "send",
        "queue a message from you for the agent's next wake",
        "wakeloop send agents/mine 'look at the new data first'",
        cmd_send,
    )
    p.add_argument("agent_dir")
    p.add_argument("text")

    p = _command(
        sub,
        "outbox",
        "show the messages the agent sent you (and mark them read)",
        "wakeloop outbox agents/mine --json",
        cmd_outbox,
    )
    p.add_argument("agent_dir")
    _json_flag(p, "the messages as a JSON list")

    p = _command(
        sub,
        "models",
        "the models: price, context window, lifecycle, the effort and thinking each accepts",
        "wakeloop models --live   # the account's own list, from GET /v1/models",
        cmd_models,
    )
    p.add_argument("--live", action="store_true", help="ask GET /v1/models with ANTHROPIC_API_KEY")
    _json_flag(p, "every row whole, as JSON")

    p = _command(
        sub,
        "status",
        "wakes, tokens, cost, last receipt, lock holder; for ROOT, one table of every agent",
        "wakeloop status agents/   # or agents/mine",
        cmd_status,
    )
    p.add_argument("path", metavar="AGENT_DIR|ROOT")
    _json_flag(p, "every field whole, as JSON")

    task = _group(
        sub,
        "task",
        "the agent's task queue (one task claimed per wake)",
        "wakeloop task add agents/mine 'summarise the logs'",
    )
    p = _command(
        task,
        "add",
        "queue a task for the agent's next wakes",
        "wakeloop task add agents/mine 'summarise the logs'",
        cmd_task_add,
    )
    p.add_argument("agent_dir")
    p.add_argument("title")
    p = _command(task, "list", "every task with its status", "wakeloop task list agents/mine --json", cmd_task_list)
    p.add_argument("agent_dir")
    _json_flag(p, "the tasks as a JSON list")
    p = _command(
        task,
        "cancel",
        "cancel an open task (todo, or claimed by a wake): no wake takes it again; it stays listed, with your note",
        "wakeloop task cancel agents/mine t3 --note 'done by hand'",
        cmd_task_cancel,
    )
    p.add_argument("agent_dir")
    p.add_argument("id", help="the task's id (t1, t2, ...: `wakeloop task list` shows them)")
    p.add_argument("--note", metavar="TEXT", help="why, kept with the task")
    p = _command(
        task,
        "rm",
        "remove a task from the list, whatever its status (its id is not given again)",
        "wakeloop task rm agents/mine t3",
        cmd_task_rm,
    )
    p.add_argument("agent_dir")
    p.add_argument("id", help="the task's id (t1, t2, ...: `wakeloop task list` shows them)")

    p = _command(
        sub,
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

    p = _command(
        sub,
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

    p = _command(
        sub,
        "log",
        "the event log, readable; --run ID: one wake's transcript; -f: follow the "
        "running wake; ROOT: follow every agent's events",
        "wakeloop log agents/mine --run last   # or: wakeloop log agents/ (follows all)",
        cmd_log,
    )
    p.add_argument("agent_dir", metavar="AGENT_DIR|ROOT")
    p.add_argument(
        "--run",
        metavar="ID",
        help="show this wake's transcript (a run id or a unique prefix of 4+ hex digits; `last` or empty: the newest)",
    )
    p.add_argument("-f", "--follow", action="store_true", help="follow the newest wake's transcript until it ends")
    p.add_argument("--system", action="store_true", help="with a transcript: print the system prompt too")
    p.add_argument(
        "--egress",
        action="store_true",
        help="the egress proxy's decisions instead (state/egress.jsonl): one line per connection or "
        "request, allowed or denied, the rule that decided, bytes each way; with --run, one wake's",
    )
    _json_flag(p, "the raw JSONL lines")

    p = _command(
        sub,
        "transcript",
        "one wake's transcript: who spoke, what ran, exit codes, timings, cost",
        "wakeloop transcript agents/mine 3f2a   # the newest wake without an id",
        cmd_transcript,
    )
    p.add_argument("agent_dir")
    p.add_argument(
        "run", nargs="?", metavar="ID", help="a run id or a unique prefix of 4+ hex digits (default: the newest)"
    )
    p.add_argument("--run", dest="run_option", metavar="ID", help="the same, as `log --run` takes it")
    p.add_argument("-f", "--follow", action="store_true", help="follow it until the wake ends")
    p.add_argument("--system", action="store_true", help="print the system prompt too")
    _json_flag(p, "the raw JSONL lines")

    _transaction_commands(sub)
    _notify_commands(sub)
    _switch_commands(sub)
    _approval_commands(sub)

    policy = _group(sub, "policy", "check or explain a policy", "wakeloop policy check policies/default.yaml")
    p = _command(
        policy,
        "check",
        "validate a policy file (or the broker's ceiling file); exit 0, or 2 with the reason",
        "wakeloop policy check my-policy.yaml",
        cmd_policy_check,
    )
    p.add_argument("file")
    p = _command(
        policy,
        "explain",
        "the tools offered and each call's container, as docker run flags",
        "wakeloop policy explain agents/mine",
        cmd_policy_explain,
    )
    p.add_argument("agent_dir")
    _json_flag(p)

    image = _group(sub, "image", "the sandbox image", "wakeloop image build")
    _command(
        image, "build", "build wakeloop-sandbox:latest from sandbox-image/", "wakeloop image build", cmd_image_build
    )

    p = _command(
        sub,
        "escapes",
        "run the escape suite against the live engine under a policy; exit 1 if anything escaped",
        "wakeloop escapes --runtime runsc --policy policies/networked.yaml",
        cmd_escapes,
    )
    p.add_argument("agent_dir", nargs="?", help="use this agent's policy (probes run in a throwaway agent)")
    p.add_argument("--policy", help="use this policy file instead (default: the default policy)")
    p.add_argument("--runtime", help="override the policy's runtime, e.g. runsc")
    _json_flag(p, "one JSON report instead of the table (with --list: the probes)")
    p.add_argument("--probe", action="append", metavar="NAME", help="run only this probe (repeatable)")
    p.add_argument("--list", action="store_true", help="list the probes and exit")
    p.add_argument(
        "--broker",
        metavar="ADDRESS",
        help="run the box's probes through this broker (tls://HOST:PORT with $WAKELOOP_TLS_DIR, or a socket)",
    )
    p.add_argument("--root", help="with --broker: the agents folder it serves, as this process sees it")
    p.add_argument("--node", help="with --broker tls://tasks.SERVICE:PORT: this node's broker (default: the first)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):  # bare `wakeloop`, or `wakeloop task` alone
        parser.print_help()
        return EXIT_OK if args.command is None else EXIT_USAGE
    from orchestrator.sandbox.disks import disk, disk_attach

    held_before = disk.holding()  # an embedding process's own (tests): not this command's to let go
    try:
        return args.func(args)
    except WakeloopError as exc:
        print(f"wakeloop: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("wakeloop: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `wakeloop log DIR | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except PermissionError as exc:
        if not _in_disks_dir(exc.filename):
            raise
        # A path of root's $WAKELOOP_DISKS that a check before it did not foresee: still one line.
        print(f"wakeloop: {disk_attach.refusal(f'{exc.strerror}: {exc.filename}')}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    finally:
        _release_disks(held_before)
        _stop_network()


def _in_disks_dir(filename) -> bool:
    from orchestrator.sandbox.disks import disk

    return isinstance(filename, str) and Path(filename).is_relative_to(disk.disks_dir())


def _release_disks(held_before: frozenset) -> None:
    """Let go of every disk this command still holds (a wake, `sandbox exec`, `escapes`, any
    that attached), whatever ended it: released unless another process holds it."""
    from orchestrator.sandbox.disks import disk, disk_attach

    if not disk.holding() - held_before:
        return
    try:
        problems = disk_attach.let_go_all(connect(), kept=held_before)
    except Exception as exc:  # releasing must not mask the command's own result
        problems = [f"could not release the workspace disk(s): {exc}"]
    for line in problems:
        print(f"wakeloop: {line}; `wakeloop disk release AGENT_DIR` retries", file=sys.stderr)


def _stop_network() -> None:
    """Remove the allowlist proxies this process started (network.py); quiet if none."""
    from orchestrator.sandbox.egress import network

    if network.started():
        try:
            network.shutdown(connect())
        except Exception as exc:  # shutting down must not mask the command's own result
            print(f"wakeloop: could not remove the allowlist proxy: {exc}", file=sys.stderr)
