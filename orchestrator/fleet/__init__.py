"""Many agents: the scheduler that wakes them, when, and what serve leaves on disk for others.

scheduler.py (`wakeloop serve`: ticks, concurrency, hot reload, shutdown,
a failing agent's backoff and pause obeyed), schedule.py (when each agent is
due; what its line may say: policy/schedule_line.py), capacity.py (how many
wakes fit at once), control.py (serve's heartbeat, run-now requests),
wake_history.py (an agent's finished wakes, indexed for the console).

Sits above wake/: may import anything below it. Not here: showing any of it
to a person (views/), the failure streak's file (records/health.py).
"""
