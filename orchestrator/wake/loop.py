"""One wake, in order: lock → retention → context → model → registry → sandbox → events → journal → state → receipt.

Beside the events, every step's words go to the wake's transcript
(records/transcript.py) as they happen, and news for a person (a dead
letter, a send_message, ...) is only queued (notify/outcomes.py): delivery
is the sender's, never the wake's.

The harness is dumb; the agent is smart. This module does the seed harness's
life cycle and nothing else: it holds the lock, assembles the context, calls
the model, runs the tools it asks for, enforces the caps, makes sure a trace
lands in today's journal, and writes a receipt. Every step is an event in
state/events.jsonl the moment it happens.

What each stop reason leads to, and the notes sent after one: stop_reasons.py.

Caps: `max_steps` (model requests per wake) ends the wake with `budget_stop`,
and so does `max_wake_s` (wall clock), at the first step boundary past it;
each tool call's timeout is cut to the time left, so a hung call cannot hold
the wake (a model request in flight keeps the SDK's own timeout).
The USD caps (the agent's per wake, day and month; all agents' together per
day and month, ROOT/budget.yaml) are checked before each model request
(ledger.py Meter): a wake that cannot afford its first is `blocked`, one that
cannot afford a later one ends `budget_stop`, its reason naming the cap
(`fleet.max_usd_per_month: ROOT/budget.yaml: ...`).
`max_tokens_per_wake` counts input + output + cache-read + cache-creation
tokens; when a response takes the total to the cap, the model gets exactly
one more request, with a note to call no more tools and to write its
journal entry as its reply (the wrap-up turn), then the wake ends with `budget_stop` and
the harness appends that reply to today's journal. "No tools" is said in that note, and
any tool_use in the reply is not run: `tools` and `tool_choice` stay as they
were, because the API refuses a request whose history holds tool_use blocks
but no `tools`, refuses a forced `tool_choice` on 5.x models, and (5.x) a
changed `tool_choice` invalidates the cached messages, so the whole
conversation would be written to the cache again at the write price.

The journal trace: a stub, or the closing note, when the agent wrote no journal entry
(journal_stub.py).

Receipt statuses: done | budget_stop | dead_letter | blocked | skipped_locked | stopped | skipped_node |
not_committed. A wake's changes are committed at its end (changes.py); when they are
not (the commit failed and was rolled back, its broker was lost), the wake ends `not_committed`,
a failure, whatever its conversation ended with (a dead letter stays one, and says so).
A `stop` event (a scheduler's SIGTERM) ends the wake at the next step
boundary with status done, reason "stopped". The fleet's switch (ROOT/STOP,
records/stopswitch.py) is looked at before the wake starts and at every
step boundary and tool call: present, the wake ends with status `stopped`
and the switch's who, when and why as its reason; the sandbox has killed
any call in flight (engine.py) and starts no other, so no journal stub is
written either (the receipt says so).

A call that waits for a person is answered WAITING (approval_gate.py); at the
start of the next wake, after the registry is built and before the first model
request, approved calls run and every decided approval is told.

Not here: the tools (tools.py) and one tool step (tool_step.py), what a stop reason leads to
(stop_reasons.py), the workspace's transaction (changes.py), the journal trace (journal_stub.py),
the HTTP and the dry-run script (model.py),
reading the workspace (sandbox/disks/workspace_reads.py), the lock and state files (state.py),
the transcript's format (records/transcript.py), notifications (notify/).
"""

from __future__ import annotations

