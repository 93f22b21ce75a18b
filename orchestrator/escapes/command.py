"""`wakeloop escapes [AGENT_DIR | --policy FILE] [--runtime R] [--json]`.

Runs every probe against the live engine under the chosen policy, each in a
throwaway agent under a temp dir (never the real agent's workspace: probes
fill, plant and break things), then checks the host, prints the report card
and exits 1 if anything did not hold. Progress goes to stderr as it runs. The
report is written whatever a probe did or left: a trial whose cleanup failed
(a disk another mount namespace holds) is an INCONCLUSIVE probe that says what
it left and how to release it, and the run goes on.

With `--broker ADDRESS --root ROOT [--node NAME]` the probes that attack the
box alone (registry.THROUGH_A_BROKER) run through that broker instead, over
its wire (mutual TLS for tls://): each in a throwaway agent directly under
the broker's ROOT, paused so that serve never wakes it, removed after.

Not here: the probes and their runner (lab.py), the report card (report.py),
where reports are kept for the console (records/escape_reports.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import docker.errors
import yaml

from orchestrator.broker import nodes, tls
from orchestrator.escapes.host import WARNING, HostCheck, check_host
from orchestrator.escapes.lab import HELD, NO_ENGINE, Lab, Probe, run_suite, temp_lab
from orchestrator.escapes.registry import ALL_PROBES, THROUGH_A_BROKER
from orchestrator.escapes.report import failed, json_report, text_report
from orchestrator.policy.agent import AgentError, load_agent
from orchestrator.policy.load import load_policy, policy_from_mapping
from orchestrator.policy.schema import Policy
from orchestrator.records import escape_reports
from orchestrator.records.events import now_iso
from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.containers.engine_client import check_image, connect
from orchestrator.sandbox.disks import disk, disk_attach

EXIT_HELD, EXIT_ESCAPED = 0, 1


@dataclass(frozen=True)
class Through:
    """`--broker ADDRESS --root ROOT [--node NAME]`: the probes' boxes a remote broker's."""

    address: str
    root: str
    node: str | None = None


def choose_policy(agent_dir: str | None, policy_file: str | None) -> Policy:
    if agent_dir and policy_file:
        raise AgentError("escapes: give AGENT_DIR or --policy FILE, not both")
    if agent_dir:
        return load_agent(agent_dir).policy
    if policy_file:
        return load_policy(policy_file)
    return Policy(source="the default policy")


def run(
    agent_dir: str | None,
    policy_file: str | None,
    runtime: str | None,
    as_json: bool,
    only: list[str] | None = None,
    through: Through | None = None,
) -> int:
    if through:
        lab, probes, where = _remote_lab(through, agent_dir, policy_file, runtime, only)
    else:
        lab, probes = _local_lab(agent_dir, policy_file, runtime, only)
        where = f"runtime {lab.policy.runtime}"
    print(
        f"escapes: {len(probes)} probes under {lab.policy_source}, {where}; this takes a few minutes",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    try:
        outcomes = run_suite(lab, probes, progress=_progress)
    finally:
        lab.close()
    if lab.kept:
        folders = ", ".join(str(folder) for folder in lab.kept)
        print(f"escapes: kept {folders}: a disk of theirs is left (the report says how to release it)", file=sys.stderr)
    seconds = time.monotonic() - started
    host = _host(lab, where, through, outcomes)
    doc = json_report(
        outcomes,
        host,
        {
            "policy": lab.policy_source,
            "runtime": lab.policy.runtime,
            "seconds": round(seconds, 1),
            "finished_at": now_iso(),
            "probes_run": "all" if not only and not through else len(probes),
            **({"through": where} if through else {}),
        },
    )
    try:
        kept = escape_reports.save(json.loads(doc))
    except OSError as exc:
        print(f"escapes: the report was not kept for the console: {exc}", file=sys.stderr)
    else:
        print(f"escapes: report kept in {kept}", file=sys.stderr)
    if as_json:
        print(doc)
    else:
        header = f"wakeloop escapes: {len(outcomes)} probes, policy {lab.policy_source}, {where}, {seconds:.0f} s"
        print(text_report(outcomes, host, header))
    return EXIT_ESCAPED if failed(outcomes) else EXIT_HELD


def _host(lab: Lab, where: str, through: Through | None, outcomes: list) -> list[HostCheck]:
    """The host's checks; an engine that stopped answering is a warning in the report, not its end."""
    if through:
        return [HostCheck("host", WARNING, f"not checked: the engine is {where}'s", "run `wakeloop escapes` there")]
    try:
        return check_host(lab.client, lab.policy.runtime, {o.probe: o.verdict for o in outcomes})
    except docker.errors.DockerException as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return [HostCheck("host", WARNING, f"not checked: the engine did not answer ({first})", "run it again")]


def _chosen(only: list[str] | None, among: Sequence[Probe]) -> list[Probe]:
    unknown = sorted(set(only or ()) - {p.name for p in ALL_PROBES})
    if unknown:
        raise AgentError(f"escapes: no probe named {unknown[0]!r}; `wakeloop escapes --list` names them all")
    local = sorted(set(only or ()) - {p.name for p in among})
    if local:
        raise AgentError(f"escapes: {local[0]} runs only on this host's engine, not through a broker")
    return [p for p in among if not only or p.name in only]


