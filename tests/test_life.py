"""An agent's ordinary life, in process: ten scripted wakes, each checking from inside the box
that the workspace is exactly as the wake before left it, then an undo (tests/helpers/life.py).
Under compose, through the broker: tests/test_compose.py."""

from __future__ import annotations

import pytest

from tests.helpers import make_agent, run_cli
from tests.helpers.life import LIFE_POLICY, WAKES, live_a_life, prepare

pytestmark = pytest.mark.docker

WAKE_TIMEOUT_S = 300  # one wake: the 50 MB file, or 5,000 files made and committed, on a loaded host


def test_an_agent_keeps_what_it_makes_wake_after_wake_and_undo_gives_back_the_wake_before(tmp_path):
    agent_dir = make_agent(tmp_path, "life", policy={"version": 1, **LIFE_POLICY})
    prepare(agent_dir)
    cli = lambda *args: run_cli(*args, timeout=WAKE_TIMEOUT_S)
    receipts = live_a_life(cli, agent_dir, str(agent_dir))
    assert [r["wake"] for r in receipts] == list(range(1, WAKES + 1))
