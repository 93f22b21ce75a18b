"""Telling a person: notifications out of an unattended agent, never lost, never slowing a wake.

config.py (the `notify:` entries of agent.yaml and ROOT/notify.yaml, read
once into frozen Channels), queue.py (the durable queue under
state/notify/: a file per notification and channel, written before anyone
tries to send it), channels.py (webhook, slack, email, command: one delivery
each, one secret-free line on failure), sender.py (delivers what is due, in
order per channel, with exponential backoff and a bounded give-up),
outcomes.py (what a wake's end, a send_message and a new day put in the queue,
and which of a failure streak's turns are news: `failing`, `paused`, `recovered`).
The streak itself, its backoff and the pause live in records/health.py.

Sits beside records/: imports records/ (secrets.py: the one list of secret
names), errors and safeio/yamlfile.py's line finder and safe YAML reader only,
never wake/ or fleet/, so the loop, the scheduler, policy/agent.py (which
reads `notify:`) and policy/ceiling.py (its notify_env check) can all call it.
"""