def _local_lab(
    agent_dir: str | None, policy_file: str | None, runtime: str | None, only: list[str] | None
) -> tuple[Lab, list[Probe]]:
    policy = choose_policy(agent_dir, policy_file)
    sandbox = replace(policy.sandbox, runtime=runtime) if runtime else policy.sandbox
    _disks_attachable(sandbox.disk, whole_suite=not only)
    client = connect()
    known = sorted((client.info().get("Runtimes") or {}).keys())
    if sandbox.runtime not in known:
        raise SandboxError(
            f"runtime {sandbox.runtime!r} is not registered with the engine (it knows "
            f"{', '.join(known)}); for runsc run scripts/setup-runsc.sh"
        )
    warning = check_image(client, sandbox.image)
    if warning:
        print(warning, file=sys.stderr)
    probes = _chosen(only, ALL_PROBES)
    return temp_lab(client, sandbox, tools=policy.tools, policy_source=policy.source), probes


def _disks_attachable(policy_disk: int, whole_suite: bool) -> None:
    """One line before any probe where the run would need a disk this process cannot attach:
    the policy's, or (as any user but root) the disk probes' own, which the whole suite runs."""
    reason = disk_attach.unavailable()
    if reason and (policy_disk or (whole_suite and os.geteuid() != 0)):
        raise disk.DiskError(
            f"escapes: {reason}, and the suite attaches workspace disks; run it as root "
            "(`sudo wakeloop escapes`), or only the box's probes through the broker "
            "(`wakeloop escapes --broker ADDRESS --root ROOT --policy FILE`, a policy with `sandbox.disk: none`)"
        )


def _remote_lab(
    through: Through, agent_dir: str | None, policy_file: str | None, runtime: str | None, only: list[str] | None
) -> tuple[Lab, list[Probe], str]:
    """A lab whose trials are agents of the broker's ROOT, paused, their policy inline in agent.yaml."""
    if agent_dir:
        raise AgentError("escapes --broker: give the policy as --policy FILE (the probes' agents get it inline)")
    mapping = _policy_mapping(policy_file)
    source = policy_file or "the default policy with sandbox.disk: none"
    policy = policy_from_mapping(mapping, source)  # checked before it is changed: its sandbox is a mapping
    if runtime:
        mapping["sandbox"] = {**(mapping.get("sandbox") or {}), "runtime": runtime}
        policy = policy_from_mapping(mapping, source)
    if policy.sandbox.disk:
        raise AgentError(
            f"escapes --broker: {source} gives its agents a disk; through a broker the probes' agents "
            "need `sandbox.disk: none` (their disks' images would stay on the broker's host)"
        )
    if not Path(through.root, ".").is_dir():
        raise AgentError(f"escapes --broker: {through.root} is not a folder (--root: the ROOT the broker serves)")
    address, node = _broker_of(through)
    probes = _chosen(only, THROUGH_A_BROKER)
    try:
        lab = Lab(
            NO_ENGINE,
            policy.sandbox,
            Path(through.root),
            tools=policy.tools,
            policy_source=source,
            broker=address,
            agent_policy=mapping,
        )
    except OSError as exc:  # ROOT not ours to write: one line, not a traceback
        raise AgentError(f"escapes --broker: cannot make the probes' agents under {through.root}: {exc}") from None
    return lab, probes, f"through the broker {('of node ' + node + ' ') if node else ''}at {address}"


def _policy_mapping(policy_file: str | None) -> dict:
    if not policy_file:
        return {"sandbox": {"disk": "none"}}
    try:
        mapping = yaml.safe_load(Path(policy_file).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise AgentError(f"escapes: cannot read {policy_file}: {exc}") from None
    if not isinstance(mapping, dict):
        raise AgentError(f"escapes: {policy_file} is not a policy (a mapping of sections)")
    return mapping


def _broker_of(through: Through) -> tuple[str, str]:
    """(address, node name) of the broker the probes go to: --node's, else the first node's by name."""
    if not through.address.startswith(tls.SCHEME):
        return through.address, ""
    found = nodes.answering(through.address)
    if not through.node:
        first = next(iter(found.values()), None)
        return (first.address, first.name) if first else (through.address, "")
    try:
        chosen = nodes.pick(found, through.node, through.address)
    except nodes.NodeUnavailable as exc:
        raise AgentError(f"escapes --node: {exc}") from None
    return chosen.address, chosen.name


def list_probes(as_json: bool = False) -> int:
    if as_json:
        print(
            json.dumps([{"name": p.name, "category": p.category, "expected": p.expected} for p in ALL_PROBES], indent=2)
        )
        return EXIT_HELD
    for p in ALL_PROBES:
        print(f"{p.category:12} {p.name:40} {p.expected}")
    return EXIT_HELD


def _progress(index: int, total: int, outcome) -> None:
    mark = "" if outcome.verdict == HELD else f"  <- {outcome.observed[:100]}"
    print(
        f"[{index:>2}/{total}] {outcome.verdict:<12} {outcome.probe} ({outcome.seconds:.1f} s){mark}",
        file=sys.stderr,
        flush=True,
    )
