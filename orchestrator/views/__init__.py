"""What a person reads: the status views the CLI prints and the console shows.

One module per thing read, each gathering plain data (what --json prints and
the console shows) and rendering it as text: agent_status.py (one agent's
status: model, wakes, spending, tasks, health, notifications), fleet_table.py
(the fleet's table, a row per agent, and the lines above it), diskview.py
(an agent's disk use, `wakeloop disk list`), budgetview.py (what the fleet
spent against its caps, the cost per day), eventview.py (the event log, a
line per event), logview.py (a transcript rendered, a running wake or a
whole root followed), fleet_approvals.py (what waits for a person across a
fleet), egressview.py (the egress proxy's decisions, a line each: `log
--egress`), diffview.py (one wake's diff), model_table.py (the models).

Sits above fleet/ and below console/ and cli/: may import fleet/ and
everything below it; fleet/ never imports it.
"""
