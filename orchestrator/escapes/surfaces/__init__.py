"""Attacks on the ring around the box: the console, notifications, metrics,
the files wakeloop keeps in an agent folder, and the workspace disks.

The attackers here are not the model's shell but those around it (docs/security.md,
"Threat model"): what the model writes that reaches a person or a file we
keep (A), a web page in the operator's browser and any other local user (C),
and whoever may write one agent folder under a shared ROOT (D). Every probe
runs against a real console on 127.0.0.1, a real receiver of our own, or
files planted in its trial's own folder, and each runs once, whatever the
runtime. Only the disk probes make boxes (cold ones, on their trial's own
agents): a disk is attached by a box.

One module per surface: console.py, approval_probes.py, notify.py, records.py, disks.py,
wire_probes.py (the broker's wire over TCP, attacked by a peer on the network), and
egress_probes.py (the egress record and its views).

Not here: the model's attacks from inside the box (the other escapes modules).
"""

from orchestrator.escapes.surfaces import approval_probes, console, disks, egress_probes, notify, records, wire_probes

CATEGORY = "surfaces"
PROBES = (
    console.PROBES
    + approval_probes.PROBES
    + notify.PROBES
    + records.PROBES
    + disks.PROBES
    + wire_probes.PROBES
    + egress_probes.PROBES
)
