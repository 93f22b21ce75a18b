"""The tool registry (seed 003's Registry/Tool): what the model can call, checked against the policy.

Three tools: `bash` and `write_file` run in a fresh sandbox container each
call, as do Claude's own text editor and memory tool (editor_tool.py);
`send_message` appends to state/outbox.txt on the host, where the agent
can never forge or erase it. A disabled tool is not offered at all, and a
call to it anyway is refused with a reason.

Errors are values: an unknown tool, missing or ill-typed arguments, a policy
refusal, a sandbox failure all come back as an `is_error` result the model
reads and handles. Nothing here raises into the wake. A bash command that
exits non-zero is not a tool error: the model gets the exit code on the first
line and decides.

A call that matches the policy's `approve:` rules is not run: the asker
(approval_gate.py) answers it with WAITING text and files it for a person. A bash
call that reached a host a network_host rule asks about ran, its request refused by
the proxy; the asker files it after, and its result says so.

Not here: the order of calls and the events (loop.py), the container
(sandbox/engine.py, or the broker's: broker/client.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from orchestrator.policy.schema import Policy
from orchestrator.sandbox.box import Sandbox, SandboxError, SandboxResult
from orchestrator.sandbox.egress.egress_plan import grant_refusal
from orchestrator.wake.editor_tool import editor_tools
from orchestrator.wake.tool_result import Tool, ToolResult, denied, error, sandbox_detail

TYPES = {"string": str, "integer": int, "object": dict, "boolean": bool, "array": list}


class Asker(Protocol):
    """approval_gate.py's Gate: what stands before, and after, every handler."""

    def ask(self, tool: str, args: dict[str, Any], words: str) -> ToolResult | None:
        """A WAITING result, or None to run the call now."""

    def asked_hosts(self, tool: str, args: dict[str, Any], words: str, result: ToolResult) -> ToolResult:
        """A call that ran and reached hosts that ask a person (approve.rules network_host):
        filed, and its result saying so."""


class Registry:
    """The catalogue: offers enabled tools, validates and dispatches calls."""

    def __init__(self, tools: list[Tool], asker: Asker | None = None):
        self._tools = {t.name: t for t in tools}
        self.asker = asker  # calls that wait for a person (policy `approve:`)

    def add(self, tool: Tool) -> None:
        """One more tool (e.g. tasks.py's complete_task); offered after the built-in three."""
        self._tools[tool.name] = tool

    def to_anthropic(self) -> list[dict[str, Any]]:
        return [t.to_anthropic() for t in self._tools.values() if t.enabled]

    def names(self) -> list[str]:
        return [t.name for t in self._tools.values() if t.enabled]

    def call(self, name: str, args: Any, words: str = "", gate: bool = True, hosts: tuple[str, ...] = ()) -> ToolResult:
        """Run one call. `words`: the model's text just before it (an approval shows it to the person);
        `gate=False`: a call a person approved, run now without asking again, with `hosts` allowed
        for it alone when the approval was for hosts (approve.rules network_host)."""
        tool = self._tools.get(name)
        if tool is None or (not tool.enabled and not tool.disabled_reason):
            return error(f"unknown tool {name!r}; the tools are: {', '.join(self.names()) or 'none'}")
        if not tool.enabled:
            return denied(tool.disabled_reason)
        problem = check_args(tool.input_schema, args)
        if problem:
            return error(f"{name}: {problem}; expected arguments: {_signature(tool.input_schema)}")
        try:
            if hosts:
                if tool.granted is None:
                    return error(f"{name}: only bash calls are granted hosts")
                return tool.granted(args, hosts)
            waiting = self.asker.ask(name, args, words) if gate and self.asker else None
            if waiting:
                return waiting
            result = tool.handler(args)
            if gate and self.asker and result.detail.get("asked_hosts"):
                return self.asker.asked_hosts(name, args, words, result)
            return result
        except SandboxError as exc:
            return error(f"{name}: the sandbox could not run this call: {exc}")
        except Exception as exc:  # a bug here must not end the wake: the model is told
            return error(f"{name}: internal error in the harness: {type(exc).__name__}: {exc}")


def check_args(schema: dict[str, Any], args: Any) -> str | None:
    """Why args do not fit the schema (top level only, which is all our tools use), or None."""
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    props = schema.get("properties", {})
    problems = [f"missing argument {k!r}" for k in schema.get("required", []) if k not in args]
    for key, value in args.items():
        if key not in props:
            problems.append(f"unexpected argument {key!r}")
            continue
        want = TYPES.get(props[key].get("type", ""), object)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            problems.append(f"argument {key!r} must be a {props[key].get('type')}, got {type(value).__name__}")
    return ", ".join(problems) or None


