"""The sandbox: every tool call in a fresh, hardened, disposable container.

One call, one container: created from fixed settings, attached before start
so no output is lost, killed from the host at its deadline, removed whatever
happens (success, failure, timeout, OOM, an exception here, Ctrl-C). The
container sees one mount, the agent's workspace, and an environment built
from scratch. Exit status and OOM come from the engine, or for a pooled
container from its launcher on a line the command cannot forge (pool.py)
and a count of OOM kills the kernel keeps (read in the box under runc, on
the host under gVisor: oom.py); never from anything the command prints.

Not here: which tools exist and whether a call is allowed (tools.py, the
policy), or what the output means (the model decides); the engine's client
(engine_client.py), a box's attached stream (box_stream.py), the disk
(disk_attach.py), a wake's overlay (wake_layer.py), the allowlist (network.py).
"""

from __future__ import annotations

import atexit
import secrets
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Self

import docker
import docker.errors
from docker.types import LogConfig, Mount, Ulimit
from docker.utils.socket import frames_iter

from orchestrator import metrics
from orchestrator.policy.paths import check_write_path
from orchestrator.policy.schema import SandboxPolicy
from orchestrator.records import stopswitch
from orchestrator.sandbox import change_set
from orchestrator.sandbox.box import TIMEOUT_EXIT, WORKSPACE, Files, SandboxError, SandboxResult, no_room, refused
from orchestrator.sandbox.containers import editor_request, engine_client, oom
from orchestrator.sandbox.containers.box_stream import ATTACH_PARAMS, Attached, await_line, raw_socket, send_stdin
from orchestrator.sandbox.containers.deadline import KILL_GRACE_S, Deadline
from orchestrator.sandbox.containers.engine_client import check_image, connect, first_line
from orchestrator.sandbox.containers.engine_shapes import ContainerConfig, ContainerState, HostConfig, Inspected
from orchestrator.sandbox.containers.output import Capture
from orchestrator.sandbox.containers.pool import AHEAD, EndLine, WarmPool, handoff
from orchestrator.sandbox.containers.programs import (
    COMMAND_ENV,
    GUARD,
    GUARD_ENV,
    HELD,
    LAUNCH_ARGV,
    LAUNCHER,
    LAUNCHER_ENV,
    READY_LINE,
    carried,
    command_argv,
    edit_argv,
    guarded,
    write_argv,
)
from orchestrator.sandbox.disks import disk, disk_attach, disk_index, disk_room
from orchestrator.sandbox.disks.workspace_reads import HostFiles
from orchestrator.sandbox.egress import egress_plan, netns, network
from orchestrator.sandbox.egress.egress_plan import grant_refusal
from orchestrator.sandbox.wakes import wake_layer

Grant = tuple[egress_plan.Egress, str]  # an approved call's own proxy plan, and its CA (or "")


SANDBOX_UID = "1000:1000"  # the image's unprivileged user, used when the workspace is root's
LABEL = "wakeloop.sandbox"  # on every container we create; the cleanup filter
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV = {"PATH": PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}  # ours, and the command's before the policy's env


def resolve_user(setting: str, workspace: Path) -> str:
    """'auto' is the workspace owner, so files on the host belong to whoever owns the
    workspace; never uid 0, which falls back to the image's unprivileged user."""
    if setting != "auto":
        return setting
    st = workspace.stat()
    return SANDBOX_UID if st.st_uid == 0 else f"{st.st_uid}:{st.st_gid}"


