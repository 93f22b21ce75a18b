"""The boundary under compose: the one process that holds the Docker socket.

wire.py (the ops, limits and line format both sides import), server.py (the
broker: loads each agent's policy itself, checks it against the ceiling,
then asks sandbox/keeper.py, which keeps each agent's box, disk and
egress), transport.py (the unix socket or mutual TLS that carries the lines
to it, and `wakeloop broker`), tls.py (the certificates),
client.py (the orchestrator's side, a Sandbox like any other, and
open_sandbox: the one place that chooses in-process Docker or the broker).

Imports sandbox/, policy/ and records/; never wake/ or fleet/. The
orchestrator reaches the broker through client.py alone, never server.py or transport.py.
"""
