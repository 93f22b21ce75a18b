"""Every probe can fail: the same probe reports ESCAPED against a box with one
hardening removed.

Weakened boxes exist only here, as subclasses overriding container_spec;
product code never builds one. Weakened allowlist proxies are built from
tests/squidconf.py's configs, patched in for one test; each allowlist probe
starts its own proxy and only ever reaches its own server container. Their containers keep the product's labels
(workspace under this session's temp dir), so the no-leftover check covers
them. The bridge-network box is judged by its interfaces and routing table
only: no probe dials out of it.
"""

from __future__ import annotations

import os
import socket

import pytest
from docker.types import Mount, Ulimit

from orchestrator.policy.ceiling import Ceiling
from orchestrator.escapes import ESCAPED, by_name
from orchestrator.escapes.core import run_probe
from orchestrator.escapes.network import ROUTE_ONLY
from orchestrator.sandbox.programs import GUARD_ENV, LAUNCH_ARGV, LAUNCHER_ENV


from orchestrator.policy.schema import Tools, WriteFileTool
from orchestrator.sandbox.engine import DockerSandbox
from orchestrator.sandbox.programs import guarded
from orchestrator.sandbox import network
from squidconf import squid_allowing_everything, squid_without_address_rules


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
    host["ulimits"] = [u for u in host["ulimits"] if u["Name"] != "nofile"] + \
        [Ulimit(name="nofile", soft=8192, hard=8192)]


def no_cpu_quota(config, host):
    del host["nano_cpus"]


def host_block_device(config, host):
    disk = next(d for d in ("/dev/loop0", "/dev/vda", "/dev/sda", "/dev/nvme0n1") if os.path.exists(d))
    host["devices"] = [f"{disk}:/dev/probe-disk:r"]   # only stat()ed by the probe, never read


def dumpable_launcher(config, host):
    """The pool launcher without PR_SET_DUMPABLE 0: the command can read its memory."""
    env = config["environment"]
    if LAUNCHER_ENV in env:
        env[LAUNCHER_ENV] = env[LAUNCHER_ENV].replace("ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0", "False")


def set_id_bits_kept(config, host):
    """Neither the pool launcher nor the cold path's guard clears set-id bits."""
    env = config["environment"]
    for name in (LAUNCHER_ENV, GUARD_ENV):
        if name in env:
            assert "\nstrip_setid()\n" in env[name]
            env[name] = env[name].replace("\nstrip_setid()\n", "\n")


def no_file_size_limit(config, host):
    host["ulimits"] = [u for u in host["ulimits"] if u["Name"] != "fsize"]


class NoDisk(DockerSandbox):
    """The workspace by its host path (a bind mount), whatever sandbox.disk says."""

    def _attach_disk(self, policy, attach=True):
        return None


DISK_PROBES = ["caps_workspace_disk", "caps_workspace_fallocate", "caps_workspace_files",
               "hides_workspace_host_path"]


@pytest.mark.parametrize("probe_name", DISK_PROBES)
def test_disk_probes_escape_a_box_without_its_disk(probe_name, make_lab):
    outcome = run_probe(make_lab(sandbox_class=NoDisk), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"no disk: {probe_name} said {outcome.verdict}: {outcome.observed}"


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
    (set_id_bits_kept, "blocks_setuid_bit_reaching_host"),
]


@pytest.fixture(params=["runc"])
def runtime(request):
    """The controls run on runc: they show each probe can fail, which needs
    a runtime that honours the weakened flag (gVisor ignores several)."""
    return request.param


@pytest.mark.parametrize("weakening, probe_name", CASES,
                         ids=[f"{w.__name__}-{p}" for w, p in CASES])
def test_probe_escapes_weakened_box(weakening, probe_name, make_lab, monkeypatch):
    if weakening is bridge_network:
        assert probe_name in ROUTE_ONLY  # a box with a network is only ever read, never dialled from
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


# -- the allowlist proxy: its squid.conf weakened, each probe's own server reached --------

PROXY_CASES = [
    (squid_without_address_rules, "allowlist_refuses_private_destination"),
    (squid_without_address_rules, "allowlist_refuses_proxy_gateway_and_neighbours"),
    (squid_allowing_everything, "allowlist_refuses_unlisted_host"),
]


@pytest.mark.parametrize("weakening, probe_name", PROXY_CASES,
                         ids=[f"{w.__name__}-{p}" for w, p in PROXY_CASES])
def test_allowlist_probe_escapes_a_weakened_proxy(weakening, probe_name, make_lab, monkeypatch):
    # Each probe starts its own proxy, from this config; the only server it can
    # reach is the probe's own container on this machine.
    monkeypatch.setattr(network, "squid_config", weakening)
    outcome = run_probe(make_lab(), by_name(probe_name))
    assert outcome.verdict == ESCAPED, f"{weakening.__name__}: {probe_name} said {outcome.verdict}: {outcome.observed}"
    assert "logged" in outcome.observed   # the probe's own server saw the request


