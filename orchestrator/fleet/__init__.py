"""Many agents: the scheduler that wakes them, and the views that show them.

scheduler.py (`wakeloop serve`: ticks, concurrency, hot reload, shutdown),
views.py (status, the status table and the readable event log: the one
place records are rendered for a person, for the CLI and --json alike),
logview.py (a transcript rendered, a running wake or a whole root followed),
control.py (serve's heartbeat, run-now requests).

The top layer beneath cli.py: may import anything below it.
"""
