"""Every probe can fail: the same probe reports ESCAPED against a box with one
hardening removed (test_every_probe_has_a_weakened_control keeps it so).

The weakenings: a container flag changed (`weakened(change)`), a sandbox
subclass built as a design we rejected (the harness writing or reading the
workspace from the host, a `docker exec` container that outlives its
command), or one of our checks switched off with monkeypatch. Weakened boxes
exist only here; product code never builds one. None combines root with the
host's pid namespace: a probe aimed at "every process" must only ever reach
the box's own. Weakened allowlist proxies are built from
tests/helpers/proxyconf.py's configs, patched in for one test; each allowlist probe
starts its own proxy and only ever reaches its own server container. Their containers keep the product's labels
(workspace under this session's temp dir), so the no-leftover check covers
them. The bridge-network box is judged by its interfaces and routing table
only: no probe dials out of it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from docker.types import Mount, Ulimit

from orchestrator.escapes import ESCAPED, HELD, by_name, credentials
from orchestrator.escapes.lab import run_probe
from orchestrator.escapes.network_probes import LOCAL_ONLY
from orchestrator.policy.ceiling import Ceiling
from orchestrator.policy.schema import SandboxPolicy, Tools, WriteFileTool
from orchestrator.sandbox.containers import seccomp
from orchestrator.sandbox.containers.programs import GUARD_ENV, LAUNCH_ARGV, LAUNCHER_ENV, guarded
from orchestrator.sandbox.egress import egress_plan, network
from orchestrator.sandbox.engine import DockerSandbox
from tests.helpers.proxyconf import (
    ca_with_its_key,
    proxy_allowing_everything,
    proxy_cutting_nothing_in_flight,
    proxy_ignoring_absolute_targets,
    proxy_matching_raw_paths,
    proxy_recording_refusals_twice,
    proxy_taking_clear_text_for_tls,
    proxy_trusting_the_box_sni,
    proxy_with_credentials_everywhere,
    proxy_without_address_rules,
)


def weakened(change):
    """A DockerSandbox whose container_spec is the product's, then `change(config, host)`."""

    class Weak(DockerSandbox):
        def container_spec(self, *args, **kwargs):
            config, host = super().container_spec(*args, **kwargs)
            change(config, host)
            return config, host

    Weak.__name__ = f"Weak_{change.__name__}"
    return Weak


def writable_root(config, host):
    host["read_only"] = False


def root_with_default_caps(config, host):
    config["user"] = "0:0"
    del host["cap_drop"]


def added_capability(config, host):
    host["cap_add"] = ["SYS_ADMIN"]


def host_environment(config, host):
    config["environment"] = {**os.environ, **config["environment"]}


def proxy_settings(config, host):
    config["environment"]["HTTPS_PROXY"] = "http://proxy.invalid:3128"


def bridge_network(config, host):
    host["network_mode"] = "bridge"


def no_pids_limit(config, host):
    host["pids_limit"] = -1


def without_guard(config):
    """Drop wakeloop's in-box seccomp filter (seccomp.py): it sets no_new_privs and
    a filter itself, so a box weakened in those two must lose that layer too."""
    if config["command"][:4] == guarded([])[:4]:
        config["command"] = config["command"][4:]


def no_new_privileges_dropped(config, host):
    host["security_opt"] = [o for o in host["security_opt"] if o != "no-new-privileges"]
    without_guard(config)


def seccomp_unconfined(config, host):
    host["security_opt"] = host["security_opt"] + ["seccomp=unconfined"]
    without_guard(config)


def no_memory_limit(config, host):
    del host["mem_limit"], host["memswap_limit"]


def big_tmp(config, host):
    host["tmpfs"] = {"/tmp": "rw,nosuid,nodev,size=512m"}


def host_pid_namespace(config, host):
    host["pid_mode"] = "host"


def host_hostname(config, host):
    config["hostname"] = socket.gethostname()


def docker_socket_mounted(config, host):
    host["mounts"] = host["mounts"] + [Mount("/var/run/docker.sock", "/var/run/docker.sock", type="bind")]


def high_nofile(config, host):
    host["ulimits"] = [u for u in host["ulimits"] if u["Name"] != "nofile"] + [
        Ulimit(name="nofile", soft=8192, hard=8192)
    ]


def no_cpu_quota(config, host):
    del host["nano_cpus"]


def host_block_device(config, host):
    disk = next(d for d in ("/dev/loop0", "/dev/vda", "/dev/sda", "/dev/nvme0n1") if os.path.exists(d))
    host["devices"] = [f"{disk}:/dev/probe-disk:r"]  # only stat()ed by the probe, never read


def dumpable_launcher(config, host):
    """The pool launcher without PR_SET_DUMPABLE 0: the command can read its memory."""
    env = config["environment"]
    if LAUNCHER_ENV in env:
        env[LAUNCHER_ENV] = env[LAUNCHER_ENV].replace("ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0", "False")


def _guard_filter(config, abis) -> None:
    """The guard installs the filter `abis` make, in place of the product's (seccomp.py)."""
    env = config["environment"]
    assert seccomp.FILTER.hex() in env[GUARD_ENV]
    env[GUARD_ENV] = env[GUARD_ENV].replace(seccomp.FILTER.hex(), seccomp.assemble(seccomp.program(abis)).hex())


def set_id_modes_allowed(config, host):
    """The guard's filter as it was before: io_uring alone, no rule on modes."""
    _guard_filter(config, tuple(replace(abi, mode_at={}, open_at={}, enosys=seccomp.IO_URING) for abi in seccomp.ABIS))


