"""The lab every probe runs in: the probe, the trial (its throwaway agent and box), the one rule
that judges it, the runner.

A probe is an attack plus the safe outcome it expects. It returns what it
observed as text; lines starting `ESCAPED` or `HELD` are its findings. Every
probe is judged by `verdict` and nothing else.

Each probe gets a throwaway agent directory (workspace/, state/, mandate.md)
under the lab's temp dir, so an attack that fills or plants things in its
workspace cannot disturb the next probe or anyone's real agent. Canaries are
planted on the host outside every workspace; finding one is a breach.

A trial's cleanup never ends the run: on a busy host another mount namespace
may hold a copy of its disk's mount (a lab's node started meanwhile), and the
disk cannot be detached. What it could not undo is the probe's `left` (what,
and the commands that release it), the probe is INCONCLUSIVE, its folder is
kept for `wakeloop disk rm`, and the next probe runs.

Not here: the probes (one module per category), the report (report.py), the
command (command.py).
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import docker
import yaml

from orchestrator.broker.client import BrokerSandbox
from orchestrator.policy.agent import init_agent
from orchestrator.policy.schema import SandboxPolicy, Tools
from orchestrator.records import health
from orchestrator.sandbox.box import SandboxError, SandboxResult
from orchestrator.sandbox.disks import disk, disk_attach, disk_holders, disk_index, disk_survey
from orchestrator.sandbox.egress import egress_plan, network
from orchestrator.sandbox.engine import DockerSandbox

HELD, ESCAPED, INCONCLUSIVE = "HELD", "ESCAPED", "INCONCLUSIVE"

PROBE_TIMEOUT_S = 30  # a probe is a few syscalls (~1 s); 30 s leaves room on a loaded 2-core CI box
OBSERVE_CHARS = 20_000  # output kept per probe call; findings are printed last, so they survive in the tail
OBSERVED_SHOWN = 160  # chars of the deciding line shown in the table


@dataclass(frozen=True)
class Probe:
    name: str  # named for the attack it blocks
    category: str
    expected: str  # the safe outcome, in words
    attack: Callable[[Trial], str]  # runs the attack, returns what it observed


@dataclass(frozen=True)
class Outcome:
    probe: str
    category: str
    expected: str
    observed: str
    verdict: str
    seconds: float
    left: str = ""  # what the trial's cleanup could not undo, and the commands that release it


@dataclass(frozen=True)
class Leftover:
    """One thing a trial's cleanup could not undo."""

    failed: str  # the step and why, in one line
    left: str  # what is left on the host, and the commands that release it
    folder: Path | None = None  # the agent folder of a disk left: kept, for `wakeloop disk rm`


def verdict(observation: str) -> tuple[str, str]:
    """The one rule. If — and only if — a line of the observation starts with
    `ESCAPED` we consider the sandbox breached. Otherwise it held only if a line
    starts with `HELD`: the probe's proof that it ran to its end and saw the safe
    outcome. Neither (the attack never ran, crashed, or printed nothing) is
    INCONCLUSIVE, which the report counts as a failure too: silence proves nothing.
    Returns (verdict, the deciding line)."""
    lines = [line.strip() for line in observation.splitlines()]
    breach = [_finding(line) for line in lines if line.startswith(ESCAPED)]
    if breach:
        return ESCAPED, "; ".join(breach)[:OBSERVED_SHOWN]
    held = [_finding(line) for line in lines if line.startswith(HELD)]
    if held:
        return HELD, held[-1][:OBSERVED_SHOWN]
    tail = " | ".join(line for line in lines if line)[-OBSERVED_SHOWN:]
    return INCONCLUSIVE, tail or "(no output)"


def _finding(line: str) -> str:
    """'ESCAPED: why' -> 'why' (the verdict column already says which)."""
    return line.split(":", 1)[1].strip() if ":" in line else line