def test_allowlist_route_probe_escapes_a_box_on_the_bridge(make_lab):
    # Reads the routing table and makes UDP connect()s, which send nothing.
    outcome = run_probe(make_lab(sandbox_class=weakened(bridge_network)),
                        by_name("allowlist_has_no_direct_route"))
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
    outcome = run_probe(make_lab(sandbox_class=starts_python3_by_name(only_pooled)),
                        by_name("blocks_planted_python_on_policy_path"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert ("for the pooled bash call" if only_pooled else "for the cold bash call") in outcome.observed


GIT_PROBES = ["blocks_gitdir_pointer_write", "blocks_submodule_hook_write", "blocks_bare_repo_hook_write",
              "blocks_case_variant_git_hook"]


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
    return Path(path).read_text(encoding="utf-8")   # follows anything, opens FIFOs, reads it all


def _count_only(self, name):
    with self._lock:
        self._calls[name] = self._calls.get(name, 0) + 1   # counted, never refused


BROKER_CASES = [   # (what is switched off, the probe that must now report ESCAPED, what it says)
    ("NoAliasLoader.compose_node", "broker_refuses_yaml_alias_bomb", "refused, but not for what was planted"),
    ("read_config", "broker_refuses_fifo_policy", "did not answer within"),
    ("read_config", "broker_refuses_device_or_huge_policy", "the broker served check"),
    ("real_agent_dir", "broker_refuses_symlinked_agent_dir", "twin: the broker served check"),
    ("_cut", "broker_bounds_its_log_lines", "broker log lines of"),
    ("REQUEST_READ_S", "broker_bounds_silent_connections", "that sent nothing were still open"),
    ("_take_call_slot", "broker_bounds_calls_in_flight", "ran past max.calls_per_agent"),
    ("_user_refusal", "broker_refuses_user_over_ceiling", "the broker served check"),
    ("_env_refusal", "broker_refuses_env_name_over_ceiling", "the broker served check"),
    ("_host_refusal", "broker_refuses_host_over_ceiling", "the broker served check"),
    ("_close_box", "broker_retires_egress_on_allowlist_churn", "retired allowlist proxy set(s)"),
    ("_attach_disk", "pins_workspace_against_symlink_swap", "saw the canary"),
]


def _switch_off(what, monkeypatch):
    import yaml
    from orchestrator.broker import server
    from orchestrator.policy import agent, schema
    off = {
        "NoAliasLoader.compose_node": lambda: monkeypatch.setattr(
            schema.NoAliasLoader, "compose_node", yaml.SafeLoader.compose_node),
        "read_config": lambda: (monkeypatch.setattr(schema, "read_config", _naive_read),
                                monkeypatch.setattr(agent, "read_config", _naive_read)),
        "real_agent_dir": lambda: monkeypatch.setattr(server, "real_agent_dir", lambda root, name: root / name),
        "_cut": lambda: monkeypatch.setattr(server, "_cut", lambda text, limit: text),
        "REQUEST_READ_S": lambda: monkeypatch.setattr(server, "REQUEST_READ_S", 3600.0),
        "_take_call_slot": lambda: monkeypatch.setattr(server.Broker, "_take_call_slot", _count_only),
        "_user_refusal": lambda: monkeypatch.setattr(Ceiling, "_user_refusal", lambda self, p, u: None),
        "_env_refusal": lambda: monkeypatch.setattr(Ceiling, "_env_refusal", lambda self, p: None),
        "_host_refusal": lambda: monkeypatch.setattr(Ceiling, "_host_refusal", lambda self, p: None),
        "_close_box": lambda: monkeypatch.setattr(server.Broker, "_close_box", lambda self, box: box.close()),
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
    from orchestrator.escapes.orchestrator import PROBES
    assert {p.name for p in PROBES} == {name for _, name, _ in BROKER_CASES}


def test_the_setuid_probe_escapes_when_a_killed_walker_is_trusted(make_lab, monkeypatch):
    # The host's old rule: only a call killed at its deadline or out of memory gets a sweep.
    from orchestrator.sandbox import engine
    monkeypatch.setattr(engine, "_walked", lambda result, end: not (result.timed_out or result.oom_killed))
    outcome = run_probe(make_lab(), by_name("blocks_setuid_bit_reaching_host"))
    assert outcome.verdict == ESCAPED, f"said {outcome.verdict}: {outcome.observed}"
    assert "killed its walker" in outcome.observed
