"""Attacks on the broker by a taken-over orchestrator (category `orchestrator`): what it can send
the broker or plant for it (docs/architecture.md §3, actor B: it holds agents/ read-write and the broker socket).

Each probe serves a real Broker on a temp unix socket for a temp ROOT inside
its own trial folder (never the real agents folder), plants its files there,
talks to it through the real wire (wire.request, or a raw socket for what a
client would never send), and judges by `held`/`escaped`. Promised: each
attack is refused or bounded within BOUND_S, other agents are served
meanwhile, the log stays bounded, and nothing is left behind. The ceiling and
policy probes use the `check` op, which goes through the same load and
ceiling as `run` but makes no container; the in-flight probe runs three.

Not here: the broker (broker/server.py), the ceiling (policy/ceiling.py),
the files it reads (safeio/yamlfile.py read_config); the model's attacks
(the other escapes modules).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from orchestrator.escapes.lab import Probe, Trial, escaped, held, set_agent_policy

CATEGORY = "orchestrator"
BOUND_S = 2.0  # a refusal or a bound takes ms; 2 s leaves room on a loaded 2-core box
READ_BOUND_S = 2.0 + BOUND_S  # the broker's REQUEST_READ_S for a silent connection, plus that margin
START_S = 60.0  # a held call's container: create and start on a loaded engine
SILENT_CONNECTIONS = 20  # enough to show they are cut off, few enough to be cheap
OVERSIZED_BYTES = 33 * 2**20  # one request line past wire.MAX_REQUEST_BYTES (32 MiB)


class ServedBroker:
    """A Broker served on a temp socket for ROOT; its log kept for the probe to judge."""

    def __init__(self, root: Path, client, ceiling, tls_dir: Path | None = None):
        from orchestrator.broker.server import Broker
        from orchestrator.broker.transport import make_server

        self.root = root
        self.lines: list[str] = []
        self.broker = Broker(root, client=client, log=self.lines.append, ceiling=ceiling)
        self._dir = Path(tempfile.mkdtemp(prefix="wlo-"))  # unix socket paths are capped at 108 bytes
        self.socket = self._dir / "broker.sock"
        # With `tls_dir`: TCP with mutual TLS on a free port of 127.0.0.1 (`address`), not the socket.
        self.server = make_server(self.broker, "tls://127.0.0.1:0" if tls_dir else self.socket, tls_dir)
        port = self.server.socket.getsockname()[1] if tls_dir else None
        self.address = f"tls://127.0.0.1:{port}" if tls_dir else str(self.socket)
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        self._closed = False

    def ask(self, request: dict, timeout_s: float = BOUND_S) -> tuple[dict | None, float]:
        """(reply, seconds) of one request; reply None if it was not answered in time."""
        import json

        started = time.monotonic()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(self.socket))  # blocking, as wire.request's: a full backlog waits
                s.settimeout(timeout_s)
                s.sendall(json.dumps(request).encode() + b"\n")
                line = s.makefile("rb").readline()
            except (TimeoutError, OSError):
                return None, time.monotonic() - started
        try:
            return json.loads(line), time.monotonic() - started
        except ValueError:
            return {"ok": False, "error": "(closed without an answer)"}, time.monotonic() - started

    def long_log_lines(self, limit: int = 300) -> list[int]:
        return [len(line) for line in self.lines if len(line) > limit]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.server.shutdown()
        self.server.server_close()  # joins the request threads
        self.broker.close()
        self._thread.join(BOUND_S)
        shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def served_broker(t: Trial, ceiling=None, agents: dict[str, dict | str] | None = None):
    """A temp ROOT under the trial with `agents` (name -> inline policy, or its file), served."""
    from orchestrator.policy.agent import init_agent
    from orchestrator.policy.ceiling import Ceiling

    root = t.dir / "root"
    for name, policy in (agents or {"alpha": {}}).items():
        set_agent_policy(init_agent(root / name), policy)
    served = ServedBroker(root, t.lab.client, ceiling or Ceiling(source="the probe's ceiling"))
    try:
        yield served
    finally:
        served.close()


def _refusals(served: ServedBroker, names: list[str], must_say: str, op: str = "check") -> str | None:
    """None if every agent in `names` is refused within BOUND_S with `must_say` in the
    reason, else the finding (ESCAPED or not) as text."""
    for name in names:
        # A whole request of its kind: what is refused must be the agent, not the line.
        reply, seconds = served.ask({"op": op, "agent": name, **({"command": "true"} if op == "run" else {})})
        if reply is None:
            return escaped(f"{name}: the broker did not answer within {BOUND_S:g}s: it is stuck on a planted file")
        if reply.get("ok"):
            return escaped(f"{name}: the broker served {op} for it")
        if must_say not in reply["error"]:
            return escaped(f"{name}: refused, but not for what was planted: {reply['error']:.160}")
        if "\n" in reply["error"]:
            return escaped(f"{name}: the refusal is more than one line")
    return None


def _other_agent_served(served: ServedBroker) -> str | None:
    reply, seconds = served.ask({"op": "check", "agent": "alpha"})
    if not (reply and reply.get("ok")):
        return escaped(f"another agent was not served meanwhile: {reply}")
    return None


# -- planted policy files ------------------------------------------------------------

_ALIAS_BOMB = (
    "\n".join(
        ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    )
    + "\n"
)
# six levels of ten: a million leaves from 400 bytes. Small enough that a broker
# without the guard walks it in seconds and recovers (the weakened control), large
# enough that the walk is seen; a real bomb has nine levels and never finishes.


def _alias_bomb(t: Trial) -> str:
    with served_broker(t, agents={"alpha": {}, "bomb": "bomb.yaml", "inline": {}}) as served:
        (served.root / "bomb/bomb.yaml").write_text(_ALIAS_BOMB)
        # agent.yaml itself, the policy inline beneath an alias bomb
        (served.root / "inline/agent.yaml").write_text(_ALIAS_BOMB + "policy: {}\n")
        found = _refusals(served, ["bomb", "inline"], "aliases")
        found = found or _other_agent_served(served)
        if found:
            return found
        return held(
            "a policy file and an agent.yaml that are YAML alias bombs were refused in "
            f"under {BOUND_S:g}s (aliases are refused); another agent was served"
        )


broker_refuses_yaml_alias_bomb = Probe(
    "broker_refuses_yaml_alias_bomb",
    CATEGORY,
    "a planted agent.yaml or policy file that is a YAML alias bomb is refused at once, unexpanded",
    _alias_bomb,
)


def _fifo_policy(t: Trial) -> str:
    fifos = []
    with served_broker(t, agents={"alpha": {}, "viafile": "planted.yaml", "direct": {}}) as served:
        fifos = [served.root / "viafile/planted.yaml", served.root / "direct/agent.yaml"]
        fifos[1].unlink()
        try:
            for fifo in fifos:
                os.mkfifo(fifo)
            found = _refusals(served, ["viafile", "direct"], "not a regular file")
            found = found or _other_agent_served(served)
        finally:
            for fifo in fifos:
                _release(fifo)  # a broker that opened one is let go, so it can stop
        if found:
            return found
    return held(
        f"a FIFO as agent.yaml and as its policy file were refused in under {BOUND_S:g}s, unopened; "
        "another agent was served"
    )


def _release(fifo: Path) -> None:
    """Open the FIFO's write end if anyone reads it, and close it: the reader sees EOF."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader (ENXIO): nothing was stuck on it


