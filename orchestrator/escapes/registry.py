"""Every probe, in the order the report shows them, grouped by category."""

from __future__ import annotations

from orchestrator.escapes import (
    allowlist,
    broker_probes,
    credentials,
    editor_probes,
    egress_cap,
    engine_mount_probes,
    filesystem,
    harness_probes,
    information,
    network_probes,
    persistence,
    privileges,
    resources,
    surfaces,
    transaction_probes,
    workspace_probes,
)

CATEGORIES = (
    "filesystem",
    "workspace",
    "privileges",
    "network",
    "allowlist",
    "information",
    "persistence",
    "resources",
    "harness",
    "orchestrator",
    "surfaces",
)

ALL_PROBES = (
    filesystem.PROBES
    + workspace_probes.PROBES
    + editor_probes.PROBES
    + transaction_probes.PROBES
    + engine_mount_probes.PROBES
    + privileges.PROBES
    + network_probes.PROBES
    + allowlist.PROBES
    + credentials.PROBES
    + information.PROBES
    + persistence.PROBES
    + resources.PROBES
    + egress_cap.PROBES
    + harness_probes.PROBES
    + broker_probes.PROBES
    + surfaces.PROBES
)


# The probes that attack the box alone, through its run and write, so that they run unchanged
# through a broker (`wakeloop escapes --broker`, tests/escapes/test_through_a_broker.py). Left out:
# those that read the engine (containers, networks, images, CPU samples) or make a box of their
# own (another policy, a cold box, another workspace), which a broker takes from no wire; the
# broker's own probes, which serve a broker of their own; kills_at_deadline (the deadline is the
# broker's reading of the policy, not the caller's: test_broker holds it); hides_workspace_host_path
# (a swarm's brokers take only `sandbox.disk: none`, whose host path shows: docs/security.md);
# and the surfaces', which attack this process's files and pages, not a box.
_THROUGH_A_BROKER = set(
    [
        "blocks_write_outside_workspace",
        "blocks_reading_host_files",
        "blocks_proc_1_root",
        "blocks_overwriting_proc_self_exe",
        "blocks_leaked_host_fds",
        "blocks_mount",
        "blocks_pivot_root",
        "blocks_chroot",
        "blocks_device_nodes",
        "blocks_writes_to_sys",
        "blocks_writes_to_proc_sys",
        "blocks_setuid_binaries",
        "write_file_refuses_path_tricks",
        "write_file_refuses_symlinks",
        "write_file_survives_symlink_swap",
        "write_file_does_not_hang_on_fifo",
        "blocks_hardlink_outside_workspace",
        "caps_sparse_file_size",
        "runs_as_unprivileged_user",
        "holds_no_capabilities",
        "sets_no_new_privs",
        "enforces_seccomp_filter",
        "blocks_unshare_namespaces",
        "blocks_ptrace_outside_box",
        "blocks_keyctl",
        "blocks_bpf",
        "blocks_perf_event_open",
        "blocks_io_uring",
        "blocks_kernel_modules",
        "blocks_setcap_on_workspace_file",
        "blocks_tiocsti",
        "blocks_setuid_root",
        "blocks_setuid_bit_at_creation",
        "blocks_setuid_bit_through_i386_abi",
        "has_no_interface_but_lo",
        "has_no_default_route",
        "has_no_dns",
        "has_no_route_to_metadata",
        "blocks_raw_and_packet_sockets",
        "hides_api_key",
        "uses_neutral_hostname",
        "hides_host_process_list",
        "hides_other_agents_workspaces",
        "hides_docker_socket",
        "forgets_files_outside_workspace",
        "kills_background_processes",
        "workspace_cannot_hijack_commands",
        "caps_process_count",
        "caps_memory",
        "caps_tmp_size",
        "caps_dev_shm_size",
        "caps_workspace_file_size",
        "caps_open_files",
        "bounds_huge_output",
        "cleans_binary_output",
        "strips_nul_bytes",
        "strips_terminal_escapes",
        "status_line_cannot_be_forged",
        "blocks_tool_writes_into_state",
        "blocks_resetting_state_json",
        "blocks_changing_policy_or_mandate",
        "blocks_forging_the_outbox",
        "harness_ignores_planted_symlinks",
        "harness_does_not_hang_on_planted_fifo",
        "harness_caps_planted_sparse_file",
        "blocks_gitdir_pointer_write",
        "blocks_submodule_hook_write",
        "blocks_bare_repo_hook_write",
        "blocks_case_variant_git_hook",
    ]
)
THROUGH_A_BROKER = tuple(p for p in ALL_PROBES if p.name in _THROUGH_A_BROKER)


def by_name(name: str):
    for probe in ALL_PROBES:
        if probe.name == name:
            return probe
    raise KeyError(name)
