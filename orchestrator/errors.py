"""wakeloop's errors: one small hierarchy, caught once by the CLI.

Every expected failure is one line for the human, with the fix, and an exit
code that says whose move it is (docs/architecture.md §4):

  ConfigError       2  bad usage or configuration: agent.yaml, a policy, the
                       ceiling, a schedule, a task, the ledger's files
  EnvironmentFault  3  the environment: no engine, no broker, permission
                       denied on the socket, a missing image

A failed piece of *work* (a dead letter, a blocked wake, a wake whose changes
were not committed, an escape) is not an exception: it is a receipt or a
report, and exit 1 (records/receipt.py FAILED).

Not here: errors that never leave their module (a tool's failure is text for
the model; a broker refusal travels back as a reply).
"""

from __future__ import annotations

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_ENVIRONMENT = 0, 1, 2, 3


class WakeloopError(Exception):
    """An expected failure: str(exc) is one line for the human."""

    exit_code = EXIT_FAILED


class ConfigError(WakeloopError, ValueError):
    """Bad usage or configuration; the line names the file, key or argument."""

    exit_code = EXIT_USAGE


class EnvironmentFault(WakeloopError, RuntimeError):
    """The machine is not ready: engine, broker, socket permission, image."""

    exit_code = EXIT_ENVIRONMENT
