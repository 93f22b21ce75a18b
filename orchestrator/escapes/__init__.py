"""The escape suite: attacks run against the live engine under a given policy.

Each probe is one attack named for what it tries (`blocks_write_outside_workspace`),
run inside a real sandbox call or checked on the host, and judged by one rule
(`verdict` in lab.py). `wakeloop escapes` runs them all and prints a report card;
tests/escapes/ runs them in CI and against deliberately weakened boxes, so every
probe is shown able to fail.

Layout: lab.py (probe, trial, verdict, runner), one module per category of
attack (setid.py, set-id bits by every syscall and ABI, is listed under
privileges), host.py (what no probe inside can see: engine and runc versions, daemon
mode, seccomp profile), report.py (the table).

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