def _signature(schema: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {v.get('type')}" for k, v in schema.get("properties", {}).items())


# -- the three tools ----------------------------------------------------------------


def build_registry(
    policy: Policy,
    sandbox: Sandbox | None,
    outbox: Callable[[str], None],
    extra: Sequence[Tool] = (),
    remaining: Callable[[], float] | None = None,
    asker: Asker | None = None,
) -> Registry:
    """The tools for one wake. `outbox` appends one message to state/outbox.txt;
    `extra` are host-side tools made elsewhere (complete_task, tasks.py); `remaining`
    is the wake's time left (budget.max_wake_s), which caps every call's timeout;
    `asker` stands before every handler: a call that must wait for a person is not run."""
    box = _Toolbox(policy, sandbox, outbox, remaining)
    t = policy.tools
    return Registry(
        [
            Tool(
                "bash",
                (
                    "Run a shell command (bash -c) in a fresh container whose working directory is "
                    f"/workspace, your workspace. stdout and stderr are returned together, at most "
                    f"{t.bash.max_output_chars:,} characters (head and tail kept). Timeout "
                    f"{t.bash.timeout_s:g}s. The first line of the result is the exit status. "
                    "Only /workspace persists between calls."
                ),
                {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
                box.bash,
                t.bash.enabled,
                "the bash tool is disabled by this agent's policy",
                box.bash_granted,
            ),
            Tool(
                "write_file",
                (
                    "Create or overwrite a file at a path relative to /workspace (parent directories "
                    f"are created). At most {t.write_file.max_bytes:,} bytes. A path through a symlink is "
                    "refused with the real path named."
                ),
                {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"],
                },
                box.write_file,
                t.write_file.enabled,
                "the write_file tool is disabled by this agent's policy",
            ),
            Tool(
                "send_message",
                (
                    "Queue a message for your human; they read it outside this session. Use sparingly: "
                    f"at most {t.send_message.max_per_wake} per wake, {t.send_message.max_chars:,} characters each "
                    "(a longer one is cut); one good message beats five fragments."
                ),
                {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
                box.send_message,
                t.send_message.enabled,
                "the send_message tool is disabled by this agent's policy",
            ),
            *editor_tools(policy, sandbox, box._timeout),
            *extra,
        ],
        asker,
    )


MIN_CALL_S = 1.0  # a call's timeout when the wake's time is (nearly) up: it still answers


class _Toolbox:
    def __init__(
        self,
        policy: Policy,
        sandbox: Sandbox | None,
        outbox: Callable[[str], None],
        remaining: Callable[[], float] | None = None,
    ):
        self.policy, self.sandbox, self.outbox = policy, sandbox, outbox
        self.remaining = remaining
        self.sent = 0

    def _timeout(self, policy_s: float) -> float:
        """The tool's timeout, cut to what is left of the wake's wall clock."""
        return policy_s if self.remaining is None else max(MIN_CALL_S, min(policy_s, self.remaining()))

    def bash(self, args: dict[str, Any], hosts: tuple[str, ...] = ()) -> ToolResult:
        command = args["command"]
        if not command.strip():
            return error("bash: the command is empty")
        cfg = self.policy.tools.bash
        assert self.sandbox is not None  # a registry built without one only lists its tools
        granted = {"grant_hosts": hosts} if hosts else {}  # a box of a test's may not take the keyword
        return _from_sandbox(
            self.sandbox.run(
                command, timeout_s=self._timeout(cfg.timeout_s), max_output_chars=cfg.max_output_chars, **granted
            ),
            error_on_fail=False,
        )

    def bash_granted(self, args: dict[str, Any], hosts: tuple[str, ...]) -> ToolResult:
        """An approved call that reached hosts a person was asked about: run with them allowed,
        if the policy as it stands still asks about them (else refused: the approval is void)."""
        reason = grant_refusal(self.policy.sandbox, hosts)
        if reason:
            return denied(f"bash with hosts {', '.join(hosts)}: {reason}")
        return self.bash(args, hosts)

    def write_file(self, args: dict[str, Any]) -> ToolResult:
        path, content = args["path"], args["content"].encode("utf-8")
        cfg = self.policy.tools.write_file
        reason = cfg.refusal(path, len(content))  # policy/schema.py owns the globs and max_bytes
        if reason:
            return denied(f"write_file {path}: {reason}")
        assert self.sandbox is not None  # a registry built without one only lists its tools
        return _from_sandbox(
            self.sandbox.write(path, content, timeout_s=self._timeout(cfg.timeout_s), protect_git=cfg.protect_git),
            error_on_fail=True,
        )

    def send_message(self, args: dict[str, Any]) -> ToolResult:
        text = args["text"]
        limit = self.policy.tools.send_message.max_per_wake
        if self.sent >= limit:
            return denied(f"send_message: already sent {limit} messages this wake (max_per_wake)")
        if not text.strip():
            return error("send_message: the text is empty")
        sent, note = cut_message(text, self.policy.tools.send_message.max_chars)
        self.outbox(sent)
        self.sent += 1
        return ToolResult(
            text=f"queued for your human ({self.sent} of {limit} this wake).{note}",
            detail={"chars": len(sent), **({"cut_chars": len(text) - len(sent)} if note else {})},
        )


def cut_message(text: str, max_chars: int) -> tuple[str, str]:
    """A message as sent (at most max_chars characters) and what the model is told of
    the cut: nothing, or how much went and where the sent text stops, so it can send the
    rest (shorter) if it matters. The outbox and every notification see only the sent
    text; the transcript keeps the model's reply as it came (its tool_use input whole,
    bounded by max_output_tokens and transcript.max_wake_bytes)."""
    if len(text) <= max_chars:
        return text, ""
    cut = len(text) - max_chars
    return text[:max_chars], (
        f" It was cut: only its first {max_chars:,} characters were sent "
        f"(tools.send_message.max_chars); the last {cut:,} were not. "
        f"The sent text ends with: {text[max(0, max_chars - 60) : max_chars]!r}"
    )


def _from_sandbox(result: SandboxResult, error_on_fail: bool) -> ToolResult:
    detail = sandbox_detail(result)
    if result.no_room:  # the disk guard did not start it: the wake records it and tells the operator
        return ToolResult(text=result.for_model(), is_error=True, detail=detail | {"no_room": result.no_room})
    return ToolResult(text=result.for_model(), is_error=error_on_fail and not result.ok, detail=detail)
