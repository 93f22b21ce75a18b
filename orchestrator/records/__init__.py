"""What lands in an agent's state/: plain files, written atomically, read back.

safeio/folder.py (the one walk of an agent folder: every host-side read, write and
delete there, no link followed, never a FIFO or device, capped), safeio/jsontext.py
(JSON read back, a nesting bomb refused), safeio/atomic.py (atomic write, advisory
locks), state.py (state.json, the wake lock, inbox and outbox), events.py
(the append-only event log), event_types.py (one record per event type),
receipt.py (a wake's Usage, EgressSum and Receipt, one name per token count),
egress.py (the egress proxy's decisions, one a line, checked and cut),
ledger.py (prices, the USD ledger and the per-wake meter), tasks.py (the task
queue), health.py (an agent's failure streak: backoff and pause, which the
scheduler obeys), transcript.py (every wake's
words, bounded and pruned).

safeio/yamlfile.py (every config file read as untrusted YAML, with each key's line:
policy/ and notify/ both stand on it).

The bottom layer: imports nothing of wakeloop's but its errors. Records hold
data; rendering them for a person is views/' job.
"""