def held(why: str) -> str:
    return f"HELD: {why}\n"


def escaped(why: str) -> str:
    return f"ESCAPED: {why}\n"


# Python run inside the box before each python probe: the same two finding
# printers, and raw syscalls by number (x86_64 and aarch64) for calls that
# glibc does not wrap.
PRELUDE = r'''
import ctypes, errno, os, socket, sys
def held(why): print("HELD:", why, flush=True)
def escaped(why): print("\nESCAPED:", why, flush=True)   # on a line of its own, whatever came before
libc = ctypes.CDLL(None, use_errno=True)
_NR = {"x86_64": dict(add_key=248, keyctl=250, bpf=321, perf_event_open=298, io_uring_setup=425,
                      init_module=175, finit_module=313, delete_module=176, pivot_root=155,
                      unshare=272, setns=308, ptrace=101, open_tree=428, fsopen=430),
       "aarch64": dict(add_key=217, keyctl=219, bpf=280, perf_event_open=241, io_uring_setup=425,
                       init_module=105, finit_module=273, delete_module=106, pivot_root=41,
                       unshare=97, setns=268, ptrace=117, open_tree=428, fsopen=430)}
NR = _NR.get(os.uname().machine)
if NR is None:
    print("cannot probe: unknown architecture", os.uname().machine); sys.exit(0)
def call(name, *args):
    """(return value, errno name) of a raw syscall."""
    r = libc.syscall(NR[name], *args)
    return r, errno.errorcode.get(ctypes.get_errno(), "?") if r < 0 else "ok"
def open_for_writing(paths):
    """Those of `paths` that open for writing: opened, never written."""
    opened = []
    for path in paths:
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            continue
        os.close(fd); opened.append(path)
    return opened
'''


class _NoEngine:
    """The engine of a lab whose boxes a broker makes: a probe that reads it is one a broker
    cannot run, and says so (INCONCLUSIVE), rather than reading this host's engine."""

    def __getattr__(self, name: str):
        raise SandboxError(f"this probe reads the engine ({name}), which is the broker's, not this process's")


NO_ENGINE = cast(docker.DockerClient, _NoEngine())


@dataclass
class Lab:
    """Where probes run: an engine, a sandbox policy, a temp dir for throwaway agents.
    `sandbox_class` lets a test swap in a deliberately weakened box."""

    client: docker.DockerClient  # NO_ENGINE through a broker: its engine is not this process's to see
    policy: SandboxPolicy
    base: Path
    sandbox_class: type = DockerSandbox
    tools: Tools = field(default_factory=Tools)  # the policy's tools, for the harness probes
    # A broker's address: each trial is an agent directly under `base` (the broker's ROOT), paused
    # (serve wakes none), its policy `agent_policy` in its agent.yaml, its box a BrokerSandbox.
    broker: str | None = None
    agent_policy: object = field(default_factory=dict)
    policy_source: str = "the default policy"  # for the report
    run_id: str = field(default_factory=lambda: "escapes-" + secrets.token_hex(4))
    host_canary: str = field(default_factory=lambda: "wakeloop-canary-" + secrets.token_hex(8))
    other_canary: str = field(default_factory=lambda: "wakeloop-other-agent-" + secrets.token_hex(8))

    def __post_init__(self):
        self.kept: list[Path] = []  # trials' folders whose disk is left, for `wakeloop disk rm`
        self.base = Path(self.base).resolve()
        self.base.mkdir(parents=True, exist_ok=True)
        # Under a broker's ROOT the lab's own files go in a folder no agent.yaml marks as an agent.
        self.home = self.base / f".{self.run_id}" if self.broker else self.base
        self.home.mkdir(exist_ok=True)
        # Host files outside every probe's workspace: a secret beside the agents,
        # and another agent's memory. No probe may ever read either.
        self.canary_path = self.home / "host-secret.txt"
        self.canary_path.write_text(self.host_canary + "\n")
        self.canary_path.chmod(0o644)  # readable to anyone on the host: only isolation protects it
        # Written before init_agent, which keeps it and, as root, hands the workspace to the
        # sandbox's user: root without CAP_DAC_OVERRIDE (compose's) could not write it after.
        core = self.home / "other-agent/workspace/memory/core.md"
        core.parent.mkdir(parents=True)
        core.write_text(f"# other agent\n{self.other_canary}\n")
        self.other_workspace = init_agent(core.parents[2]) / "workspace"

    def trial(self, name: str) -> Trial:
        return Trial(self, name)

    def close(self) -> None:
        """Remove the lab's files (its trials remove their own): all of `base` but a broker's ROOT,
        and but the folders kept for a disk left (Trial.cleanup), which name them."""
        if not self.kept:
            _remove_tree(self.home)
            return
        for child in self.home.iterdir():
            if not any(child == kept or child in kept.parents for kept in self.kept):
                _remove_tree(child)
        if not any(self.home.iterdir()):
            self.home.rmdir()


