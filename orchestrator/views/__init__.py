"""What a person reads: the status views the CLI prints and the console shows.

status.py (an agent's status, the fleet table, disks, budgets, the readable
event log: the one place records are rendered for a person, for the CLI and
--json alike), logview.py (a transcript rendered, a running wake or a whole
root followed), fleet_approvals.py (what waits for a person across a fleet),
egressview.py (the egress proxy's decisions, a line each: `log --egress`).

Sits above fleet/ and below console/ and cli/: may import fleet/ and
everything below it; fleet/ never imports it.
"""
