"""What lands in an agent's state/ (and the few files wakeloop keeps beside it): what each holds.

state.py (state.json, the wake lock, inbox and outbox), events.py (the
append-only event log), event_types.py (one record per event type),
receipt.py (a wake's Usage, EgressSum and Receipt, one name per token count),
egress.py (the egress proxy's decisions, one a line, checked and cut),
ledger.py (prices, the USD ledger and the per-wake meter), tasks.py (the task
queue), health.py (an agent's failure streak: backoff and pause, which the
scheduler obeys), transcript.py (every wake's words, bounded and pruned),
retention.py (what keeps state/ bounded), approvals.py and approval_links.py
(calls that wait for a person), stopswitch.py (ROOT/STOP), placement.py (an
agent's node), run_ids.py (a run id as a person types it), models.py (what
each model accepts), escape_reports.py (the last escape report per runtime
and policy, for the console).

Every file is read and written through the safe-I/O base below (safeio/:
the walk of an agent folder, atomic writes and locks, untrusted JSON and
YAML, the secret names). Imports nothing of wakeloop's but safeio/ and its
errors. Records hold data; rendering them for a person is views/' job.

Not here: how a file is walked, written or parsed (safeio/), how it is shown (views/).
"""
