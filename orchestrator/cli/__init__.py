"""`wakeloop`: the command line (the commands: docs/cli.md; the exit codes: docs/architecture.md §4).

One module per command group, each declaring its commands' parsers beside
their handlers: agent_commands.py (init, send, outbox), wake_commands.py
(wake, context), task_commands.py, approval_commands.py, record_commands.py
(status, log, transcript, diff, undo), fleet_commands.py (serve, broker,
pause, resume, run-now, stop, start), swarm_commands.py (swarm certs, move),
sandbox_commands.py (sandbox exec, image build), disk_commands.py,
notify_commands.py, model_commands.py, policy_commands.py,
escape_commands.py; wakeloop.py builds the parser from them in a fixed order
and dispatches.

Each command is a small function that takes parsed arguments and returns an
exit code. Expected failures are one line on stderr, never a traceback, with
the exit code their error class carries (errors.py): 2 bad usage or
configuration, 3 the environment (no engine, no broker, no permission).
A failed piece of work (a dead letter, a blocked wake, an escape) is exit 1.
Every command that reads takes --json; `wake` prints progress on stderr and
only its receipt on stdout.

Not here: what any command does (each calls into its package), how records
are rendered (views/).
"""