broker_refuses_fifo_policy = Probe(
    "broker_refuses_fifo_policy",
    CATEGORY,
    "a FIFO planted as agent.yaml or as the policy file it names is refused without blocking the broker",
    _fifo_policy,
)


def _device_or_huge_policy(t: Trial) -> str:
    with served_broker(t, agents={"alpha": {}, "device": {}, "huge": "huge.yaml"}) as served:
        (served.root / "device/agent.yaml").unlink()
        (served.root / "device/agent.yaml").symlink_to("/dev/null")  # a device: reads as an empty policy
        with open(served.root / "huge/huge.yaml", "wb") as f:
            f.truncate(64 * 2**20)  # sparse: no disk used
        found = _refusals(served, ["device"], "not a regular file") or _refusals(
            served, ["huge"], "bytes; a policy is at most"
        )
        found = found or _other_agent_served(served)
        if found:
            return found
    return held("agent.yaml as a device node and a 64 MiB policy file were refused, unread; another agent was served")


broker_refuses_device_or_huge_policy = Probe(
    "broker_refuses_device_or_huge_policy",
    CATEGORY,
    "a device node as agent.yaml, or a policy file of many MiB, is refused before it is read",
    _device_or_huge_policy,
)


def _symlinked_agent(t: Trial) -> str:
    from orchestrator.policy.agent import init_agent

    with served_broker(t, agents={"alpha": {}}) as served:
        (served.root / "twin").symlink_to(served.root / "alpha", target_is_directory=True)
        outside = init_agent(t.dir / "outside")
        (served.root / "elsewhere").symlink_to(outside, target_is_directory=True)
        found = _refusals(served, ["twin", "elsewhere"], "not a folder directly under")
        found = found or _other_agent_served(served)
        if found:
            return found
    return held("agent names that are symlinks (to another agent, and outside ROOT) were refused")


