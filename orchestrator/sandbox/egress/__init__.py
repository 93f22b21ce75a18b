"""Egress: what a box may reach, and how.

The allowlist's proxy and networks (network.py), one empty network namespace
for a sandbox's gVisor boxes (netns.py).

May import: containers/, disks/ (docs/architecture.md §2).
Not here: the egress record (records/egress.py), the engine's rate (rate.py).
"""