import functools
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from orchestrator import tracing
from orchestrator.broker import nodes
from orchestrator.broker.client import broker_socket, open_sandbox
from orchestrator.notify import outcomes
from orchestrator.policy.agent import Agent, AgentError
from orchestrator.policy.fleetbudget import load_fleet_budget
from orchestrator.records import egress, ledger, retention, stopswitch, tasks
from orchestrator.records import event_types as ev
from orchestrator.records import state as st
from orchestrator.records import transcript as tr
from orchestrator.records.approvals import Approval
from orchestrator.records.events import EVENTS_FILE, EventLog, now_iso, scrub, secrets_from_env
from orchestrator.records.receipt import Receipt, Status
from orchestrator.sandbox.box import Sandbox, SandboxError
from orchestrator.wake import stop_reasons
from orchestrator.wake.approval_gate import Gate
from orchestrator.wake.changes import Transaction
from orchestrator.wake.context import approvals_section, build_context, journal_day
from orchestrator.wake.journal_stub import journal_trace
from orchestrator.wake.model import (
    CACHE,
    DRY_RUN_SCRIPT,
    Block,
    LiveModel,
    Message,
    Model,
    ModelError,
    ScriptedModel,
    ScriptTurn,
    Turn,
    load_script,
)
from orchestrator.wake.progress import Say, short
from orchestrator.wake.tally import Tally
from orchestrator.wake.task_tools import complete_task_tools
from orchestrator.wake.tool_step import ToolStep
from orchestrator.wake.tools import build_registry


class DeadLetter(Exception):
    """The wake cannot go on and a human should look: one line."""


def wake(
    agent: Agent,
    *,
    live: bool | None = None,
    sandbox: Sandbox | None = None,
    stop: threading.Event | None = None,
    script: Path | None = None,
    model: Model | None = None,
    echo: Callable[[str], None] | None = None,
) -> Receipt:
    """Run one wake of `agent`. Config problems raise AgentError/SandboxError
    before anything is touched; everything after the lock ends in a Receipt.
    `model` replaces the live/scripted choice (tests); `echo` gets progress lines."""
    say = echo or (lambda line: None)
    if live is None:  # a script is a dry run's script; otherwise agent.yaml (or its env override) says
        live = False if script is not None else not agent.dry_run
    turns, api_key, fleet = _check_config(agent, live, script, model)
    run_id = uuid.uuid4().hex[:12]
    agent.state_dir.mkdir(mode=0o700, exist_ok=True)
    events = EventLog(agent.state_dir / EVENTS_FILE, run_id)
    halted = stopswitch.read(agent.dir.parent)
    if halted is not None:
        return _not_started(agent, run_id, halted, events, say)
    lock = st.WakeLock(agent.state_dir)
    holder = lock.acquire()
    if holder is not None:
        return _skipped(agent, run_id, holder, events, say)
    ours = None  # a live model this wake made, and so closes
    try:
        if sandbox is None and (down := _node_down(agent, say)):
            return _unavailable(agent, run_id, down, events, say)
        if model is None and live:
            model = ours = LiveModel(agent.model, api_key, effort=agent.effort, thinking=agent.thinking)
        _retain(agent, events, say)
        run = _Wake(agent, run_id, events, lock, say, stop, fleet)
        try:
            return run.run(sandbox, model, turns)
        except SandboxError:
            # Its node went as the wake began (it answered a moment before): unavailable, not failing.
            if sandbox is not None or not (down := _node_down(agent, say)):
                raise
            return _unavailable(agent, run_id, f"{down} (it went as the wake began)", events, say)
        finally:
            run.let_go()
    finally:
        if ours is not None:
            ours.close()  # a wake leaves no connection open behind it
        lock.release()


def _retain(agent: Agent, events: EventLog, say: Say) -> None:
    """state/ kept bounded before this wake adds to it (retention.py), under the lock.
    Never fatal: a wake that cannot rotate still runs, and says why."""
    try:
        done = retention.enforce(agent.state_dir, agent.policy.state)
    except OSError as exc:
        done = [f"retention skipped: {exc}"]
    for line in done:
        say(f"state: {line}")
    if done:
        events.write(ev.Retention(done=tuple(done)))


def _check_config(
    agent: Agent, live: bool, script: Path | None, model: Model | None
) -> tuple[list[ScriptTurn], str, ledger.FleetCaps | None]:
    if script is not None and live:
        raise AgentError("--script drives the scripted model of a dry run; drop --live or --script")
    turns = load_script(script) if script is not None else DRY_RUN_SCRIPT
    api_key = os.environ.get("ANTHROPIC_API_KEY", "").strip()
    if live and model is None and not api_key:
        raise AgentError(
            "ANTHROPIC_API_KEY is not set: export it for a live wake, "
            f"or run a dry run (`wakeloop wake {agent.dir} --dry-run`)"
        )
    fleet = None
    if live:  # a USD cap on a model with no known price: refuse before anything starts
        ledger.check_caps(agent.model, agent.policy.budget, ledger.load_prices(), agent.policy.source)
        fleet = load_fleet_budget(agent.dir.parent)  # ROOT/budget.yaml: a bad one is one line, now
    return turns, api_key, fleet


