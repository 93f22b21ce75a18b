"""`wakeloop escapes [AGENT_DIR | --policy FILE] [--runtime R] [--json]`.

Runs every probe against the live engine under the chosen policy, each in a
throwaway agent under a temp dir (never the real agent's workspace: probes
fill, plant and break things), then checks the host, prints the report card
and exits 1 if anything did not hold. Progress goes to stderr as it runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace

from orchestrator.policy.agent import AgentError, load_agent
from orchestrator.policy.load import load_policy
from orchestrator.policy.schema import Policy
from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.engine import check_image, connect
from orchestrator.escapes.core import HELD, run_suite, temp_lab
from orchestrator.escapes.host import check_host
from orchestrator.escapes.registry import ALL_PROBES
from orchestrator.escapes import report_history
from orchestrator.escapes.report import failed, json_report, text_report
from orchestrator.records.events import now_iso

EXIT_HELD, EXIT_ESCAPED = 0, 1


def choose_policy(agent_dir: str | None, policy_file: str | None) -> Policy:
    if agent_dir and policy_file:
        raise AgentError("escapes: give AGENT_DIR or --policy FILE, not both")
    if agent_dir:
        return load_agent(agent_dir).policy
    if policy_file:
        return load_policy(policy_file)
    return Policy(source="the default policy")


def run(
    agent_dir: str | None, policy_file: str | None, runtime: str | None, as_json: bool, only: list[str] | None = None
) -> int:
    policy = choose_policy(agent_dir, policy_file)
    sandbox = replace(policy.sandbox, runtime=runtime) if runtime else policy.sandbox
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
    unknown = sorted(set(only or ()) - {p.name for p in ALL_PROBES})
    if unknown:
        raise AgentError(f"escapes: no probe named {unknown[0]!r}; `wakeloop escapes --list` names them all")
    probes = [p for p in ALL_PROBES if not only or p.name in only]
    lab = temp_lab(client, sandbox, tools=policy.tools)
    base = lab.base
    print(
        f"escapes: {len(probes)} probes under {policy.source}, runtime {sandbox.runtime}; this takes a few minutes",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    try:
        outcomes = run_suite(lab, probes, progress=_progress)
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)
    seconds = time.monotonic() - started
    host = check_host(client, sandbox.runtime, {o.probe: o.verdict for o in outcomes})
    doc = json_report(
        outcomes,
        host,
        {
            "policy": policy.source,
            "runtime": sandbox.runtime,
            "seconds": round(seconds, 1),
            "finished_at": now_iso(),
            "probes_run": "all" if not only else len(probes),
        },
    )
    try:
        kept = report_history.save(json.loads(doc))
    except OSError as exc:
        print(f"escapes: the report was not kept for the console: {exc}", file=sys.stderr)
    else:
        print(f"escapes: report kept in {kept}", file=sys.stderr)
    if as_json:
        print(doc)
    else:
        header = (
            f"wakeloop escapes: {len(outcomes)} probes, policy {policy.source}, "
            f"runtime {sandbox.runtime}, {seconds:.0f} s"
        )
        print(text_report(outcomes, host, header))
    return EXIT_ESCAPED if failed(outcomes) else EXIT_HELD


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