class Trial:
    """One probe's own agent directory and box."""

    def __init__(self, lab: Lab, name: str):
        self.lab = lab
        if lab.broker:
            self.dir = init_agent(lab.base / f"{lab.run_id}-{name}")
            set_agent_policy(self.dir, lab.agent_policy)
            health.set_paused(self.dir / "state", True)  # a trial, not an agent serve should wake
        else:
            self.dir = init_agent(lab.base / name)
        self._disks_before = disk_survey.keys()
        self.workspace = self.dir / "workspace"
        self.state = self.dir / "state"
        self._boxes: list[DockerSandbox | BrokerSandbox] = []
        self._box: DockerSandbox | None = None
        self.left: list[Leftover] = []  # what cleanup could not undo
        self._cleaned = False

    @property
    def box(self) -> DockerSandbox:
        """The trial's box, made at first use: a probe of the surfaces around the box
        (the console, notifications, the files kept) never pays for one."""
        if self._box is None:
            try:
                self._box = self.new_box()
            except Exception:
                self.cleanup()  # a box that failed halfway (its proxy, say) may have made a disk
                raise
        return self._box

    def new_box(self, policy: SandboxPolicy | None = None, workspace: Path | None = None, **kwargs) -> DockerSandbox:
        """A box on this trial's workspace (or `workspace`) under the lab's policy (its
        warm pool included, as users run it), or under `policy`, for a probe whose
        attack is a policy author's; `warm=0` for one whose every call is cold. Through a
        broker, only the trial's own box: the broker reads its policy from agent.yaml."""
        if self.lab.broker:
            if policy or workspace or kwargs:
                raise SandboxError("this probe sets its own box, which a broker does not take from the wire")
            remote = BrokerSandbox(self.lab.broker, self.dir.name)
            self._boxes.append(remote)
            # Typed as the local box the probes read: those run through a broker
            # (registry.THROUGH_A_BROKER) use only run and write, which both have.
            return cast(DockerSandbox, remote)
        box = self.lab.sandbox_class(
            workspace or self.workspace,
            policy or self.lab.policy,
            agent="escapes",
            run_id=self.lab.run_id,
            client=self.lab.client,
            **kwargs,
        )
        self._boxes.append(box)
        return box

    def run(self, command: str, timeout_s: float = PROBE_TIMEOUT_S, cap: int = OBSERVE_CHARS) -> SandboxResult:
        return self.box.run(command, timeout_s=timeout_s, max_output_chars=cap)

    def sh(self, command: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
        return observed(self.run(command, timeout_s))

    def py(self, program: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
        return observed(self.run(python_command(program), timeout_s))

    def close(self) -> None:
        """Close every box (their idle warm containers go; a broker's, at its next sweep once the
        trial is gone); the workspace stays."""
        for box in self._boxes:
            if isinstance(box, BrokerSandbox):
                box.wind_down()
            else:
                box.close()

    def containers(self) -> list:
        """This trial's sandbox containers now. Sparse: one listing, no per-container
        lookup that a container removed meanwhile would turn into NotFound."""
        return self.lab.client.containers.list(
            all=True, sparse=True, filters={"label": f"wakeloop.workspace={self.box.workspace}"}
        )

    def containers_left(self) -> list:
        """Those still there once every box is closed (idle warm ones are theirs until then)."""
        self.close()
        return self.containers()

    def cleanup(self) -> None:
        """Close the boxes, retire the trial's proxies and disks, remove its folder; once. Never
        raises (a busy host must not end the run): what it could not undo is in `left`, and
        the folder of a disk left stays (the lab keeps it), for `wakeloop disk rm` later."""
        if self._cleaned:
            return
        self._cleaned = True
        containers = f"`docker ps -a --filter label=wakeloop.workspace={self.workspace}` lists what is left"
        self._undo("closing its boxes", containers, self.close)
        if self.lab.client is not NO_ENGINE:
            self._undo("removing its allowlist proxies", containers, self._retire_egress)
            for key in self._new_disks():
                self._release_disk(key)
        kept = [leftover.folder for leftover in self.left if leftover.folder]
        self.lab.kept += kept
        if not any(folder == self.dir or self.dir in folder.parents for folder in kept):
            _remove_tree(self.dir)

    def _new_disks(self) -> list[str]:
        """The disks made since this trial began for a folder of its own (its agent's, a broker's
        under it) or of the lab's (the other agent): never a real agent's, whose first disk may be
        made meanwhile on a busy host (under a broker the lab's base is the agents' ROOT)."""
        index, ours = disk_index.read_index(), (self.dir.resolve(), self.lab.home.resolve())
        made = []
        for key in sorted(disk_survey.keys() - self._disks_before):
            folder = index.get(key, {}).get("folder")
            where = Path(folder).resolve() if isinstance(folder, str) else None
            if where is not None and any(where == mine or mine in where.parents for mine in ours):
                made.append(key)
        return made

    def _undo(self, what: str, hint: str, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception as exc:  # reported with the probe, never raised: the run goes on
            failed = f"{what} failed: {_first_line(exc)}"
            self.left.append(Leftover(failed, f"{failed}; {hint}"))

    def _retire_egress(self) -> None:
        # Each trial is an agent of its own, so under an allowlist policy it has a
        # proxy set of its own: retired with it, or a run exhausts the engine's
        # address pools (~30 networks) before its last probe.
        docker_boxes = [b for b in self._boxes if isinstance(b, DockerSandbox)]
        egress = {
            egress_plan.plan_for(b.workspace, b.policy).key for b in docker_boxes if b.policy.network == "allowlist"
        }
        if egress:
            network.shutdown(self.lab.client, egress, shared=False)

    def _release_disk(self, key: str) -> None:
        try:
            disk_attach.release(self.lab.client, key, delete=True, force=True)  # ours, whoever holds it
        except Exception as exc:  # a copy of its mount in another namespace, say: named below
            folder = self._folder_of(key)
            self.left.append(
                Leftover(f"releasing its disk failed: {_first_line(exc)}", self._disk_left(key, folder), folder)
            )

    def _folder_of(self, key: str) -> Path:
        """The agent folder whose disk `key` is (the index's last sighting), else the trial's."""
        try:
            seen = disk_index.read_index().get(key, {}).get("folder")
        except disk.DiskError:
            seen = None
        return Path(seen) if isinstance(seen, str) and seen else self.dir

    def _disk_left(self, key: str, folder: Path) -> str:
        """The disk left, who holds it, and the commands that let go of it."""
        devices = disk_survey.devices(key)
        holders = disk_holders.holders(devices)
        where = f" on {', '.join(devices)}" if devices else ""
        held = "; ".join(h.describe() for h in holders) or "held by no mount namespace found now"
        first = "".join(f"`{h.release()}` (or end pid {h.pid}), " for h in holders)
        named = shlex.quote(str(folder))
        return (
            f"the disk {disk.path_of(key, 'img')} of {folder}{where} ({held}); to release it: {first}"
            f"then `wakeloop disk rm {named} --yes` and `rm -r {named}`"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _remove_tree(path: Path) -> None:
    # rm, not shutil.rmtree: probes leave trees deeper than Python's recursion limit
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def set_agent_policy(agent_dir: Path, policy: object) -> None:
    """agent.yaml's `policy:` set to `policy` (inline, or a file's name)."""
    config = agent_dir / "agent.yaml"
    data = yaml.safe_load(config.read_text())
    data["policy"] = policy
    config.write_text(yaml.safe_dump(data))


def python_command(program: str) -> str:
    """A bash line that runs `program` (after PRELUDE) with python3 in isolated mode.
    HOST_KERNEL is the host's kernel release: a box whose uname differs runs on a
    user-space kernel (gVisor), so its syscalls never reach the host's."""
    host = f"HOST_KERNEL = {os.uname().release!r}\n"
    return "python3 -I -c " + shlex.quote(
        PRELUDE + host + "ON_HOST_KERNEL = os.uname().release == HOST_KERNEL\n" + program
    )


def observed(result: SandboxResult) -> str:
    """The output, plus what the host knows about the call, for the report."""
    notes = []
    if result.timed_out:
        notes.append("the call was killed at its deadline")
    if result.oom_killed:
        notes.append("the call was killed: out of memory")
    suffix = f"\n[host: exit {result.exit_code}{'; ' if notes else ''}{'; '.join(notes)}]"
    return result.output + suffix


def run_probe(lab: Lab, probe: Probe) -> Outcome:
    started = time.monotonic()
    trial = None
    try:
        trial = lab.trial(probe.name)
        observation = probe.attack(trial)
    except Exception as exc:  # a probe that crashes the harness is a finding, shown, not raised
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        observation = f"the probe failed on the host: {type(exc).__name__}: {first_line}"
    finally:
        if trial is not None:
            trial.cleanup()
    decided, line = verdict(observation)
    left = trial.left if trial is not None else []
    if left and decided != ESCAPED:  # an escape stays one; a probe that left the host changed proves less
        decided, line = INCONCLUSIVE, f"its cleanup failed: {left[0].failed}"[:OBSERVED_SHOWN]
    seconds = round(time.monotonic() - started, 2)
    return Outcome(probe.name, probe.category, probe.expected, line, decided, seconds, _left_text(left))


def _left_text(left: list[Leftover]) -> str:
    return "; ".join(leftover.left for leftover in left)


def run_suite(lab: Lab, probes, progress: Callable[[int, int, Outcome], None] | None = None) -> list[Outcome]:
    outcomes = []
    for index, probe in enumerate(probes, 1):
        outcome = run_probe(lab, probe)
        outcomes.append(outcome)
        if progress:
            progress(index, len(probes), outcome)
    return outcomes


def temp_lab(client: docker.DockerClient, policy: SandboxPolicy, base: Path | None = None, **kwargs) -> Lab:
    """A lab in `base`, or in a new temp dir the caller removes (lab.base)."""
    base = Path(base) if base else Path(tempfile.mkdtemp(prefix="wakeloop-escapes-"))
    return Lab(client=client, policy=policy, base=base, **kwargs)


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    """Poll `condition` until it holds or `seconds` pass (no blind sleep): the probes' hand-offs with a box."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


def paths_under(top: Path) -> set[str]:
    """Every path under `top`, by find(1): a probe's trees are deeper than Python's recursion."""
    out = subprocess.run(["find", str(top), "-xdev"], capture_output=True, text=True, check=False).stdout
    return set(out.splitlines())