broker_refuses_symlinked_agent_dir = Probe(
    "broker_refuses_symlinked_agent_dir",
    CATEGORY,
    "an agent folder that is a symlink (to another agent, or out of ROOT) is refused: one name, one real folder",
    _symlinked_agent,
)


def _long_reason(t: Trial) -> str:
    with served_broker(t, agents={"alpha": {}, "loud": {}}) as served:
        # An explicit key (`? KEY`) may be any length, and the refusal of an unknown key quotes it whole.
        (served.root / "loud/agent.yaml").write_text(f"? {'x' * 200_000}\n: 1\npolicy: {{}}\n")
        reply, _ = served.ask({"op": "check", "agent": "loud"})
        long = served.long_log_lines()
        if long:
            return escaped(f"a planted 200,000-char key made broker log lines of {max(long):,} chars")
        if reply is None or reply.get("ok"):
            return f"the planted key was not refused: {reply}"
        if len(reply["error"]) > 4000:
            return escaped(f"the refusal sent back is {len(reply['error']):,} chars")
    return held(
        f"a 200,000-char planted key was refused in a log line of at most 300 chars ({len(served.lines)} lines)"
    )


broker_bounds_its_log_lines = Probe(
    "broker_bounds_its_log_lines",
    CATEGORY,
    "a refusal whose reason quotes a huge planted key is cut: the broker's log lines stay short",
    _long_reason,
)


# -- connections ----------------------------------------------------------------------


def _silent_connections(t: Trial) -> str:
    with served_broker(t) as served:
        silent = []
        try:
            for _ in range(SILENT_CONNECTIONS):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(served.socket))
                silent.append(s)
            reply, seconds = served.ask({"op": "ping"})
            if not (reply and reply.get("ok")):
                return escaped(
                    f"with {len(silent)} silent connections open, a ping was not answered within {BOUND_S:g}s"
                )
            big = _oversized(served)
            if big:
                return big
            started, cut = time.monotonic(), 0
            for s in silent:
                s.settimeout(max(0.01, READ_BOUND_S - (time.monotonic() - started)))
                try:
                    s.recv(4096)  # the broker's "no complete request line", then EOF
                    cut += 1
                except TimeoutError:
                    break
            if cut < len(silent):
                return escaped(
                    f"{len(silent) - cut} of {len(silent)} connections that sent nothing were "
                    f"still open after {READ_BOUND_S:g}s: each holds a broker thread"
                )
        finally:
            for s in silent:
                s.close()
    left = [th for th in threading.enumerate() if "process_request" in th.name and th.is_alive()]
    if left:
        return escaped(f"{len(left)} connection thread(s) outlived the broker")
    return held(
        f"{SILENT_CONNECTIONS} silent connections were cut off within {READ_BOUND_S:g}s, a "
        f"{OVERSIZED_BYTES // 2**20} MiB line without a newline was refused, a ping answered meanwhile"
    )


def _oversized(served: ServedBroker) -> str | None:
    """One line past the broker's cap, sent whole: it must be refused, not buffered forever."""
    started = time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(READ_BOUND_S)
        s.connect(str(served.socket))
        chunk, sent = b"x" * 2**20, 0
        try:
            while sent < OVERSIZED_BYTES:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the broker stopped reading and closed: what it should do
        try:
            answer = s.makefile("rb").readline()
        except (TimeoutError, OSError):
            answer = b""
    seconds = time.monotonic() - started
    if b"request over" not in answer:
        return escaped(
            f"a {sent // 2**20} MiB line with no newline was not refused within "
            f"{READ_BOUND_S:g}s ({seconds:.1f}s; answer {answer[:80]!r})"
        )
    return None


