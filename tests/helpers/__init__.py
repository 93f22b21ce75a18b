"""What the tests (and bench/) share, defined once: `from tests.helpers import make_agent, wait_for, REPO`.

support.py (the checkout, the CLI, policies, waiting, today's date),
agents.py (an agent on disk; a live wake of it), sync.py (holding a process
at a known point), leftovers.py (our containers), receivers.py (real
notification receivers), proxyconf.py (weakened proxy configs), console.py
(the console's token and HTTP client), browser.py (headless Chromium),
recorded.py (what a request the fake API recorded says), mounts.py (a
process of another mount namespace holding a copy of a disk's mount; the
mounts a namespace has).
tests/test_helpers_once.py fails when a test or bench module defines one of
these names again, or any function twice.

Not here: pytest fixtures (tests/conftest.py).
"""

from tests.helpers.agents import live_wake, make_agent
from tests.helpers.support import REPO, cli_here, must_escape, run_cli, scrubbed_env, set_policy, today, wait_for

__all__ = [
    "REPO",
    "cli_here",
    "live_wake",
    "make_agent",
    "must_escape",
    "run_cli",
    "scrubbed_env",
    "set_policy",
    "today",
    "wait_for",
]