def arch_blind_filter(config, host):
    """A filter that knows x86_64's numbers only, as one written without reading
    seccomp_data.arch would: i386's calls (other numbers) fall to the io_uring rule."""
    _guard_filter(config, (seccomp.X86_64,))


def no_file_size_limit(config, host):
    host["ulimits"] = [u for u in host["ulimits"] if u["Name"] != "fsize"]


class NoDisk(DockerSandbox):
    """The workspace by its host path (a bind mount), whatever sandbox.disk says."""

    def _attach_disk(self, policy, attach=True):
        return None


DISK_PROBES = ["caps_workspace_disk", "caps_workspace_fallocate", "caps_workspace_files", "hides_workspace_host_path"]


@pytest.mark.parametrize("probe_name", DISK_PROBES)
def test_disk_probes_escape_a_box_without_its_disk(probe_name, make_lab):
    outcome = run_probe(make_lab(sandbox_class=NoDisk), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"no disk: {probe_name} said {outcome.verdict}: {outcome.observed}"


# -- every other probe: the one layer it proves, removed ---------------------------------
#
# Weakenings that need a host path take it from the box's own label (the
# trial's workspace under the lab's temp dir): no test mounts anything of the
# host but the lab's throwaway folders, and sysfs files that are only opened.


def _agent_dir(config) -> Path:
    return Path(config["labels"]["wakeloop.workspace"]).parent


def lab_folder_mounted(config, host):
    """The lab's folder (the host secret, every agent) visible in the box, read-only."""
    host["mounts"] = host["mounts"] + [Mount("/mnt/host", str(_agent_dir(config).parent), type="bind", read_only=True)]


def root_on_writable_root(config, host):
    root_with_default_caps(config, host)
    writable_root(config, host)


def leaked_directory_fd(config, host):
    """A runtime that leaks a descriptor of a host directory into the box (runc's
    CVE-2024-21626 leaked its cgroup dir's): fd 7, inherited by the command."""
    config["command"] = ["/bin/sh", "-c", 'exec 7</etc; exec "$@"', "sh", *config["command"]]


def everything_allowed(config, host):
    """Root with the capabilities a kernel attack needs and no seccomp or AppArmor
    filter. Its own pid namespace still: never the host's with root (a probe
    aimed at "all processes" must only ever reach the box's)."""
    root_with_default_caps(config, host)
    host["cap_add"] = ["SYS_ADMIN", "SYS_MODULE", "SYS_PTRACE", "NET_ADMIN"]
    host["security_opt"] = ["seccomp=unconfined", "apparmor=unconfined"]
    without_guard(config)


def writable_sysfs_file(config, host):
    """Root, and one host sysfs directory bound read-write (the probe only opens)."""
    root_with_default_caps(config, host)
    path = "/sys/kernel/mm/transparent_hugepage"
    host["mounts"] = host["mounts"] + [Mount(path, path, type="bind", read_only=False)]


def workspace_on_the_root_filesystem(config, host):
    """/workspace and /tmp as plain folders of one writable root filesystem."""
    root_on_writable_root(config, host)
    host["mounts"], host["tmpfs"] = [], {}


def persistent_var_tmp(config, host):
    """/var/tmp bound to a host folder that outlives the box."""
    shared = _agent_dir(config).parent / "persistent-var-tmp"
    shared.mkdir(exist_ok=True)
    shared.chmod(0o1777)
    host["mounts"] = host["mounts"] + [Mount("/var/tmp", str(shared), type="bind")]


def big_shm(config, host):
    host["shm_size"] = 512 * 2**20


def unbounded_engine_log(config, host):
    host["log_config"] = {"Type": "json-file", "Config": {}}


# (weakening, probe that must now report ESCAPED)
CASES = [
    (writable_root, "blocks_write_outside_workspace"),
    (root_with_default_caps, "runs_as_unprivileged_user"),
    (root_with_default_caps, "blocks_chroot"),
    (host_block_device, "blocks_device_nodes"),
    (root_with_default_caps, "blocks_raw_and_packet_sockets"),
    (root_with_default_caps, "blocks_setcap_on_workspace_file"),
    (added_capability, "holds_no_capabilities"),
    (host_environment, "hides_host_environment"),
    (host_environment, "hides_api_key"),
    (proxy_settings, "hides_proxy_settings"),
    (bridge_network, "has_no_interface_but_lo"),
    (bridge_network, "has_no_default_route"),
    (no_pids_limit, "caps_process_count"),
    (no_new_privileges_dropped, "sets_no_new_privs"),
    (seccomp_unconfined, "enforces_seccomp_filter"),
    (seccomp_unconfined, "blocks_keyctl"),
    (no_memory_limit, "caps_memory"),
    (big_tmp, "caps_tmp_size"),
    (host_pid_namespace, "hides_host_process_list"),
    (host_hostname, "uses_neutral_hostname"),
    (docker_socket_mounted, "hides_docker_socket"),
    (high_nofile, "caps_open_files"),
    (no_file_size_limit, "caps_sparse_file_size"),
    (no_cpu_quota, "caps_cpu"),
    (dumpable_launcher, "blocks_forging_the_exit_status"),
    (set_id_modes_allowed, "blocks_setuid_bit_reaching_host"),
    (set_id_modes_allowed, "blocks_setuid_bit_at_creation"),
    (arch_blind_filter, "blocks_setuid_bit_through_i386_abi"),
    (lab_folder_mounted, "blocks_reading_host_files"),
    (lab_folder_mounted, "hides_other_agents_workspaces"),
    (docker_socket_mounted, "blocks_proc_1_root"),  # the host's paths under /proc/1/root
    (root_on_writable_root, "blocks_overwriting_proc_self_exe"),
    (everything_allowed, "blocks_mount"),
    (everything_allowed, "blocks_pivot_root"),
    (everything_allowed, "blocks_bpf"),
    (everything_allowed, "blocks_kernel_modules"),
    (seccomp_unconfined, "blocks_unshare_namespaces"),
    (seccomp_unconfined, "blocks_perf_event_open"),
    (seccomp_unconfined, "blocks_io_uring"),
    (root_with_default_caps, "blocks_setuid_binaries"),
    (root_with_default_caps, "blocks_setuid_root"),
    (writable_sysfs_file, "blocks_writes_to_sys"),
    (workspace_on_the_root_filesystem, "blocks_hardlink_outside_workspace"),
    (host_pid_namespace, "blocks_ptrace_outside_box"),  # the box's uid, never root, in the host's pids
    (bridge_network, "has_no_dns"),
    (bridge_network, "has_no_route_to_metadata"),
    (bridge_network, "cannot_reach_bridge_gateway"),
    (bridge_network, "cannot_reach_docker_api_tcp"),
    (persistent_var_tmp, "forgets_files_outside_workspace"),
    (big_shm, "caps_dev_shm_size"),
]


@pytest.fixture(params=["runc"])
def runtime(request):
    """The controls run on runc: they show each probe can fail, which needs
    a runtime that honours the weakened flag (gVisor ignores several)."""
    return request.param


@pytest.mark.parametrize("weakening, probe_name", CASES, ids=[f"{w.__name__}-{p}" for w, p in CASES])
def test_probe_escapes_weakened_box(weakening, probe_name, make_lab, monkeypatch):
    if weakening is bridge_network:
        assert probe_name in LOCAL_ONLY  # a box with a network dials nothing but this host's own addresses
    if weakening is host_environment:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-a-real-key")
        monkeypatch.setenv("WAKELOOP_TEST_HOST_ONLY", "a host variable the box must not see")
    outcome = run_probe(make_lab(sandbox_class=weakened(weakening)), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"{weakening.__name__}: {probe_name} said {outcome.verdict}: {outcome.observed}"


def test_at_least_ten_probes_are_shown_able_to_fail():
    assert len({probe for _, probe in CASES}) >= 10


def test_the_ceiling_probe_escapes_a_broker_that_ignores_its_ceiling(make_lab, monkeypatch):
    # Not a container flag: the broker's own check, switched off.
    monkeypatch.setattr(Ceiling, "refusal", lambda self, policy, user=None: None)
    outcome = run_probe(make_lab(), by_name("blocks_orchestrator_raising_the_box"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "the broker ran a call for agent.yaml asking {'pids'" in outcome.observed


# -- the allowlist proxy: its config weakened, each probe's own server reached --------

PROXY_CASES = [
    (proxy_without_address_rules, "allowlist_refuses_private_destination"),
    (proxy_without_address_rules, "allowlist_refuses_proxy_gateway_and_neighbours"),
    (proxy_allowing_everything, "allowlist_refuses_unlisted_host"),
]


@pytest.mark.parametrize("weakening, probe_name", PROXY_CASES, ids=[f"{w.__name__}-{p}" for w, p in PROXY_CASES])
def test_allowlist_probe_escapes_a_weakened_proxy(weakening, probe_name, make_lab, monkeypatch):
    # Each probe starts its own proxy, from this config; the only server it can
    # reach is the probe's own container on this machine.
    monkeypatch.setattr(egress_plan, "proxy_config", weakening)
    outcome = run_probe(make_lab(), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"{weakening.__name__}: {probe_name} said {outcome.verdict}: {outcome.observed}"
    assert "logged" in outcome.observed  # the probe's own server saw the request


def test_credential_probe_escapes_a_proxy_that_sends_credentials_to_every_intercepted_host(make_lab, monkeypatch):
    monkeypatch.setattr(egress_plan, "proxy_config", proxy_with_credentials_everywhere)
    outcome = run_probe(make_lab(), by_name("credentials_only_to_their_host"))
    if "no route at all" in outcome.observed:
        pytest.skip("this runtime gives the box no route to the proxy")
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert credentials.RULED in outcome.observed  # the misdirected placeholder was honoured


LEAKED = "went where it is not bound"
CREDENTIAL_CASES = [
    (proxy_trusting_the_box_sni, "credentials_follow_the_tunnel_name", LEAKED),
    (proxy_ignoring_absolute_targets, "credentials_refuse_absolute_form_elsewhere", LEAKED),
    (proxy_taking_clear_text_for_tls, "credentials_never_in_clear", LEAKED),
    (proxy_matching_raw_paths, "credentials_rules_see_the_normal_path", LEAKED),
    (proxy_recording_refusals_twice, "egress_records_each_request_once", "5 requests (4 refused) made 9 record lines"),
    (proxy_cutting_nothing_in_flight, "caps_egress_download_in_flight", "tunnelled: 8,388,608 bytes moved"),
    (proxy_cutting_nothing_in_flight, "caps_egress_upload_in_flight", "tunnelled: 8,388,608 bytes moved"),
]


@pytest.mark.parametrize(
    "weakening, probe_name, said", CREDENTIAL_CASES, ids=[f"{w.__name__}-{p}" for w, p, _ in CREDENTIAL_CASES]
)
def test_credential_probe_escapes_a_proxy_with_one_check_off(weakening, probe_name, said, make_lab, monkeypatch):
    # One check of the addon off; the value goes only to the probe's own echo servers.
    monkeypatch.setattr(egress_plan, "proxy_config", weakening)
    outcome = run_probe(make_lab(), by_name(probe_name))
    if "no route at all" in outcome.observed:
        pytest.skip("this runtime gives the box no route to the proxy")
    assert outcome.verdict == ESCAPED, f"{weakening.__name__}: {probe_name} said {outcome.verdict}: {outcome.observed}"
    assert said in outcome.observed


def test_credential_probe_escapes_a_proxy_that_hands_the_box_its_ca_key(make_lab, monkeypatch):
    monkeypatch.setattr(network, "_ca_of", ca_with_its_key)
    outcome = run_probe(make_lab(), by_name("credentials_out_of_the_box"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "PRIVATE KEY in /tmp/wakeloop-ca.pem" in outcome.observed


def test_allowlist_route_probe_escapes_a_box_on_the_bridge(make_lab):
    # Reads the routing table and makes UDP connect()s, which send nothing.
    outcome = run_probe(make_lab(sandbox_class=weakened(bridge_network)), by_name("allowlist_has_no_direct_route"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def starts_python3_by_name(only_pooled: bool):
    """The layout before issue 11: the policy's env in the container's own
    environment, where tini looks up a guard named bare `python3` on its PATH.
    Either change alone is harmless (our PATH; an absolute name): the control
    needs both. `only_pooled`: the pool's launcher containers alone."""

    class Weak(DockerSandbox):
        def container_spec(self, argv, *args, **kwargs):
            config, host = super().container_spec(argv, *args, **kwargs)
            if argv == LAUNCH_ARGV or not only_pooled:
                config["environment"] = {**config["environment"], **dict(self.policy.env)}
                config["command"] = ["python3", *config["command"][1:]]
            return config, host

    Weak.__name__ = f"Weak_python3_by_name{'_pooled' if only_pooled else ''}"
    return Weak


@pytest.mark.parametrize("only_pooled", [False, True], ids=["every-call", "pooled-only"])
def test_the_planted_python_probe_escapes_a_box_that_starts_python3_by_name(make_lab, only_pooled):
    outcome = run_probe(
        make_lab(sandbox_class=starts_python3_by_name(only_pooled)), by_name("blocks_planted_python_on_policy_path")
    )
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert ("for the pooled bash call" if only_pooled else "for the cold bash call") in outcome.observed


GIT_PROBES = [
    "blocks_gitdir_pointer_write",
    "blocks_submodule_hook_write",
    "blocks_bare_repo_hook_write",
    "blocks_case_variant_git_hook",
]


@pytest.mark.parametrize("probe_name", GIT_PROBES)
def test_git_probes_escape_a_policy_with_protect_git_off(probe_name, make_lab):
    # Not a container flag: the policy's own switch (the globs host-side, the bare-repo check in the box).
    lab = make_lab()
    lab.tools = Tools(write_file=WriteFileTool(protect_git=False))
    outcome = run_probe(lab, by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


class NoBareRepoCheck(DockerSandbox):
    """protect_git stays on in the policy (the .git globs hold); only the write
    script's look at the target's directories is off."""

    def write(self, path, content, timeout_s=30, append=False, protect_git=True):
        return super().write(path, content, timeout_s, append, protect_git=False)


def test_the_bare_repo_probe_escapes_without_the_check_in_the_box(make_lab):
    outcome = run_probe(make_lab(sandbox_class=NoBareRepoCheck), by_name("blocks_bare_repo_hook_write"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


# -- the broker against a taken-over orchestrator: its own checks, switched off --------


def _naive_read(path, what="policy"):
    from pathlib import Path

    return Path(path).read_text(encoding="utf-8")  # follows anything, opens FIFOs, reads it all


def _count_only(self, name):
    with self._lock:
        self._calls[name] = self._calls.get(name, 0) + 1  # counted, never refused


BROKER_CASES = [  # (what is switched off, the probe that must now report ESCAPED, what it says)
    ("refuse_aliases", "broker_refuses_yaml_alias_bomb", "refused, but not for what was planted"),
    ("read_config", "broker_refuses_fifo_policy", "did not answer within"),
    ("read_config", "broker_refuses_device_or_huge_policy", "the broker served check"),
    ("real_agent_dir", "broker_refuses_symlinked_agent_dir", "twin: the broker served check"),
    ("cut_to_line", "broker_bounds_its_log_lines", "broker log lines of"),
    ("REQUEST_READ_S", "broker_bounds_silent_connections", "that sent nothing were still open"),
    ("_take_call_slot", "broker_bounds_calls_in_flight", "ran past max.calls_per_agent"),
    ("_user_refusal", "broker_refuses_user_over_ceiling", "the broker served check"),
    ("_env_refusal", "broker_refuses_env_name_over_ceiling", "the broker served check"),
    ("_host_refusal", "broker_refuses_host_over_ceiling", "the broker served check"),
    ("_close_box", "broker_retires_egress_on_allowlist_churn", "retired allowlist proxy set(s)"),
    ("_grant_refusal", "broker_grants_only_hosts_policy_and_ceiling_allow", "the broker ran a call granted"),
    ("_attach_disk", "pins_workspace_against_symlink_swap", "saw the canary"),
]


def _switch_off(what, monkeypatch):
    from orchestrator.broker import server, transport
    from orchestrator.policy import agent, load
    from orchestrator.safeio import yamlfile
    from orchestrator.sandbox import keeper

    off = {
        "refuse_aliases": lambda: monkeypatch.setattr(yamlfile, "refuse_aliases", lambda text: None),
        "read_config": lambda: (
            monkeypatch.setattr(load, "read_config", _naive_read),
            monkeypatch.setattr(agent, "read_config", _naive_read),
        ),
        "real_agent_dir": lambda: monkeypatch.setattr(server, "real_agent_dir", lambda root, name: root / name),
        "cut_to_line": lambda: monkeypatch.setattr(server, "cut_to_line", lambda text, limit: text),
        "REQUEST_READ_S": lambda: monkeypatch.setattr(transport, "REQUEST_READ_S", 3600.0),
        "_take_call_slot": lambda: monkeypatch.setattr(server.Broker, "_take_call_slot", _count_only),
        "_user_refusal": lambda: monkeypatch.setattr(Ceiling, "_user_refusal", lambda self, p, u: None),
        "_env_refusal": lambda: monkeypatch.setattr(Ceiling, "_env_refusal", lambda self, p: None),
        "_host_refusal": lambda: monkeypatch.setattr(Ceiling, "_host_refusal", lambda self, p: None),
        "_close_box": lambda: monkeypatch.setattr(keeper.Keeper, "_close_box", lambda self, box: box.close()),
        "_grant_refusal": lambda: monkeypatch.setattr(server.Broker, "_grant_refusal", lambda self, agent, hosts: ""),
        "_attach_disk": lambda: monkeypatch.setattr(DockerSandbox, "_attach_disk", NoDisk._attach_disk),
    }
    off[what]()


@pytest.mark.parametrize("what, probe_name, says", BROKER_CASES, ids=[p for _, p, _ in BROKER_CASES])
def test_each_orchestrator_probe_escapes_a_broker_without_its_check(what, probe_name, says, make_lab, monkeypatch):
    _switch_off(what, monkeypatch)
    outcome = run_probe(make_lab(), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"{what} off: {probe_name} said {outcome.verdict}: {outcome.observed}"
    assert says in outcome.observed, outcome.observed


def test_every_orchestrator_probe_has_a_weakened_control():
    from orchestrator.escapes.broker_probes import PROBES

    assert {p.name for p in PROBES} == {name for _, name, _ in BROKER_CASES}


def test_the_setuid_probe_escapes_through_a_cold_call_alone(make_lab):
    # The rule must hold in every container a call can get: here the pool's are
    # guarded as the product does, the cold path's guard is not.
    def cold_unguarded(config, host):
        if config["command"][4:] != LAUNCH_ARGV:
            set_id_modes_allowed(config, host)

    outcome = run_probe(make_lab(sandbox_class=weakened(cold_unguarded)), by_name("blocks_setuid_bit_reaching_host"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "after a cold call's chmod" in outcome.observed


def test_the_leaked_fd_probe_escapes_a_runtime_that_leaks_one(make_lab):
    # Cold calls: the guard execs the command, which keeps the descriptor (a
    # pooled launcher's subprocess would close it, as runc's fix does).
    outcome = run_probe(
        make_lab(sandbox_class=weakened(leaked_directory_fd), pool=0), by_name("blocks_leaked_host_fds")
    )
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "/proc/self/fd/7 -> /etc" in outcome.observed


class StartsInTheCgroupFs(DockerSandbox):
    """What a vulnerable runc did with a working dir of /proc/self/fd/N: the box
    started with its cwd in the host's cgroup filesystem."""

    def _call(self, argv, stdin, timeout_s, max_output_chars, workdir="/workspace", command_env=None):
        if workdir.startswith("/proc/self/fd/"):
            workdir = "/sys/fs/cgroup"
        return super()._call(argv, stdin, timeout_s, max_output_chars, workdir, command_env)


class SystemPathsUnconfined(DockerSandbox):
    """Root, without the engine's read-only /proc/sys and /proc/sysrq-trigger
    (`--security-opt systempaths=unconfined`, which the API spells as paths)."""

    def _create(self, argv, call_id, stdin, workdir, command_env=None, grant=None):
        config, host = self.container_spec(argv, call_id, stdin, workdir, command_env=command_env, grant=grant)
        root_with_default_caps(config, host)
        host_config = self.client.api.create_host_config(**host)
        host_config.update(MaskedPaths=[], ReadonlyPaths=[])
        return self.client.api.create_container(**config, host_config=host_config)["Id"]


class OnATerminal(DockerSandbox):
    """Commands run on a terminal of their own (`docker exec -t`, or `script`)."""

    def run(self, command, timeout_s, max_output_chars):
        import shlex

        return super().run(f"script -qec {shlex.quote(command)} /dev/null", timeout_s, max_output_chars)


class BashEnvFromWorkspace(DockerSandbox):
    """The command's environment names a startup file in the workspace (the
    policy refuses BASH_ENV; this box never asked it)."""

    def command_env(self):
        return {**super().command_env(), "BASH_ENV": "/workspace/.bashrc"}


class WritesFromTheHost(DockerSandbox):
    """write_file done by the harness on the host, through the workspace folder,
    as a naive harness would; each write then takes a real call's time."""

    def write(self, path, content, timeout_s=30, append=False, protect_git=True):
        target = self.view / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "ab" if append else "wb") as fh:
            fh.write(content)
        return self.run("true", timeout_s, 1000)


SANDBOX_CLASSES = [  # (a weakened box, the probe that must now report ESCAPED)
    (StartsInTheCgroupFs, "blocks_workdir_at_leaked_fd"),
    (SystemPathsUnconfined, "blocks_writes_to_proc_sys"),
    (OnATerminal, "blocks_tiocsti"),
    (BashEnvFromWorkspace, "workspace_cannot_hijack_commands"),
    (WritesFromTheHost, "write_file_refuses_symlinks"),
    (WritesFromTheHost, "write_file_survives_symlink_swap"),
]


@pytest.mark.parametrize("sandbox_class, probe_name", SANDBOX_CLASSES, ids=[p for _, p in SANDBOX_CLASSES])
def test_probe_escapes_a_weakened_sandbox_class(sandbox_class, probe_name, make_lab):
    outcome = run_probe(make_lab(sandbox_class=sandbox_class), by_name(probe_name))
    assert outcome.verdict == ESCAPED, (
        f"{sandbox_class.__name__}: {probe_name} said {outcome.verdict}: {outcome.observed}"
    )


def test_the_file_size_probe_escapes_a_box_without_rlimit_fsize(make_lab):
    # A small max_file_size, so the box without its limit writes ~100 MiB, not a GiB.
    outcome = run_probe(
        make_lab(sandbox_class=weakened(no_file_size_limit), max_file_size=32 * 2**20),
        by_name("caps_workspace_file_size"),
    )
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def test_the_huge_output_probe_escapes_an_engine_log_without_max_size(make_lab, monkeypatch):
    from orchestrator.escapes import resources

    monkeypatch.setattr(resources, "OUTPUT_BYTES", 300 * 10**6)  # enough to be watched, not a GB
    outcome = run_probe(make_lab(sandbox_class=weakened(unbounded_engine_log)), by_name("bounds_huge_output"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "log" in outcome.observed


def test_the_all_disks_probe_escapes_without_the_room_check(make_lab, monkeypatch):
    from orchestrator.sandbox.disks import disk_room

    # The guard always sees room: a sparse image, ~5 MB written by its mkfs.
    monkeypatch.setattr(disk_room, "room", lambda key: disk_room.Room(free=2**62, worst=0, own=0, flying=1))
    outcome = run_probe(make_lab(), by_name("caps_all_disks_together"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def test_the_baked_secret_probe_escapes_an_image_with_a_key_in_its_env(make_lab, docker_client):
    import io
    import secrets

    tag = "wakeloop-test-baked-secret:" + secrets.token_hex(4)
    dockerfile = f"FROM {SandboxPolicy().image}\nENV ANTHROPIC_API_KEY=sk-ant-test-not-a-real-key\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    try:
        outcome = run_probe(make_lab(image=tag, pool=0), by_name("image_has_no_baked_secrets"))
    finally:
        docker_client.images.remove(tag, force=True)
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "ENV ANTHROPIC_API_KEY" in outcome.observed


# -- the harness's own checks and layers, switched off ---------------------------------


class KeepsItsContainers(NoDisk):
    """The `docker exec` model: a container lives on after its command, and
    nothing removes it. (The test removes them; on a folder, not a disk, which
    a container still using it would keep from being released.)"""

    def container_spec(self, argv, *args, **kwargs):
        config, host = super().container_spec(argv, *args, **kwargs)
        if argv == LAUNCH_ARGV:
            config["command"] = ["/bin/sh", "-c", '"$@"; exec sleep 60', "sh", *config["command"]]
            kill = "os.kill(-1, 9)"
            assert kill in config["environment"][LAUNCHER_ENV]
            config["environment"][LAUNCHER_ENV] = config["environment"][LAUNCHER_ENV].replace(kill, "pass")
        return config, host

    def _remove(self, cid):
        pass

    def run(self, command, timeout_s, max_output_chars):
        self.pool.wait_ready(1, 60)  # a pooled call: a cold one's container ends with its command
        return super().run(command, timeout_s, max_output_chars)


def _remove_lab_containers(client, lab_dir):
    for c in client.api.containers(all=True, filters={"label": "wakeloop.sandbox=1"}):
        if (c.get("Labels") or {}).get("wakeloop.workspace", "").startswith(str(lab_dir)):
            client.api.remove_container(c["Id"], force=True)


@pytest.mark.parametrize(
    "probe_name",
    ["kills_background_processes", "leaves_no_container_behind", "survives_fork_bomb", "survives_million_small_files"],
)
def test_container_probes_escape_a_box_that_keeps_its_containers(
    probe_name, make_lab, docker_client, monkeypatch, tmp_path
):
    from orchestrator.escapes import resources

    monkeypatch.setattr(resources, "MANY_FILES", 2000)  # the containers left are the finding, not the files
    monkeypatch.setattr(resources, "BOMB_DEADLINE_S", 3)
    try:
        outcome = run_probe(make_lab(sandbox_class=KeepsItsContainers), by_name(probe_name))
    finally:
        _remove_lab_containers(docker_client, tmp_path / "lab")
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def _deadline_never_fires(monkeypatch):
    from orchestrator.sandbox.containers import deadline

    monkeypatch.setattr(deadline.Deadline, "expire", lambda self: None)


def test_the_deadline_probe_escapes_a_deadline_that_never_fires(make_lab, monkeypatch):
    from orchestrator.escapes import resources

    _deadline_never_fires(monkeypatch)
    monkeypatch.setattr(resources, "DEADLINE_LOOP_S", 6)  # ends by itself, twice the deadline
    outcome = run_probe(make_lab(), by_name("kills_at_deadline"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def test_the_stopped_init_probe_escapes_a_deadline_that_never_fires(make_lab, docker_client, monkeypatch, tmp_path):
    from orchestrator.escapes import privileges

    _deadline_never_fires(monkeypatch)
    monkeypatch.setattr(privileges, "HOST_SLACK_S", 1)  # the call hangs for good: judged sooner
    monkeypatch.setattr(privileges, "KILL_GRACE_S", 0)
    try:
        outcome = run_probe(make_lab(), by_name("ends_call_with_ptrace_stopped_init"))
    finally:
        _remove_lab_containers(docker_client, tmp_path / "lab")  # ends the hung call
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def test_the_loopback_probe_escapes_runc_boxes_that_share_a_namespace(docker_client, tmp_path, monkeypatch):
    """runc boxes joined to one holder, as only gVisor's are (netns.py): the namespace is then
    their network, and one box reaches the other's listeners."""
    from orchestrator.escapes.lab import Lab
    from orchestrator.sandbox.egress import netns

    monkeypatch.setattr(netns, "own_stack", lambda client, runtime: True)
    lab = Lab(client=docker_client, policy=replace(SandboxPolicy(), runtime="runc"), base=tmp_path / "lab")
    outcome = run_probe(lab, by_name("boxes_share_no_loopback"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


@pytest.mark.parametrize("probe_name", ["cleans_binary_output", "strips_nul_bytes", "strips_terminal_escapes"])
def test_output_probes_escape_without_cleaning(probe_name, make_lab, monkeypatch):
    from orchestrator.sandbox.containers import output

    monkeypatch.setattr(output, "clean", lambda text: text)
    outcome = run_probe(make_lab(), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def test_the_status_line_probe_escapes_when_the_status_follows_the_output(make_lab, monkeypatch):
    from orchestrator.sandbox.box import SandboxResult

    monkeypatch.setattr(SandboxResult, "for_model", lambda self: f"{self.output}\n[exit {self.exit_code}]")
    outcome = run_probe(make_lab(), by_name("status_line_cannot_be_forged"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def test_the_path_tricks_probe_escapes_without_the_hosts_path_check(make_lab, monkeypatch):
    from orchestrator.sandbox import engine

    monkeypatch.setattr(engine, "check_write_path", lambda path: None)
    outcome = run_probe(make_lab(), by_name("write_file_refuses_path_tricks"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def test_the_fifo_write_probe_escapes_a_write_script_that_blocks(make_lab, monkeypatch):
    from orchestrator.escapes import workspace_probes
    from orchestrator.sandbox import engine
    from orchestrator.sandbox.containers import programs

    flags = "os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK"
    assert flags in programs.WRITE_SCRIPT
    blocking = programs.WRITE_SCRIPT.replace(flags, "os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW")
    monkeypatch.setattr(
        engine,
        "write_argv",
        lambda path, append=False, protect_git=True: [
            programs.PYTHON,
            "-I",
            "-c",
            blocking,
            path,
            "append" if append else "write",
            "-",
        ],
    )
    monkeypatch.setattr(workspace_probes, "WRITE_TIMEOUT_S", 3)
    outcome = run_probe(make_lab(), by_name("write_file_does_not_hang_on_fifo"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def _write_script_without(monkeypatch, *checks: tuple[str, str]) -> None:
    """write_file runs the write script with each (line, replacement) of `checks` swapped in."""
    from orchestrator.sandbox import engine
    from orchestrator.sandbox.containers import programs

    weak = programs.WRITE_SCRIPT
    for line, replacement in checks:
        assert line in weak
        weak = weak.replace(line, replacement)
    monkeypatch.setattr(
        engine,
        "write_argv",
        lambda path, append=False, protect_git=True: [
            programs.PYTHON,
            "-I",
            "-c",
            weak,
            path,
            "append" if append else "write",
            "git" if protect_git else "-",
        ],
    )


UP_FRONT_CHECK = ("os.path.realpath(os.path.join(root, rel))", "os.path.normpath(os.path.join(root, rel))")
POST_OPEN_CHECK = ("if not same(fd, name, out):", "if False:")


# Under runsc only: runc refuses the link itself (O_NOFOLLOW, ELOOP or ENOTDIR); gVisor follows a link that
# O_NOFOLLOW | O_DIRECTORY names, which only the write script's checks stop.
@pytest.mark.parametrize("runtime", ["runsc"], indirect=True)
def test_the_folder_swap_probe_escapes_the_write_script_without_its_checks_under_gvisor(make_lab, runtime, monkeypatch):
    """With both of the write script's link checks off (the up-front realpath and the look again at
    each name it opened), the probe's writes made while the box holds the folder as a link to
    .git/hooks (it waits for the host's ack, so every such write meets the link, whatever the
    timing) follow it under gVisor: the probe says ESCAPED on every run, no race to win."""
    _write_script_without(monkeypatch, UP_FRONT_CHECK, POST_OPEN_CHECK)
    outcome = run_probe(make_lab(), by_name("write_file_survives_folder_swap"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


@pytest.mark.parametrize("runtime", ["runc", "runsc"], indirect=True)
def test_the_write_script_refuses_a_link_its_open_met_with_its_up_front_check_off(make_lab, runtime, monkeypatch):
    """The other half: with the up-front check off, each write on the held link reaches the walk,
    as a write does that loses the race (the link swapped in after the check), and the look again
    at what it opened (gVisor) or O_NOFOLLOW (runc) alone refuses it. So the probe's race is
    guarded by that check, shown here without a race."""
    _write_script_without(monkeypatch, UP_FRONT_CHECK)
    outcome = run_probe(make_lab(), by_name("write_file_survives_folder_swap"))
    assert outcome.verdict == HELD, f"said {outcome.verdict}: {outcome.observed}"


class AgentFolderAsWorkspace(DockerSandbox):
    """The agent's whole folder at /workspace (the symlink swap of issue 11
    pointing one level up), commands starting in its workspace/, as root."""

    def container_spec(self, argv, *args, **kwargs):
        config, host = super().container_spec(argv, *args, **kwargs)
        host["mounts"] = [Mount("/workspace", str(self.workspace.parent), type="bind")]
        root_with_default_caps(config, host)  # state/ is root's, workspace/ the agent's
        return config, host

    def _attach_disk(self, policy, attach=True):
        return None

    def run(self, command, timeout_s, max_output_chars):
        from orchestrator.sandbox.containers.programs import command_argv

        return self._call(
            command_argv(command),
            None,
            timeout_s,
            max_output_chars,
            workdir="/workspace/workspace",
            command_env=self.command_env(),
        )


@pytest.mark.parametrize(
    "probe_name",
    [
        "blocks_tool_writes_into_state",
        "blocks_resetting_state_json",
        "blocks_changing_policy_or_mandate",
        "blocks_forging_the_outbox",
    ],
)
def test_state_probes_escape_a_box_that_mounts_the_agent_folder(probe_name, make_lab):
    outcome = run_probe(make_lab(sandbox_class=AgentFolderAsWorkspace), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def _trusting_read(workspace, rel, cap):
    """Follows links, opens what is there, reads 2 MB of anything."""
    with open(workspace / rel, "rb") as fh:
        return fh.read(2_000_000).decode(errors="replace")


def _trusting_journal(workspace):
    from orchestrator.sandbox.disks import workspace_reads

    try:
        return sorted(n for n in os.listdir(workspace / workspace_reads.JOURNAL_DIR) if n.endswith(".md"))
    except OSError:
        return []


@pytest.mark.parametrize(
    "probe_name",
    ["harness_ignores_planted_symlinks", "harness_does_not_hang_on_planted_fifo", "harness_caps_planted_sparse_file"],
)
def test_reader_probes_escape_a_harness_that_trusts_the_workspace(probe_name, make_lab, monkeypatch):
    from orchestrator.escapes import harness_probes
    from orchestrator.sandbox.disks import workspace_reads

    monkeypatch.setattr(workspace_reads, "_read_capped", _trusting_read)
    monkeypatch.setattr(workspace_reads, "journal_names", _trusting_journal)
    monkeypatch.setattr(harness_probes, "HARNESS_READ_DEADLINE_S", 3)
    build = harness_probes._build_prompt

    def build_then_release(t):
        try:
            return build(t)
        finally:
            _release_fifo_readers(t.workspace)  # while the FIFOs are still there to open

    monkeypatch.setattr(harness_probes, "_build_prompt", build_then_release)
    # On a folder: a reader still blocked in a FIFO would keep a disk from being released.
    outcome = run_probe(make_lab(sandbox_class=NoDisk), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"


def _release_fifo_readers(workspace, seconds=10.0):
    """The trusting reader blocks in open() on each planted FIFO in turn: open
    each for writing (which lets its reader through to EOF) until none waits."""
    import stat
    import time

    fifos = [p for p in workspace.rglob("*.md") if stat.S_ISFIFO(p.lstat().st_mode)]
    end, idle = time.monotonic() + seconds, 0
    while fifos and idle < 20 and time.monotonic() < end:
        released = False
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                released = True
            except OSError:
                pass  # ENXIO: nobody reads it now
        idle = 0 if released else idle + 1
        time.sleep(0.05)


# -- every probe is shown able to fail --------------------------------------------------

COVERED_HERE = (
    {p for _, p in CASES}
    | set(DISK_PROBES)
    | {p for _, p in PROXY_CASES}
    | {p for _, p, _ in CREDENTIAL_CASES}
    | set(GIT_PROBES)
    | {p for _, p, _ in BROKER_CASES}
    | {p for _, p in SANDBOX_CLASSES}
    | {
        "blocks_orchestrator_raising_the_box",
        "allowlist_has_no_direct_route",
        "blocks_planted_python_on_policy_path",
        "blocks_bare_repo_hook_write",
        "blocks_leaked_host_fds",
        "caps_workspace_file_size",
        "bounds_huge_output",
        "image_has_no_baked_secrets",
        "caps_all_disks_together",
        "kills_background_processes",
        "leaves_no_container_behind",
        "survives_fork_bomb",
        "survives_million_small_files",
        "kills_at_deadline",
        "ends_call_with_ptrace_stopped_init",
        "boxes_share_no_loopback",
        "cleans_binary_output",
        "strips_nul_bytes",
        "strips_terminal_escapes",
        "status_line_cannot_be_forged",
        "write_file_refuses_path_tricks",
        "write_file_does_not_hang_on_fifo",
        "write_file_survives_folder_swap",
        "blocks_tool_writes_into_state",
        "blocks_resetting_state_json",
        "blocks_changing_policy_or_mandate",
        "blocks_forging_the_outbox",
        "harness_ignores_planted_symlinks",
        "harness_does_not_hang_on_planted_fifo",
        "harness_caps_planted_sparse_file",
        "credentials_only_to_their_host",
        "credentials_out_of_the_box",
    }
)


def _surface_controls() -> set[str]:
    """The probes shown able to fail by tests/escapes/test_surfaces_*.py, one file per
    surface, each naming its own in COVERED."""
    import importlib.util

    names: set[str] = set()
    for path in sorted(Path(__file__).parent.glob("test_surfaces_*.py")):
        spec = importlib.util.spec_from_file_location(f"_controls_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        names |= module.COVERED
    return names


def test_every_probe_has_a_weakened_control():
    from orchestrator.escapes import ALL_PROBES
    from tests.escapes.test_weakened_editor import COVERED as EDITOR_COVERED
    from tests.escapes.test_weakened_transaction import COVERED as TRANSACTION_COVERED

    covered = COVERED_HERE | _surface_controls() | TRANSACTION_COVERED | EDITOR_COVERED
    missing = sorted(p.name for p in ALL_PROBES if p.name not in covered)
    assert not missing, f"probes never shown able to fail: {missing}"
    assert {p.name for p in ALL_PROBES} >= covered