broker_bounds_silent_connections = Probe(
    "broker_bounds_silent_connections",
    CATEGORY,
    "connections that send nothing, or 33 MiB without a newline, are cut off within seconds; others are served",
    _silent_connections,
)


def _calls_in_flight(t: Trial) -> str:
    from orchestrator.policy.ceiling import Ceiling

    ceiling = Ceiling(max={"calls_per_agent": 2, "calls": 3}, source="the probe's ceiling")
    cold = {"sandbox": {"pool": 0}}  # a container per call and none waiting: three in all
    with served_broker(t, ceiling, agents={"alpha": cold, "beta": cold}) as served:
        views = {}
        for name in ("alpha", "beta"):  # made in the box: the workspace is a disk only the broker mounts
            reply, _ = served.ask({"op": "run", "agent": name, "command": "mkfifo -m 666 hold hold2"}, START_S)
            if not (reply and reply.get("ok") and reply["result"]["exit_code"] == 0):
                return f"{name}: could not make its FIFOs: {reply}"
            # In a wake, as the loop calls: the FIFOs are then the wake overlay's, where the host opens
            # them too (a call outside a wake is a wake of its own, whose overlay the host never sees).
            reply, _ = served.ask({"op": "begin", "agent": name, "run_id": "0123456789ab"}, START_S)
            if not (reply and reply.get("ok")):
                return f"{name}: could not begin a wake: {reply}"
            views[name] = served.broker.keeper._boxes[name].box.view
        fifos = [views["alpha"] / "hold", views["alpha"] / "hold2", views["beta"] / "hold"]
        holders, writers, opened = [], [], []
        try:
            for fifo, agent in zip(fifos, ("alpha", "alpha", "beta"), strict=True):
                done = threading.Event()

                def open_fifo(f=fifo, d=done) -> None:
                    opened.append(open(f, "wb"))  # noqa: SIM115 (held open: the probe closes it)
                    d.set()

                writer = threading.Thread(target=open_fifo, daemon=True)
                writers.append(writer)
                writer.start()  # the open returns once the box's `cat` has the FIFO open: the call is in flight
                call = threading.Thread(
                    target=served.ask,
                    args=(
                        {"op": "run", "agent": agent, "command": f"cat /workspace/{fifo.name} >/dev/null; echo done"},
                        START_S,
                    ),
                    daemon=True,
                )
                call.start()
                holders.append(call)
                if not done.wait(START_S):
                    return f"a held call for {agent} never started: {served.lines[-1:]}"
            # alpha has 2 in flight (its cap), all agents 3 (the broker's cap)
            for agent, cap in (("alpha", "max.calls_per_agent is 2"), ("beta", "max.calls is 3")):
                reply, seconds = served.ask({"op": "run", "agent": agent, "command": "echo ran"})
                if reply is None:
                    return escaped(f"a call for {agent} past {cap} was queued: no answer in {BOUND_S:g}s")
                if reply.get("ok"):
                    return escaped(f"a call for {agent} ran past {cap}: {served.broker._calls} in flight")
                if cap not in reply["error"]:
                    return f"refused for another reason: {reply['error']:.160}"
            reply, _ = served.ask({"op": "ping"})
            if not (reply and reply.get("ok")):
                return escaped("the broker stopped answering while its calls were full")
        finally:
            for fifo in fifos:  # a writer still waiting for its reader is let go
                try:
                    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
                except OSError:
                    pass
            for writer in writers:
                writer.join(BOUND_S)
            for f in opened:
                f.close()  # the held calls read EOF and end
            for call in holders:
                call.join(START_S)
    return held("past 2 calls for one agent and 3 in all, calls were refused at once; pings answered meanwhile")


broker_bounds_calls_in_flight = Probe(
    "broker_bounds_calls_in_flight",
    CATEGORY,
    "calls past the ceiling's max.calls_per_agent or max.calls are refused at once, not queued",
    _calls_in_flight,
)