def _skipped(agent: Agent, run_id: str, holder: st.LockHolder, events: EventLog, say: Say) -> Receipt:
    reason = f"another wake is running ({holder.describe()})"
    say(f"{agent.name}: {reason}; this wake is skipped")
    return _unstarted(agent, run_id, "skipped_locked", reason, events, holder_pid=holder.pid)


def _unavailable(agent: Agent, run_id: str, down: str, events: EventLog, say: Say) -> Receipt:
    """A wake skipped because its node does not answer: the receipt `status` shows, told once a series."""
    receipt = _unstarted(agent, run_id, "skipped_node", down, events)
    current, _ = st.load_state(agent.state_dir)
    st.save_state(agent.state_dir, replace(current, last_receipt=receipt))
    last = current.last_receipt
    if last is None or last.status != "skipped_node":  # the first of a series: said once
        notify_safely(events, say, outcomes.unavailable, agent, receipt)
    return receipt


def _node_down(agent: Agent, say: Say) -> str | None:
    """Past one host: why the agent's node cannot take this wake (its broker does not
    answer), or None. Placing an agent not yet placed happens here, under its lock."""
    address = broker_socket()
    if not address:
        return None
    try:
        nodes.check_node(agent.dir, address, agent.policy.sandbox.disk)
    except nodes.NodeUnavailable as exc:
        say(f"{agent.name}: unavailable: {exc}")
        return f"unavailable: {exc}"
    return None


def _not_started(agent: Agent, run_id: str, halted: stopswitch.Stop, events: EventLog, say: Say) -> Receipt:
    """The fleet is stopped: this wake does not start (no lock, no sandbox, no model call)."""
    reason = f"not started: {halted.describe()}"
    say(f"{agent.name}: {reason}")
    return _unstarted(agent, run_id, "stopped", reason, events, stopped_by=halted.who)


def notify_safely(
    events: EventLog,
    say: Say,
    queue_it: Callable[..., object],
    *args: object,
    secrets: tuple[str, ...] | None = None,
) -> None:
    """Queue notifications (notify/outcomes.py). Telling a person must never cost the wake its
    receipt, so any failure here (a full disk, a bug) is recorded and said, never raised; scrubbed
    of `secrets` (by default the environment's, as a wake's are)."""
    try:
        queue_it(*args)
    except Exception as exc:
        shown = secrets if secrets is not None else secrets_from_env()
        why = scrub(f"could not queue a notification: {type(exc).__name__}: {exc}", shown)
        events.write(ev.NotifyError(error=why))
        say(why)


def _unstarted(
    agent: Agent,
    run_id: str,
    status: Status,
    reason: str,
    events: EventLog,
    holder_pid: int | None = None,
    stopped_by: str | None = None,
) -> Receipt:
    """The receipt of a wake that never began, and its `wake_skipped` event."""
    events.write(ev.WakeSkipped(reason=reason, holder_pid=holder_pid, stopped_by=stopped_by))
    current, _ = st.load_state(agent.state_dir)
    return Receipt(
        run_id=run_id,
        agent=agent.name,
        wake=current.wake,
        status=status,
        reason=reason,
        model=agent.model,
        started_at=now_iso(),
    )