class DockerSandbox:
    """A Sandbox on the local Docker engine: one new container per call.

    With `pool` > 0 in the policy, calls take a container that was created and
    started ahead of time from the same settings (pool.py); close() removes them.
    """

    def __init__(
        self,
        workspace: Path,
        policy: SandboxPolicy,
        *,
        agent: str = "agent",
        run_id: str | None = None,
        client: docker.DockerClient | None = None,
        warm: int | None = None,
        host_path: Path | None = None,
        private_view: bool = False,
        attach: bool = True,
        folder: Path | None = None,
        host_folder: Path | None = None,
        within: Path | None = None,
        identity: disk_index.Identity | None = None,
        overcommit: float = disk_room.OVERCOMMIT,
        ahead_at_begin: bool = False,
        engine_mounts: bool = False,
    ):
        """`host_path`: the workspace's path on the host, if this process sees it elsewhere.
        The agent's disk belongs to `folder` (the agent folder; by default the
        workspace's parent), by its identity (disk_index.py); `host_folder` is where the host
        sees it, for the index's record; `within` (the broker's ROOT) the filesystem it
        must be on; `identity` the folder's identity if the caller took it already.
        The disk is mounted over the workspace folder, where a person looks, or with
        `private_view` (the broker, whose workspace folders the orchestrator can
        rename) at a path of its own. `attach=False` plans the disk without
        making or mounting it, nor the allowlist's proxy (`policy explain`). close() lets go of the disk: it is
        released (unmounted, detached; the image kept) unless another holder has it.
        `overcommit`: the disks' sizes together stay within this many times their
        filesystem's size (the broker's ceiling says; disk_room.OVERCOMMIT otherwise).
        `engine_mounts`: the engine mounts the disk and each wake's overlay itself (a broker
        whose own mounts the engine cannot see: engine_mounts.py)."""
        self._given_workspace = Path(workspace).absolute()
        self.workspace = self._given_workspace.resolve()
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} does not exist; create it with `wakeloop init`")
        self.policy = policy
        self.agent = agent
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.begun: str | None = None  # the wake begun and not yet finished (begin, finish)
        self.client = connect(client)
        self.warning = check_image(self.client, policy.image)
        self._host_path = host_path or self.workspace
        self._private_view = private_view
        self.folder = Path(folder) if folder else self.workspace.parent
        self._host_folder = host_folder or self.folder
        self._within = within
        self.identity = identity
        self._overcommit = overcommit
        self._engine_mounts = engine_mounts
        self._ahead_at_begin = ahead_at_begin  # a wake's box: on a disk, nothing made before begin
        self.pool = None
        self._warm = policy.pool if warm is None else warm
        self.wake: str | None = None  # the run whose overlay the boxes mount now (wake_layer.py)
        self._layer = 0  # counts what KEY.box has shown: in the pool's settings key
        self.release_problem: str | None = None  # why close() could not release the disk
        self._egress_ca = ""  # the allowlist proxy's CA certificate, when it intercepts a host
        self._granted_decisions: list[dict[str, Any]] = []  # approved calls' proxies', gone with them
        self.wake_began = time.time()  # since when egress_decisions reads the proxy's record
        self.disk = self._attach_disk(policy, attach)
        self._attach = attach
        self._netns: netns.Holder | None = None
        try:
            self._egress_plan = self._plan_egress(policy)
            self._netns = self._netns_for(policy)
            self.user = resolve_user(policy.user, self.view)
            if policy.network == "allowlist" and attach:
                self._start_egress()
        except BaseException:
            self.close()  # the disk attached above is let go
            raise
        self._oom_files: dict[str, Path | None] = {}  # warm container -> its host-side OOM count (oom.py)
        self._attached: dict[str, Attached] = {}  # warm container -> the socket attached to it since before its start
        self.pool = self._new_pool()
        if self.pool or (self.disk and self.disk.hold):
            atexit.register(self.close)  # a safety net; callers close() when done

    def _start_egress(self) -> None:
        """The allowlist's proxy and netns holder, started on demand; the wake's record begins now."""
        assert self._egress_plan is not None  # started only under an allowlist, whose plan it is
        try:
            self._egress_ca = network.ensure(self.client, self._egress_plan)
        except egress_plan.NetworkError as exc:
            raise SandboxError(str(exc)) from None
        self.wake_began = network.new_wake(self.client, self._egress_plan)

    def _new_pool(self) -> WarmPool | None:
        if self._warm <= 0:
            return None
        return WarmPool(
            self._warm,
            key=self._settings_key,
            make=self._make_warm,
            remove=self._remove,
            alive=self._running,
            pace=engine_client.pace(self.client, self.policy.runtime),
            # A wake's calls bind its overlay, mounted at begin: a container made before would go unused.
            ahead=0 if self._waits_for_begin else AHEAD,
        )

    @property
    def _waits_for_begin(self) -> bool:
        """A wake's box on a disk: its calls bind the wake's overlay, mounted at begin, so a
        container made before would go unused (the fleet's containers per call stay 1.00)."""
        return self._ahead_at_begin and self.disk_root is not None

    def close(self) -> None:
        """Remove every container this sandbox made; idle pool containers included.
        Then lets go of the disk (after the pool: no container of ours still has its volume).
        A wake begun and not finished stays on the disk: the next begin() discards it."""
        if self.pool:
            self.pool.close()
        if self._netns:  # after the pool: no box of ours is in its namespace
            self._netns.close()
        if self.wake and self.disk and self.disk.hold:
            try:
                disk_attach.unmount_wake(self.disk)
            except disk.DiskError:
                pass  # let_go's release says so
            self.wake = None
        if self.disk and self.disk.hold:
            self.release_problem = disk_attach.let_go(self.client, self.disk) or self.release_problem
        atexit.unregister(self.close)

    def wind_down(self) -> None:
        """The wake expects no more calls but perhaps its journal's stub: the pool makes
        no more containers ahead (each would be removed unused)."""
        if self.pool:
            self.pool.wind_down()

    def rearm(self) -> None:
        """A wake starts on this box (the broker keeps one per agent): one container ahead (on a
        disk at begin, once the wake's overlay is there), and the proxy's byte budget
        starts again."""
        if self.pool and self.disk_root is None:  # on a disk: at begin
            self.pool.rearm()
        self._egress_anew()

    def _egress_anew(self) -> None:
        """A wake starts: the proxy's byte budget starts again, and its decisions are this wake's."""
        egress = self._egress()
        if egress:
            self.wake_began = network.new_wake(self.client, egress)

    def egress_decisions(self) -> list[dict[str, Any]]:
        """The allowlist proxy's decisions since this wake began, tagged with the run id
        (network.decisions); [] without an allowlist."""
        egress = self._egress()
        granted, self._granted_decisions = self._granted_decisions, []
        return (network.decisions(self.client, egress, self.wake_began, self.run_id) + granted) if egress else []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- a wake as a transaction (wake_layer.py) ---------------------------------

    def begin(self, run_id: str) -> change_set.Settled:
        """The wake `run_id` starts: what earlier wakes left is settled, then every box from
        now on mounts this wake's overlay; the pool's containers made before go unused
        (_layer_changed). No disk: nothing to do."""
        self.begun = run_id  # until finish, with or without an overlay
        if run_id != self.run_id:  # a kept box (the broker's): a wake other than the one it was made for
            self.run_id = run_id
            self._egress_anew()
        if self.disk is None or self.disk_root is None:  # no disk
            return change_set.Settled()
        settled = wake_layer.begin(self.disk, run_id)
        self.wake = run_id
        self._layer_changed()
        if self.pool:
            self.pool.rearm()  # the first container ahead binds the overlay
        return settled

    def finish(self, protect: tuple[str, ...] = (), protect_git: bool = True) -> change_set.WakeChanges:
        """The wake ends, whatever its receipt (its calls are over): its overlay unmounted, its
        changes checked against the policy, committed or dropped (wake_layer.finish)."""
        run_id, self.wake, self.begun = self.wake, None, None
        egress = self._egress()
        if egress:  # the wake's calls are over: their decisions all in the proxy's log before they are read
            network.settle(self.client, egress, self.wake_began)
        if run_id is None or not (self.disk and self.disk.hold):
            return change_set.WakeChanges(self.run_id)
        try:
            disk_attach.unmount_wake(self.disk)  # first: no container made from now on binds it
        except disk.DiskError as exc:
            return change_set.WakeChanges(run_id, error=f"the wake's changes were not committed: {exc}")
        self._layer_changed()
        return wake_layer.finish(self.disk, run_id, protect, protect_git)

    def _layer_changed(self) -> None:
        """What KEY.box shows changed (a wake's overlay mounted or unmounted): the pool's idle
        containers bind what it showed before, so they go, and one being made now is not
        kept (the settings key names the change). Idle, they run no command of the agent's."""
        self._layer += 1
        if self.pool:
            self.pool.drain()

    @property
    def disk_root(self) -> Path | None:
        """The disk's root as this process sees it (files/ and .wakeloop/: layers.py), or None."""
        return self.disk.view if self.disk and self.disk.hold else None

    @property
    def view(self) -> Path:
        """Where this process reads the workspace: the running wake's overlay, the disk's
        files/, or the folder."""
        if self.disk and self.wake:
            return self.disk.box
        if self.disk and self.disk.hold is None:  # planned, not attached (`policy explain`): the folder
            return self.workspace
        return self.disk.files if self.disk else self.workspace

    def files(self) -> Files:
        if self.disk and self.wake and self.disk.engine_root is not None:
            return wake_layer.LayerFiles(self.disk, self.wake)
        return HostFiles(self.view)

    def _attach_disk(self, policy: SandboxPolicy, attach: bool = True) -> disk.Disk | None:
        if not policy.disk:
            return None
        if not attach:  # planned: the folder's disk if it has one, else what a new one would be
            key = disk_index.lookup(self.folder) or disk_index.legacy_key(self.agent, self._host_path)
            return disk.Disk(key, disk.path_of(key, "img"), "/dev/loopN", disk.path_of(key, "view"))
        disk_attach.require()  # before the index (root's) is read or locked
        self.identity = self.identity or disk_index.identity_of(self.folder, within=self._within)
        if not self._private_view and self._given_workspace.is_symlink():
            # Mounted over a real workspace folder only: never over one a link names
            # (another agent's workspace, where its own disk is mounted).
            raise disk.DiskError(
                f"sandbox.disk: {self._given_workspace} is a link (to {self.workspace}); "
                "a disk is mounted only over a real workspace folder: make it one"
            )
        key = disk_index.claim(
            self.folder,
            agent=self.agent,
            host_workspace=self._host_path,
            host_folder=self._host_folder,
            within=self._within,
            identity=self.identity,
        )
        made = disk_attach.attach(
            self.client,
            key=key,
            size=policy.disk,
            files=policy.files,
            seed=self.workspace,
            person=None if self._private_view else self.workspace,
            overcommit=self._overcommit,
            engine_mounts_in=policy.image if self._engine_mounts else None,
        )
        if made.note:
            self.warning = "; ".join(filter(None, (self.warning, made.note)))
        return made

    def update_policy(self, policy: SandboxPolicy) -> None:
        """New settings for the calls to come; idle containers made under the old ones go."""
        if (policy.disk, policy.files) != (self.policy.disk, self.policy.files):
            old = self.disk
            self.disk = self._attach_disk(policy)  # grown, or made
            if old and old.hold:
                if self.disk and self.disk.key == old.key:
                    old.hold.drop()  # the same disk, held anew
                else:
                    if self.pool:
                        self.pool.drain()  # its idle containers mount the old disk's volume
                    self.release_problem = disk_attach.let_go(self.client, old) or self.release_problem
        self._egress_plan = self._plan_egress(policy)
        self.policy = policy
        self.user = resolve_user(policy.user, self.view)
        if self.pool:
            self.pool.drain()
        wanted = self._netns_for(policy)
        if self._netns and not wanted:  # after the drain: no idle box of ours is in its namespace
            self._netns.close()
        self._netns = wanted

    def _netns_for(self, policy: SandboxPolicy) -> netns.Holder | None:
        """The empty namespace this sandbox's boxes share, where their runtime gives each a
        network stack of its own (netns.py); None: each box gets its own, from the engine."""
        if not self._attach or policy.network != "none" or not netns.own_stack(self.client, policy.runtime):
            return None
        return self._netns or netns.Holder(self.client, self.workspace, policy.image)

    # -- the two calls -------------------------------------------------------

    def run(
        self, command: str, timeout_s: float, max_output_chars: int, grant_hosts: tuple[str, ...] = ()
    ) -> SandboxResult:
        """`grant_hosts`: a call a person approved (approve.rules network_host) runs with these
        hosts allowed too, through a proxy of its own (_granted_run). Otherwise, under a policy
        that asks about hosts, the result names those the proxy asked about (network.asked)."""
        if grant_hosts:
            return self._granted_run(command, timeout_s, max_output_chars, grant_hosts)
        began = time.time()
        result = self._call(command_argv(command), None, timeout_s, max_output_chars, command_env=self.command_env())
        egress = self._egress()
        if egress and egress.ask and result.container_id:
            return replace(result, asked_hosts=network.asked(self.client, egress, began))
        return result

    def _granted_run(
        self, command: str, timeout_s: float, max_output_chars: int, hosts: tuple[str, ...]
    ) -> SandboxResult:
        """One approved call with `hosts` allowed: each must be an IP-free name a network_host glob
        of the policy as it stands covers (the broker checks the ceiling too). Its proxy, network
        and holder are made for it and removed after it; its decisions join the wake's record."""
        refusal = grant_refusal(self.policy, hosts)
        if refusal:
            return refused(f"the approved hosts cannot be granted: {refusal}")
        egress = self._egress()
        assert egress is not None  # an allowlist's plan: grant_refusal refuses any other network
        grant = egress_plan.granted(egress, self.workspace, hosts)
        began = time.time()
        try:
            ca = network.ensure(self.client, grant)
            result = self._call(
                command_argv(command),
                None,
                timeout_s,
                max_output_chars,
                command_env=self.command_env(grant),
                grant=(grant, ca),
            )
            network.settle(self.client, grant, began)  # its proxy goes next: its decisions are read now
            self._granted_decisions += network.decisions(self.client, grant, began, self.run_id)
            return result
        except egress_plan.NetworkError as exc:
            raise SandboxError(str(exc)) from None
        finally:
            network.shutdown(self.client, {grant.key}, shared=False)

    def write(
        self, path: str, content: bytes, timeout_s: float = 30, append: bool = False, protect_git: bool = True
    ) -> SandboxResult:
        reason = check_write_path(path)
        if reason:
            return refused(reason)
        # The write script is ours: it never gets the policy's environment.
        return self._call(write_argv(path, append, protect_git), content, timeout_s, 4096, workdir="/")

    def edit(
        self,
        tool: str,
        args: dict[str, Any],
        timeout_s: float,
        max_bytes: int,
        max_chars: int,
        protect_git: bool = True,
    ) -> SandboxResult:
        """One text editor or memory call (editor_request.py), run by our edit program under our environment."""
        request = editor_request.build(tool, args, max_bytes, max_chars, protect_git)
        if isinstance(request, str):
            return refused(request)
        return self._call(edit_argv(), request, timeout_s, max_chars + editor_request.OVERHEAD_CHARS, workdir="/")

    # -- container settings ---------------------------------------------------

    def _plan_egress(self, policy: SandboxPolicy) -> egress_plan.Egress | None:
        """The allowlist's plan, made once per policy (it reads the operator's settings; egress_plan.plan_for)."""
        if policy.network != "allowlist":
            return None
        try:
            return egress_plan.plan_for(self.workspace, policy)
        except egress_plan.NetworkError as exc:
            raise SandboxError(str(exc)) from None

    def _egress(self) -> egress_plan.Egress | None:
        # allowlist: join the agent's netns holder (no default route) and reach
        # out only through the proxy; none/bridge are the engine's own modes.
        return self._egress_plan

    def command_env(self, egress: egress_plan.Egress | None = None) -> dict[str, str]:
        """The agent's command's whole environment: PATH/HOME/LANG, the policy's
        env, the allowlist's proxy variables (`egress`: a granted call's). Never the harness programs'."""
        egress = egress or self._egress()
        return {**BASE_ENV, **dict(self.policy.env), **(egress.env() if egress else {})}

    def container_spec(
        self,
        argv: list[str],
        call_id: str = "-",
        stdin: bool = False,
        workdir: str = WORKSPACE,
        command_env: dict[str, str] | None = None,
        grant: Grant | None = None,
    ) -> tuple[ContainerConfig, HostConfig]:
        """(container config, host config) for one call, in docker SDK terms.
        Every call is created from exactly these; `policy explain` prints them.
        `command_env` is the environment argv gets when argv is the agent's
        command; None when argv is one of ours, which runs under ours. `grant`: an approved
        call's own proxy plan and CA (_granted_run), in place of the agent's."""
        p = self.policy
        egress, ca = grant or (self._egress(), self._egress_ca)
        # Our own programs, popped from the environment before the command runs,
        # and the command's environment, which the guard applies at its exec.
        programs = {
            GUARD_ENV: GUARD,
            **({LAUNCHER_ENV: LAUNCHER} if argv == LAUNCH_ARGV else {}),
            **({COMMAND_ENV: carried(command_env)} if command_env is not None else {}),
        }
        config = ContainerConfig(
            image=p.image,
            command=guarded(argv),  # io_uring and set-id modes refused (seccomp.py)
            user=self.user,
            working_dir=workdir,
            hostname="sandbox",
            environment={
                **BASE_ENV,
                **(egress.env() if egress else {}),
                **(network.ca_env(ca) if egress else {}),
                **programs,
            },
            labels={
                LABEL: "1",
                "wakeloop.agent": self.agent,
                "wakeloop.workspace": str(self.workspace),
                "wakeloop.run_id": self.run_id,
                "wakeloop.call_id": call_id,
            },
            stdin_open=stdin,  # with detach=False this also sets StdinOnce
            detach=False,
            use_config_proxy=False,  # else the SDK copies the client's proxy settings in
        )
        host = HostConfig(
            mounts=[self.disk.mount(self.wake) if self.disk else self._bind_mount()],
            network_mode=egress.network_mode if egress else self._netns.network_mode if self._netns else p.network,
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={p.tmp_size}"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=p.pids,
            mem_limit=p.memory,
            memswap_limit=p.memory,
            nano_cpus=int(p.cpus * 1e9),
            ulimits=[
                Ulimit(name="nofile", soft=p.nofile, hard=p.nofile),
                Ulimit(name="fsize", soft=p.max_file_size, hard=p.max_file_size),
                Ulimit(name="core", soft=0, hard=0),
            ],
            ipc_mode="private",
            shm_size=p.shm_size,
            init=True,
            runtime=p.runtime,
            log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
        )
        if egress or self._netns:  # the engine refuses a hostname with container: networking;
            del config["hostname"]  # the holder's, also "sandbox", applies
        return config, host

    def _bind_mount(self) -> Mount:
        """With `sandbox.disk: none`: the workspace folder, by its host path."""
        return Mount(target=WORKSPACE, source=str(self._host_path), type="bind")

    # -- one call, start to removal -------------------------------------------

    @property
    def root(self) -> Path:
        """The ROOT whose switch (ROOT/STOP) this agent's calls obey: its folder's parent."""
        return self.folder.parent

    def _call(
        self,
        argv: list[str],
        stdin: bytes | None,
        timeout_s: float,
        max_output_chars: int,
        workdir: str = WORKSPACE,
        command_env: dict[str, str] | None = None,
        grant: Grant | None = None,
    ) -> SandboxResult:
        halted = stopswitch.read(self.root)
        if halted is not None:  # no call starts while the fleet is stopped
            return refused(halted.describe())
        if not (self.disk and self.disk.hold):  # a folder (no disk limit), or a planned disk
            return self._run_call(argv, stdin, timeout_s, max_output_chars, workdir, command_env, grant)
        try:  # thin disks: a call starts only with room for the worst case of every call in flight
            with disk_room.flight(self.disk.key, self.disk.view, min(disk_room.ROOM_WAIT_S, timeout_s)):
                halted = stopswitch.read(self.root)  # again: the wait for room may have outlasted a stop
                if halted is not None:
                    return refused(halted.describe())
                return self._run_call(argv, stdin, timeout_s, max_output_chars, workdir, command_env, grant)
        except disk_room.NoRoom as exc:
            return no_room(str(exc))

    def _run_call(
        self,
        argv: list[str],
        stdin: bytes | None,
        timeout_s: float,
        max_output_chars: int,
        workdir: str,
        command_env: dict[str, str] | None,
        grant: Grant | None = None,
    ) -> SandboxResult:
        started = time.monotonic()
        cid = self.pool.take() if self.pool and not grant else None  # the pool's join the agent's proxy
        send: bytes | None
        if cid:  # already running its launcher: hand it the command, then stdin
            nonce = secrets.token_hex(16)
            send = handoff(argv, workdir, stdin is not None, nonce, command_env) + (stdin or b"")
            end, hold = EndLine(nonce), False
        else:
            # The agent's command: its guard holds the box until its OOM count is read.
            hold = command_env is not None and stdin is None
            cid = self._create(argv, uuid.uuid4().hex[:12], stdin is not None or hold, workdir, command_env, grant)
            send, end = stdin, None
        try:
            result = self._attach_and_wait(cid, send, end, timeout_s, max_output_chars, started, hold=hold)
        except BaseException as exc:
            self._remove(cid)  # at once: the process may be on its way out (Ctrl-C)
            if self.pool and isinstance(exc, Exception):
                self.pool.ended()  # the wake goes on: its refill put off until now begins
            raise
        if self.pool and not grant:
            self.pool.done(cid)  # removal off the call's path; a refill put off until now begins
        else:
            self._remove(cid)  # a granted call's: before its proxy and network go
        return result

    def _create(
        self,
        argv: list[str],
        call_id: str,
        stdin: bool,
        workdir: str,
        command_env: dict[str, str] | None = None,
        grant: Grant | None = None,
    ) -> str:
        try:
            config, host = self.container_spec(argv, call_id, stdin, workdir, command_env=command_env, grant=grant)
            if self._netns and host["network_mode"] == self._netns.network_mode:
                self._netns.ensure()  # before the box that joins it starts
            cid: str = self.client.api.create_container(
                **config, host_config=self.client.api.create_host_config(**host)
            )["Id"]
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot create a sandbox container: {first_line(exc)}") from None
        metrics.container_made(cid)
        return cid

    def _make_warm(self) -> str:
        """A started container idling in the launcher; same settings as a cold call.
        Attached before its start and kept attached until its call, which thus pays
        for no attach, and made only once its launcher says it listens (programs.py).
        Its memory cgroup's OOM count is found now, off any call's path and before
        the box holds any command of the agent's (oom.py)."""
        cid = self._create(LAUNCH_ARGV, "pool", True, WORKSPACE)
        try:
            sock = self.client.api.attach_socket(cid, params=ATTACH_PARAMS)
            self._attached[cid] = sock
            self.client.api.start(cid)
            await_line(self.client.api, cid, sock, READY_LINE)
        except (docker.errors.DockerException, OSError, SandboxError):
            self._remove(cid)
            raise
        self._oom_files[cid] = oom.counter_file_of(self.client, cid)
        return cid

    def _settings_key(self) -> str:
        config, host = self.container_spec(["-"], "-", True, WORKSPACE)
        config.pop("labels")
        return repr((config, host, self._layer))

    def _running(self, cid: str) -> bool:
        try:
            inspected: Inspected = self.client.api.inspect_container(cid)
            return inspected["State"]["Running"]
        except docker.errors.DockerException:
            return False

    def _attach_and_wait(
        self,
        cid: str,
        stdin: bytes | None,
        end: EndLine | None,
        timeout_s: float,
        cap: int,
        started: float,
        hold: bool = False,
    ) -> SandboxResult:
        """Stream the output until the container exits, or (pooled) until its
        launcher's end line; a cold container is started here, after attaching.
        `hold`: a cold call whose guard waits, its command over, until the host has
        read the box's OOM count and closed its stdin (programs.py's GUARD)."""
        api = self.client.api
        params = {**ATTACH_PARAMS, "stdin": int(stdin is not None or hold)}
        sock = self._attached.pop(cid, None) or api.attach_socket(cid, params=params)
        raw = raw_socket(sock)
        # The deadline is ours to keep: a ptrace-stopped init never exits on its own.
        deadline = Deadline(api, cid, raw, timeout_s, halted=lambda: stopswitch.is_stopped(self.root))
        try:
            if end is None:
                api.start(cid)
            deadline.start()
            if stdin is not None:
                send_stdin(raw, stdin)
            capture = Capture(cap)
            held = EndLine(HELD) if hold else None
            kills = None
            try:
                for _stream, data in frames_iter(sock, tty=False):
                    if held and not held.found:
                        data = held.feed(data)
                        if held.found:  # the box stands until stdin closes: count, then release it
                            counted = oom.counter_file_of(self.client, cid)
                            kills = oom.read_kills(counted) if counted else None
                            send_stdin(raw, b"")
                            data += held.rest  # the command's, if it printed the line itself
                    capture.add(end.feed(data) if end else data)
                    if end and end.found:
                        break
            except OSError:
                pass  # the deadline shut the socket; the state below says why
            deadline.cancel()
            if end and not end.found:
                capture.add(end.flush())
            if held and not held.found:
                capture.add(held.flush())
            state = self._final_state(cid, end)
            if kills:  # the kernel's count: the engine's flag may have lost the race with the exit
                state["OOMKilled"] = True
        finally:
            deadline.cancel()
            # Both: the SDK's socket object and the socket under it. Closing only the
            # first leaves the descriptor open until the garbage collector finds it.
            sock.close()
            raw.close()
        timed_out = deadline.fired
        return SandboxResult(
            exit_code=TIMEOUT_EXIT if timed_out else state["ExitCode"],
            output=capture.text()[: cap + 200],  # the truncation note may add a little
            output_bytes=capture.total,
            truncated=capture.truncated,
            timed_out=timed_out,
            oom_killed=bool(state.get("OOMKilled")),
            duration_ms=int((time.monotonic() - started) * 1000),
            container_id=cid[:12],
            stopped=deadline.stopped,
        )

    def _final_state(self, cid: str, end: EndLine | None) -> ContainerState:
        """ExitCode and OOMKilled: a pooled call's from its launcher's line and a count of
        OOM kills no command can forge, at once; else the engine's, once the container
        has exited (a cold call's, or a pooled call's that nothing at hand can settle)."""
        if end and end.exit_code is not None:  # found
            killed = oom.killed_at_once(end.oom, self._oom_files.get(cid), end.exit_code)
            if killed is not None:
                return {"ExitCode": end.exit_code, "OOMKilled": killed}
        self.client.api.wait(cid, timeout=KILL_GRACE_S + engine_client.ENGINE_TIMEOUT_S)
        state: ContainerState = self.client.api.inspect_container(cid)["State"]
        if end and end.exit_code is not None:  # found: the engine's exit code is the launcher's, not the command's
            state["ExitCode"] = end.exit_code
        return state

    def _remove(self, cid: str) -> None:
        self._oom_files.pop(cid, None)
        sock = self._attached.pop(cid, None)
        if sock is not None:  # an idle warm container's: both objects, as _attach_and_wait closes them
            raw = raw_socket(sock)
            sock.close()
            raw.close()
        try:
            self.client.api.remove_container(cid, force=True)
            metrics.container_removed(cid)
        except docker.errors.NotFound:
            metrics.container_removed(cid)
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise

    def cleanup_leftovers(self) -> int:
        """Remove containers an earlier, crashed run left for this workspace."""
        # One listing, no per-container lookup: a pool's container may come and go
        # between the two (the SDK's containers.list would then raise NotFound).
        found = self.client.api.containers(
            all=True, filters={"label": [f"{LABEL}=1", f"wakeloop.workspace={self.workspace}"]}
        )
        stale = [c["Id"] for c in found if (c.get("Labels") or {}).get("wakeloop.run_id") != self.run_id]
        for cid in stale:
            self._remove(cid)
        return len(stale) + netns.leftovers(self.client, self.workspace, keep=self._netns.name if self._netns else "")