# -- policies over the ceiling ---------------------------------------------------------


def _over_ceiling(key: str, ceiling_of, asks: list[dict], must_say: str, alpha_of=lambda t: {}):
    def attack(t: Trial) -> str:
        from orchestrator.policy.ceiling import Ceiling

        agents = {f"ask{i}": {"sandbox": ask} for i, ask in enumerate(asks)}
        ceiling = Ceiling(source="the probe's ceiling", **ceiling_of(t))
        with served_broker(t, ceiling, agents={"alpha": alpha_of(t), **agents}) as served:
            for op in ("check", "run"):
                found = _refusals(served, list(agents), must_say, op)
                if found:
                    return found
            found = _other_agent_served(served)
            if found:
                return found
            made = [
                c
                for name in agents
                for c in t.lab.client.containers.list(
                    all=True,
                    sparse=True,
                    filters={"label": f"wakeloop.workspace={served.root.resolve() / name / 'workspace'}"},
                )
            ]
            if made:
                return escaped(f"refused asks still made {len(made)} container(s)")
        return held(
            f"{len(asks)} policies over the ceiling's {key} were refused naming {must_say.strip(': ')}, "
            "before any container"
        )

    return attack


def _owner(t: Trial) -> int:
    """The uid "auto" resolves to for a fresh workspace: its owner, or the image's user for root's."""
    from orchestrator.sandbox.engine import SANDBOX_UID

    return t.workspace.stat().st_uid or int(SANDBOX_UID.split(":")[0])


def _owner_range(t: Trial) -> dict:
    """A users range that leaves out the owner of a fresh workspace."""
    return {"users": (_owner(t) + 1, _owner(t) + 100)}


broker_refuses_user_over_ceiling = Probe(
    "broker_refuses_user_over_ceiling",
    CATEGORY,
    "sandbox.user outside the ceiling's uid range, given or as `auto` resolves it, is refused",
    _over_ceiling(
        "users",
        _owner_range,
        [{"user": "auto"}, {"user": "65000:65000"}],
        "sandbox.user: ",
        alpha_of=lambda t: {"sandbox": {"user": f"{_owner(t) + 1}:{_owner(t) + 1}"}},
    ),
)

broker_refuses_env_name_over_ceiling = Probe(
    "broker_refuses_env_name_over_ceiling",
    CATEGORY,
    "a sandbox.env name the ceiling's env_names does not list is refused (names the policy itself "
    "accepts: the loader's, such as LD_PRELOAD, never get this far)",
    _over_ceiling(
        "env_names",
        lambda t: {"env_names": ("LANG", "LC_*")},
        [{"env": {"GIT_SSH_COMMAND": "/workspace/x"}}, {"env": {"LANG": "C", "EDITOR": "/workspace/x"}}],
        "sandbox.env.",
    ),
)

broker_refuses_host_over_ceiling = Probe(
    "broker_refuses_host_over_ceiling",
    CATEGORY,
    "an allow_hosts entry the ceiling's hosts do not cover (another host, a wider wildcard) is refused",
    _over_ceiling(
        "hosts",
        lambda t: {"hosts": ("pypi.org", "*.pythonhosted.org")},
        [
            {"network": "allowlist", "allow_hosts": ["example.org"]},
            {"network": "allowlist", "allow_hosts": ["pypi.org", "*.pypi.org"]},
        ],
        "sandbox.allow_hosts: ",
    ),
)


# -- egress ---------------------------------------------------------------------------


