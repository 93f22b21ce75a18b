"""Egress: what a box may reach, and how.

The allowlist's plan, what a policy lets a box reach (egress_plan.py), its proxy
and networks (network.py), one empty network namespace for a sandbox's gVisor
boxes (netns.py).

May import: containers/, disks/ (docs/architecture.md §2).
Not here: the egress record (records/egress.py), the engine's rate (rate.py).
"""