class _Wake:
    """The state of one wake in progress; `run` reads in the order things happen."""

    def __init__(
        self,
        agent: Agent,
        run_id: str,
        events: EventLog,
        lock: st.WakeLock,
        say: Say,
        stop: threading.Event | None,
        fleet: ledger.FleetCaps | None = None,
    ) -> None:
        self.agent, self.run_id, self.events, self.lock, self.say = agent, run_id, events, lock, say
        self.root = agent.dir.parent  # whose switch (ROOT/STOP) this wake obeys
        self.stop = stop or threading.Event()
        self.budget = agent.policy.budget
        self.fleet = fleet  # what all agents under ROOT may spend together (budget.yaml)
        self.started, self.started_at = time.monotonic(), now_iso()
        self.tally = Tally()  # steps, tool calls, tokens: what the caps and the receipt count
        self.inbox_committed = False
        self.closing_note: str | None = None
        self.secrets = secrets_from_env()
        self.transcript = tr.Transcript(agent.state_dir, run_id, agent.policy.transcript.max_wake_bytes, self.secrets)
        self.transcribed = 0  # messages[:transcribed] are in the transcript already
        self.messages_sent = 0  # send_message calls: each notification's id names its number
        self.waiting = 0  # a dry run: the human's messages it left in the inbox
        self.no_room = ""  # the last call the disk guard did not start (sandbox/disks/disk.py)

    def let_go(self) -> None:
        """The wake is over: drop what holds its own bound methods (the gate, the registry, the tool step), so
        its objects go when it returns. Left in that cycle, they outlive many collections while
        it runs, reach the oldest generation, and wait there for a rare full collection:
        serve's RSS saw-tooth of +10-15 % over thousands of wakes (bench/soak.py --probe)."""
        for name in ("gate", "registry", "tool_step"):  # not there if the wake ended before it made them
            vars(self).pop(name, None)

    # -- the life cycle -----------------------------------------------------------

    def run(self, sandbox: Sandbox | None, model: Model | None, turns: list[ScriptTurn]) -> Receipt:
        state, warning = st.load_state(self.agent.state_dir)
        if warning:
            self.say(warning)
            self.events.write(ev.StateRebuilt(warning=warning))
        self.meter = ledger.Meter(
            self.agent.state_dir,
            self.agent.model,
            self.budget,
            ledger.load_prices(),
            billed=bool(model and model.live),
            where=self.agent.policy.source,
            cache_ttl=CACHE.get("ttl", "5m"),
            fleet=self.fleet,
        )
        blocked = self._blocked(state)
        if blocked:
            return blocked
        # Under compose the broker's, never the Docker socket (client.open_sandbox decides).
        self.box = sandbox or open_sandbox(self.agent, run_id=self.run_id, fresh=True, say=self.say)
        # Its own box's node, when the commit fails, may be gone (past one host): asked then.
        down = functools.partial(_node_down, self.agent, self.say) if sandbox is None else None
        self.changes = Transaction(self.agent, self.run_id, self.box, self.events, self.transcript, self.say, down)
        try:
            with tracing.wake_span(self.agent.name, self.run_id, self.agent.model, bool(model and model.live)) as span:
                receipt = self._run_in(state, model, turns)
                tracing.wake_result(span, receipt.status, receipt.steps, receipt.tokens, receipt.reason)
            return receipt
        finally:
            self.changes.finish()  # whatever ended the wake: its changes are checked, committed or dropped
            if sandbox is None:
                self.box.close()  # ours: no container of this wake outlives it

    def _blocked(self, state: st.State) -> Receipt | None:
        """Seed 001: a wake the USD budget cannot afford does not start (status blocked)."""
        if not self.meter.billed:
            return None
        ctx = build_context(
            self.agent, wake=state.wake + 1, now=datetime.now(UTC), inbox=st.peek_inbox(self.agent.state_dir)
        )
        tools = build_registry(self.agent.policy, None, outbox=lambda text: None).to_anthropic()
        over = self.meter.check(
            ledger.estimate_tokens(ctx.system, ctx.first_user, tools), self.budget.max_output_tokens
        )
        if over is None:
            return None
        reason = over.reason
        self.events.write(ev.Blocked(reason=reason, cap=over.cap))
        self.say(f"blocked: {reason}")
        receipt = Receipt(
            run_id=self.run_id,
            agent=self.agent.name,
            wake=state.wake,
            status="blocked",
            reason=reason,
            model=self.agent.model,
            live=True,
            started_at=self.started_at,
        )
        st.save_state(self.agent.state_dir, replace(state, last_receipt=receipt))
        self._notify(outcomes.after_wake, self.agent, receipt)
        return receipt

    def _run_in(self, state: st.State, model: Model | None, turns: list[ScriptTurn]) -> Receipt:
        agent, sd = self.agent, self.agent.state_dir
        state = st.bump_wake(sd, state)
        self.wake_no, now = state.wake, datetime.now(UTC)
        self.day = journal_day(now)
        self.model = model or ScriptedModel(
            turns, name=f"scripted ({agent.model} when live)", variables={"wake": self.wake_no, "today": self.day}
        )
        # A dry run leaves the human's messages (and any a killed wake took) for the first live wake.
        inbox = st.drain_inbox(sd) if self.model.live else ""
        self.inbox_committed = not self.model.live
        try:
            self._started(inbox)
            self.changes.begin()
            self.task = self._claim_task()
            self.files = self.box.files()  # the broker's reading under compose: the disk is mounted there
            journal_before = self.files.journal_size(self.day)
            # What `wakeloop context` printed (context.next_wake): the same function, the same inputs.
            self.ctx = build_context(agent, wake=self.wake_no, now=now, inbox=inbox, files=self.files, task=self.task)
            self.transcript.system(self.ctx.system, self.ctx.system_hash)
            self._tools()
            self._approvals()
            status, reason = self._converse_or_dead_letter()
        finally:
            if not self.inbox_committed:
                st.restore_inbox(sd)  # the model never saw them: they wait for the next wake
        return self._ended(state, status, reason, journal_before)

    def _tools(self) -> None:
        """What the model's tool calls go through: the approval gate, the registry, one tool step."""
        agent, sd = self.agent, self.agent.state_dir
        completer = complete_task_tools(sd, self.run_id, self.task, agent.policy.tools, live=self.model.live)
        self.gate = Gate(
            agent.policy,
            sd,
            self.run_id,
            self._ask_person,
            self.events,
            self.transcript,
            halted=lambda: stopswitch.is_stopped(self.root),
            no_room=self._no_room,
        )
        self.registry = build_registry(
            agent.policy,
            self.box,
            outbox=self._message,
            extra=completer,
            remaining=self._time_left,
            asker=self.gate,
        )
        self.tool_step = ToolStep(
            self.registry, self.events, self.transcript, self.say, self.tally, self._stopping, self._no_room
        )

    def _started(self, inbox: str) -> None:
        mode = "live" if self.model.live else "dry run (scripted model, no API call)"
        self.say(f"wake #{self.wake_no} of {self.agent.name}: {mode}, model {self.model.name}, run {self.run_id}")
        stale = self.lock.stale
        if stale:
            self.say(f"took over the lock of pid {stale.pid} (no longer running)")
        messages = st.count_messages(inbox)
        if messages:
            self.say(f"{messages} message(s) from your human in this wake's context")
        self.waiting = 0 if self.model.live else st.count_messages(st.peek_inbox(self.agent.state_dir))
        if self.waiting:
            self.say(f"{self.waiting} message(s) from your human wait for the first live wake")
        self.events.write(
            ev.WakeStarted(
                wake=self.wake_no,
                agent=self.agent.name,
                model=self.model.name,
                live=self.model.live,
                policy=self.agent.policy.source,
                inbox_messages=messages,
                took_over_lock_from=stale.pid if stale else None,
            )
        )
        self.transcript.add(
            "wake",
            run_id=self.run_id,
            wake=self.wake_no,
            agent=self.agent.name,
            model=self.model.name,
            live=self.model.live,
        )

    def _approvals(self) -> None:
        """Approvals decided since the last wake: approved calls run now, every outcome told in the
        first user message (approval_gate.py). Never fatal: a wake that cannot read them still runs.
        A dry run leaves them for the first live wake, as it leaves the inbox: no model would hear them."""
        if not self.model.live or stopswitch.is_stopped(self.root):  # a stopped fleet: a later wake runs them
            return
        try:
            told = self.gate.outcomes(self.registry)
        except (OSError, ValueError, TypeError) as exc:
            why = scrub(f"approvals not read this wake: {exc}", self.secrets)
            self.events.write(ev.ApprovalError(error=why))
            self.say(why)
            return
        for o in told:
            self.say(f"approval {o.approval.id}: {o.approval.status} ({short(o.approval.summary())})")
        self.tally.tool_calls += sum(1 for o in told if o.approval.status == "ran")
        if told:
            self.ctx = replace(self.ctx, first_user=self.ctx.first_user + "\n\n" + approvals_section(told))

    def _ask_person(self, approval: Approval) -> None:
        """A call that waits: the person is told where they are (notify/outcomes.py)."""
        self.say(f"approval {approval.id} asked: {short(approval.summary())}")
        self._notify(outcomes.on_approval, self.agent, approval)

    def _claim_task(self) -> tasks.Task | None:
        """A live wake claims its task; a dry run names the same one and leaves it as it was."""
        live = self.model.live
        task, warning = tasks.claim_for_wake(self.agent.state_dir, self.run_id, live)
        if warning:
            self.say(warning)
            self.events.write(ev.TaskError(warning=warning))
        if task and live:
            self.say(f"task {task.id}: {short(task.title)}")
            self.events.write(ev.TaskClaimed(task=task.id, title=task.title))
        elif task:
            self.say(f"task {task.id}: {short(task.title)} (a dry run: left {task.status}, as it was)")
            self.events.write(ev.TaskShown(task=task.id, title=task.title, status=task.status))
        return task

    def _converse_or_dead_letter(self) -> tuple[Status, str]:
        try:
            return self._converse()
        except (DeadLetter, ModelError) as exc:
            reason = scrub(str(exc), self.secrets)
        except Exception as exc:  # a bug must still leave a trace, a receipt and a free lock
            reason = scrub(f"internal error: {type(exc).__name__}: {exc}", self.secrets)
        self.events.write(ev.DeadLetter(reason=reason, step=self.tally.steps))
        self.say(f"dead letter: {reason}")
        return "dead_letter", reason

    # -- the conversation -------------------------------------------------------------

    def _converse(self) -> tuple[Status, str]:
        messages: list[Message] = [{"role": "user", "content": self.ctx.first_user}]
        tools = self.registry.to_anthropic()
        final = False
        while True:
            halted = stopswitch.read(self.root)
            if halted is not None:
                return self._stopped(halted)
            if self.stop.is_set():
                return "done", "stopped"
            if self.tally.steps >= self.budget.max_steps:
                return self._budget_stop("max_steps", f"max_steps ({self.budget.max_steps}) reached")
            if self._time_left() <= 0:
                return self._budget_stop("max_wake_s", f"max_wake_s ({self.budget.max_wake_s:g}s) reached")
            over = self.meter.check(
                ledger.estimate_tokens(self.ctx.system, tools, messages), self.budget.max_output_tokens
            )
            if over:  # the worst case of this call would pass a USD cap: it is not made
                return self._budget_stop(over.cap, over.reason)
            turn = self._ask(messages, tools)
            if self._last_tools(turn, final):
                self.box.wind_down()  # the pool makes nothing ahead that no call would take
            if turn.content:
                messages.append({"role": "assistant", "content": turn.content})
            if final:
                self.closing_note = turn.text or turn.thinking  # 5.x: words before a tool call are thinking
                return "budget_stop", (
                    f"max_tokens_per_wake ({self.budget.max_tokens_per_wake:,}) reached: {self.tally.tokens:,} tokens"
                )
            then = stop_reasons.action(turn)
            if then == stop_reasons.END:
                return "done", turn.stop_reason
            if then == stop_reasons.DEAD:
                raise DeadLetter(stop_reasons.dead_stop(turn))
            if turn.tool_uses:
                messages.append({"role": "user", "content": self.tool_step.run_tools(turn)})
            elif then == stop_reasons.CUT:
                messages.append(stop_reasons.continue_note(self.budget.max_output_tokens))
            # PAUSE: the assistant turn goes back as is and the model continues it
            if self.tally.tokens >= self.budget.max_tokens_per_wake:
                final = True
                self._budget_stop("max_tokens_per_wake", "the token budget is spent: one last turn, no tools")
                stop_reasons.wrap_up(messages, self.tally.tokens, self.budget.max_tokens_per_wake, self.day)

    def _ask(self, messages: list[Message], tools: list[Block]) -> Turn:
        step = self.tally.steps + 1
        self.events.write(
            ev.ModelRequest(
                step=step,
                model=self.model.name,
                max_tokens=self.budget.max_output_tokens,
                messages=len(messages),
                system_prompt_hash=self.ctx.system_hash,
                tools=tuple(t["name"] for t in tools),
                tool_choice="auto",  # never changed: the wrap-up turn says "no more tools" in text
            )
        )
        for text in _user_texts(messages[self.transcribed :]):  # tool results went in as they ran
            self.transcript.add("user", step=step, text=text)
        self.transcribed = len(messages)
        started_ns = time.time_ns()
        turn = self.model.call(
            system=self.ctx.system_blocks(),
            tools=tools,
            messages=messages,
            max_tokens=self.budget.max_output_tokens,
        )
        if not self.model.live:  # a live call's span is the SDK's own
            tracing.scripted_chat(
                self.model.name, self.budget.max_output_tokens, turn.usage.to_json(), turn.stop_reason, started_ns
            )
        if not self.inbox_committed:
            st.commit_inbox(self.agent.state_dir)
            self.inbox_committed = True
        self.tally.steps = step
        u = turn.usage
        self.tally.usage += u
        for billed in turn.requests:  # reconcile: the real usage replaces the worst case (each request on its own)
            self.meter.record(billed, turn.inference_geo)
        self.events.write(
            ev.ModelResponse(
                step=step,
                stop_reason=turn.stop_reason,
                usage=u,
                tool_names=tuple(b["name"] for b in turn.tool_uses),
                model=turn.model,
                tokens_this_wake=self.tally.tokens,
            )
        )
        self.transcript.add(
            "assistant",
            step=step,
            content=turn.content,
            stop_reason=turn.stop_reason,
            usage=u.to_json(),
            model=turn.model,
            usd_so_far=round(self.meter.usd, 6),
        )
        if turn.thinking:  # a 5.x model's words between tool calls, as summaries
            self.say(f"step {step}: ({short(turn.thinking)})")
        if turn.text:
            self.say(f"step {step}: {short(turn.text)}")
        return turn

    def _last_tools(self, turn: Turn, final: bool) -> bool:
        """Whether no model turn after this one can ask for a tool: it asked for none
        and ends the wake, or it is the last the caps allow. Then only this turn's
        calls and the journal's stub are left."""
        ends = stop_reasons.action(turn) in (stop_reasons.END, stop_reasons.DEAD)
        return ends or final or self.tally.steps >= self.budget.max_steps

    def _stopping(self) -> bool:
        """No further tool call runs: the wake's stop, its wall clock, the fleet's switch."""
        return self.stop.is_set() or self._time_left() <= 0 or stopswitch.is_stopped(self.root)

    def _time_left(self) -> float:
        """Seconds of budget.max_wake_s left; a tool call's timeout is cut to it (tools.py)."""
        return self.budget.max_wake_s - (time.monotonic() - self.started)

    def _message(self, text: str) -> None:
        """send_message: into the outbox in state/, and queued for whoever asked to be told."""
        st.append_outbox(self.agent.state_dir, text, self.wake_no)
        self.messages_sent += 1
        self._notify(outcomes.on_message, self.agent, self.run_id, self.wake_no, self.messages_sent, text)

    def _notify(self, queue_it: Callable[..., object], *args: object) -> None:
        notify_safely(self.events, self.say, queue_it, *args, secrets=self.secrets)

    def _stopped(self, halted: stopswitch.Stop) -> tuple[Status, str]:
        self.events.write(ev.Stopped(who=halted.who, at=halted.at, why=halted.why, steps=self.tally.steps))
        self.say(f"stopped: {halted.describe()}")
        return "stopped", halted.describe()

    def _no_room(self, reason: str) -> None:
        """A call the disk guard did not start (sandbox/disks/disk.py): the model has the line as its
        result; the first of the wake is an event, and the operator is told (once a day)."""
        first = not self.no_room
        self.no_room = reason
        if first:
            self.events.write(ev.DiskNoRoom(step=self.tally.steps, reason=reason))
            self.say(f"disk: {reason}")
            self._notify(outcomes.no_room, self.agent, self.run_id, self.wake_no, reason)

    def _budget_stop(self, cap: str, reason: str) -> tuple[Status, str]:
        self.events.write(ev.BudgetStop(cap=cap, reason=reason, steps=self.tally.steps, tokens=self.tally.tokens))
        self.say(f"budget stop: {reason}")
        return "budget_stop", reason

    # -- after the conversation ----------------------------------------------------------

    def _ended(self, state: st.State, status: Status, reason: str, journal_before: int | None) -> Receipt:
        """After the conversation: the journal trace, the commit, the receipt, the state, the news."""
        sd = self.agent.state_dir
        journal = journal_trace(
            self.box,
            self.files,
            self.day,
            journal_before,
            wake_no=self.wake_no,
            closing_note=self.closing_note,
            tally=self.tally,
            ended=f"{status}: {reason}",
            events=self.events,
            say=self.say,
            secrets=self.secrets,
        )
        status, reason = self.changes.honest(status, reason, self.changes.finish())
        receipt = self._receipt(status, reason, journal)
        st.save_state(
            sd, replace(state, tokens_lifetime=state.tokens_lifetime + self.tally.tokens, last_receipt=receipt)
        )
        self._close_transcript(receipt)
        self._notify(outcomes.after_wake, self.agent, receipt)
        self.events.write(
            ev.WakeFinished(
                status=status,
                reason=reason,
                tokens=self.tally.tokens,
                steps=self.tally.steps,
                task=receipt.task,
                receipt=receipt,
            )
        )
        self.say(
            f"{status}: {reason}; {self.tally.steps} steps, {self.tally.tokens:,} tokens "
            f"({self.tally.usage.cache_read_tokens:,} read from cache), {self.tally.tool_calls} tool calls, "
            f"{receipt.duration_ms / 1000:.1f}s"
        )
        return receipt

    def _close_transcript(self, receipt: Receipt) -> None:
        """The transcript's last line, then its retention (records/transcript.py prune)."""
        self.transcript.end(
            status=receipt.status,
            reason=receipt.reason,
            task=receipt.task,
            steps=receipt.steps,
            tokens=receipt.tokens,
            tool_calls=receipt.tool_calls,
            usd=receipt.usd,
            duration_ms=receipt.duration_ms,
            journal=receipt.journal,
        )
        caps = self.agent.policy.transcript
        try:
            pruned = tr.prune(
                self.agent.state_dir,
                max_agent_bytes=caps.max_agent_bytes,
                retention_days=caps.retention_days,
                keep=self.run_id,
            )
        except OSError as exc:
            self.transcript.error = self.transcript.error or f"transcript retention failed: {exc}"
        else:
            if pruned.files:
                self.events.write(ev.TranscriptsPruned(files=pruned.files, bytes=pruned.bytes, prompts=pruned.prompts))
        if self.transcript.error:  # never silent, never fatal: the wake itself went on
            self.events.write(ev.TranscriptError(error=self.transcript.error))
            self.say(self.transcript.error)

    def _receipt(self, status: Status, reason: str, journal: str) -> Receipt:
        return Receipt(
            run_id=self.run_id,
            agent=self.agent.name,
            wake=self.wake_no,
            status=status,
            reason=reason,
            steps=self.tally.steps,
            usage=self.tally.usage,
            tool_calls=self.tally.tool_calls,
            duration_ms=int((time.monotonic() - self.started) * 1000),
            model=self.model.name,
            live=self.model.live,
            journal=journal,
            started_at=self.started_at,
            usd=None if self.meter.billed and self.meter.price is None else round(self.meter.usd, 6),
            task=task.id if (task := getattr(self, "task", None)) else "",
            messages_waiting=self.waiting,
            no_room=self.no_room,
            node_lost=self.changes.node_lost,
            # The proxy's decisions for this run, appended to state/egress.jsonl as they were collected.
            egress=egress.summarize(self.agent.state_dir, self.run_id),
        )


def _user_texts(messages: list[Message]) -> list[str]:
    """The text the harness sent in these messages: user strings and text blocks (not tool results)."""
    out = []
    for m in messages:
        if m["role"] != "user":
            continue
        blocks = [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"]
        out += [b["text"] for b in blocks if b.get("type") == "text"]
    return out