def _allowlist_churn(t: Trial) -> str:
    """Each allow_hosts change makes the agent a new box with a new proxy, netns
    holder and network (the old ones cannot be changed in place). Two changes are
    enough to see whether the retired ones go; no host is ever dialled."""
    from orchestrator.sandbox.egress import egress_plan, network

    lists = [[f"h{i}.wakeloop.test"] for i in range(3)]
    keys: list[str] = []
    try:
        with served_broker(t) as served:
            workspace = (served.root / "alpha/workspace").resolve()
            keys += [egress_plan.plan(workspace, tuple(hosts)).key for hosts in lists]
            for hosts in lists:
                set_agent_policy(
                    served.root / "alpha", {"sandbox": {"network": "allowlist", "allow_hosts": hosts, "pool": 0}}
                )
                reply, seconds = served.ask({"op": "run", "agent": "alpha", "command": "true"}, START_S)
                if not (reply and reply.get("ok")):
                    return f"an allowlist call was not served: {reply}"
            stale = [k for k in keys[:-1] if k in _egress_keys(t.lab.client)]
            if stale:
                return escaped(
                    f"{len(stale)} retired allowlist proxy set(s) of {len(lists) - 1} changes are "
                    "still there: a request loop leaks one per change"
                )
        if _egress_keys(t.lab.client) & set(keys):
            return escaped("closing the broker left its allowlist proxy set behind")
    finally:
        try:
            network.shutdown(t.lab.client, set(keys))  # whatever a leaking broker left: not for the next probe
        except Exception:
            pass  # docker's high-level list can race another process's removals
    return held(f"{len(lists) - 1} allow_hosts changes left one proxy set, and closing the broker none")


def _egress_keys(client) -> set[str | None]:
    """Keys of every allowlist container and network on the engine. The low-level
    lists: no per-object inspect to race with another process's removals."""
    from orchestrator.sandbox.egress import network

    label, key = f"{network.LABEL}=1", f"{network.LABEL}.key"
    found = client.api.containers(all=True, filters={"label": label}) + client.api.networks(filters={"label": label})
    return {(item.get("Labels") or {}).get(key) for item in found}


broker_retires_egress_on_allowlist_churn = Probe(
    "broker_retires_egress_on_allowlist_churn",
    CATEGORY,
    "allow_hosts changed on every request leaves one proxy, holder and network, not one per change",
    _allowlist_churn,
)


def _host_grant(t: Trial) -> str:
    """A person's approval of hosts reaches the broker only as `grant_hosts` on a run, which a
    taken-over orchestrator can send at will. The broker must grant only hosts the agent's own
    policy asks about (its network_host globs) and its ceiling allows; nothing is dialled."""
    from orchestrator.policy.ceiling import Ceiling
    from orchestrator.sandbox.egress import egress_plan, network

    sandbox = {"runtime": t.lab.policy.runtime, "disk": "none", "pool": 0, "network": "allowlist"}
    policy = {
        "sandbox": {**sandbox, "allow_hosts": ["a.wakeloop.test"]},
        "approve": {"rules": [{"network_host": "*.wakeloop.test"}]},
    }
    ceiling = Ceiling(source="the probe's ceiling", hosts=("a.wakeloop.test", "b.wakeloop.test"))
    asks = [["evil.example.org"], ["c.wakeloop.test"], ["*.wakeloop.test"], ["b.wakeloop.test", "evil.example.org"]]
    keys: set[str] = set()
    try:
        with served_broker(t, ceiling, agents={"alpha": policy}) as served:
            workspace = (served.root / "alpha/workspace").resolve()
            plan = egress_plan.plan(workspace, ("a.wakeloop.test",), ask=("*.wakeloop.test",))
            keys |= {plan.key, *(egress_plan.granted(plan, workspace, tuple(h)).key for h in asks)}
            for hosts in asks:
                reply, _ = served.ask({"op": "run", "agent": "alpha", "command": "true", "grant_hosts": hosts}, START_S)
                if reply is None:
                    return escaped(f"granting {hosts}: the broker did not answer within {START_S:g}s")
                output = str((reply.get("result") or {}).get("output", ""))
                if reply.get("ok") and not output.startswith("refused: the approved hosts cannot be granted"):
                    return escaped(f"the broker ran a call granted {hosts}, which its policy or ceiling does not allow")
                if not reply.get("ok") and "grant_hosts: " not in reply["error"]:
                    return escaped(f"granting {hosts}: refused, but not for the grant: {reply['error']:.160}")
            if _egress_keys(t.lab.client) & keys:
                return escaped("refused grants still made an allowlist proxy set")
    finally:
        try:
            network.shutdown(t.lab.client, keys)  # whatever a weakened broker made: not for the next probe
        except Exception:
            pass  # docker's high-level list can race another process's removals
    return held(
        f"{len(asks)} grants of hosts outside the policy's network_host globs or the ceiling's hosts, or a "
        "wildcard, were refused before any container"
    )


