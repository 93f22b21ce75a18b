"""The escape suite: attacks run against the live engine under a given policy.

Each probe is one attack named for what it tries (`blocks_write_outside_workspace`),
run inside a real sandbox call or checked on the host, and judged by one rule
(`verdict` in lab.py). `wakeloop escapes` runs them all and prints a report card;
tests/escapes/ runs them in CI and against deliberately weakened boxes, so every
probe is shown able to fail.

Layout, by role: lab.py (the probe, its trial, the verdict, the runner),
registry.py (every probe, in the report's order), command.py (`wakeloop
escapes`), host.py (what no probe inside can see: engine and runc versions,
daemon mode, seccomp profile), report.py (the card); the last report is kept
below, in records/escape_reports.py. The probes, one module per thing
attacked, by actor (docs/architecture.md §3): the model in the box (A) in
filesystem.py, workspace_probes.py, transaction_probes.py,
engine_mount_probes.py, privileges.py (with setid.py), network_probes.py,
allowlist.py, credentials.py, egress_cap.py, information.py, persistence.py,
resources.py and harness_probes.py (the host's own files and readers); a
taken-over orchestrator (B) in broker_probes.py; the ring around the box
(A beyond it, C, D, E) in surfaces/.

Not here: fixing anything. A probe that escapes is reported, never softened.
"""

from orchestrator.escapes.lab import ESCAPED, HELD, INCONCLUSIVE, Lab, Outcome, Probe, run_suite, verdict
from orchestrator.escapes.registry import ALL_PROBES, CATEGORIES, by_name

__all__ = [
    "ALL_PROBES",
    "CATEGORIES",
    "ESCAPED",
    "HELD",
    "INCONCLUSIVE",
    "Lab",
    "Outcome",
    "Probe",
    "by_name",
    "run_suite",
    "verdict",
]