broker_grants_only_hosts_policy_and_ceiling_allow = Probe(
    "broker_grants_only_hosts_policy_and_ceiling_allow",
    CATEGORY,
    "a run's grant_hosts (an approved call's hosts) outside the agent's network_host globs or the "
    "ceiling's hosts is refused",
    _host_grant,
)


# -- the workspace's path, raced ---------------------------------------------------------

SWAP_S = 4.0  # how long the workspace is swapped for a symlink while calls run
MIN_RACED = 10  # calls that ran during the swaps, at the least, for a verdict (and for the
# weakened control's escape: a box made while the workspace is a link, then handed a call)
SWAP_MAX_S = 60.0  # the swaps go on past SWAP_S until MIN_RACED calls ran, this long at most


def _swap_workspace(workspace: Path, target: Path, stop: threading.Event, counts: dict) -> None:
    """The attack: the workspace is, for moments, a symlink to `target` (a refill may
    be made in any of them), then itself again; it ends as itself."""
    aside = workspace.with_name("workspace.real")
    while not stop.is_set():
        os.rename(workspace, aside)
        workspace.symlink_to(target, target_is_directory=True)
        time.sleep(0.003)  # the attack's rhythm (not a wait for anything): swapped half the time
        workspace.unlink()
        os.rename(aside, workspace)
        counts["swaps"] += 1
        time.sleep(0.003)


def _pinned_workspace(t: Trial) -> str:
    canary_dir = t.dir / "elsewhere"
    canary_dir.mkdir()
    (canary_dir / "canary.txt").write_text(t.lab.host_canary + "\n")
    policy = {"sandbox": {"runtime": t.lab.policy.runtime, "disk": t.lab.policy.disk or "none", "pool": 2}}
    with served_broker(t, agents={"alpha": policy}) as served:
        look = {"op": "run", "agent": "alpha", "command": "cat /workspace/canary.txt 2>&1; echo looked"}
        first, _ = served.ask(look, START_S)  # the agent's box (and disk) made before the race
        if not (first and first.get("ok")):
            return f"the first call failed: {first}"
        stop, counts = threading.Event(), {"swaps": 0}
        swapper = threading.Thread(
            target=_swap_workspace, args=(served.root / "alpha" / "workspace", canary_dir, stop, counts)
        )
        swapper.start()
        ran, seen, started = 0, 0, time.monotonic()
        try:
            # At least SWAP_S, and at least MIN_RACED calls however slow a loaded engine makes
            # them (a judgement by count, not by the clock), within SWAP_MAX_S.
            while time.monotonic() - started < SWAP_S or (ran < MIN_RACED and time.monotonic() - started < SWAP_MAX_S):
                reply, _ = served.ask(look, START_S)
                output = (reply or {}).get("result", {}).get("output", "")
                ran += "looked" in output
                seen += t.lab.host_canary in output
        finally:
            stop.set()
            swapper.join()
    if seen:
        return escaped(
            f"{seen} of {ran} calls saw the canary of the directory the workspace "
            f"was swapped for ({counts['swaps']} swaps)"
        )
    if ran < MIN_RACED or counts["swaps"] < 10:
        return f"too little raced to judge: {ran} calls, {counts['swaps']} swaps"
    return held(
        f"{ran} calls during {counts['swaps']} swaps of the workspace for a symlink: "
        "none saw the canary (the box names its workspace by device)"
    )


pins_workspace_against_symlink_swap = Probe(
    "pins_workspace_against_symlink_swap",
    CATEGORY,
    "swapping an agent's workspace for a symlink while calls and pool refills run never mounts the target",
    _pinned_workspace,
)


PROBES = [
    broker_refuses_yaml_alias_bomb,
    broker_refuses_fifo_policy,
    broker_refuses_device_or_huge_policy,
    broker_refuses_symlinked_agent_dir,
    broker_bounds_its_log_lines,
    broker_bounds_silent_connections,
    broker_bounds_calls_in_flight,
    broker_refuses_user_over_ceiling,
    broker_refuses_env_name_over_ceiling,
    broker_refuses_host_over_ceiling,
    broker_retires_egress_on_allowlist_churn,
    broker_grants_only_hosts_policy_and_ceiling_allow,
    pins_workspace_against_symlink_swap,
]
