"""Run ids as a person types them (records/run_ids.py): any unique prefix of 4+ hex digits, wherever
a command takes one; an ambiguous prefix is refused in one line that names the candidates (exit 2).

The wakes an agent had are what its state/ remembers: transcripts and
`wake_started` events, written here by the records' own classes, or by
real dry-run wakes for the commands that read the disk (diff, undo).
Not here: what each command does with the wake (test_wake_undo.py, test_transcript.py).
"""

from __future__ import annotations

import json

import pytest

from orchestrator.policy.agent import init_agent
from orchestrator.records import event_types as ev
from orchestrator.records import transcript as tr
from orchestrator.records.events import EVENTS_FILE, EventLog
from orchestrator.records.run_ids import RunIdError, known, resolve
from tests.helpers import run_cli

A, B, C = "3f2a9c0b1d4e", "3f2a11112222", "abcd00000000"


def remembered(state, run_id: str, transcript: bool = True, event: bool = True) -> None:
    """A wake of `run_id` as state/ keeps it: its transcript, its `wake_started` event, or both."""
    if transcript:
        tr.Transcript(state, run_id, 1 << 20, ()).add("wake", run_id=run_id, wake=1, agent="a", model="m", live=False)
    if event:
        EventLog(state / EVENTS_FILE, run_id, secrets=()).write(ev.WakeStarted(wake=1, agent="a"))


@pytest.fixture
def state(tmp_path):
    state = init_agent(tmp_path / "agent") / "state"
    remembered(state, A)
    remembered(state, B, transcript=False)  # its transcript pruned: the event log still names it
    remembered(state, C, event=False)  # its events rotated away: its transcript names it
    return state


def test_a_unique_prefix_of_four_or_more_digits_names_its_wake_and_a_whole_id_passes(state):
    assert known(state) == sorted([A, B, C])
    assert resolve(state, "abcd") == C and resolve(state, "3f2a9") == A and resolve(state, "3F2A11") == B
    assert resolve(state, "0123456789ab") == "0123456789ab"  # whole: the command says whether it exists


@pytest.mark.parametrize("typed", ["3f2", "", "zzzz", "../../etc", "3f2a9c0b1d4e0"])
def test_what_is_not_four_to_twelve_hex_digits_is_refused(state, typed):
    with pytest.raises(RunIdError, match="not a run id"):
        resolve(state, typed)


def test_an_ambiguous_prefix_is_refused_naming_every_candidate_and_an_unknown_one_says_so(state):
    with pytest.raises(RunIdError) as ambiguous:
        resolve(state, "3f2a", "agents/a")
    assert str(ambiguous.value) == (
        f"run id 3f2a is ambiguous: 2 wakes of agents/a start with it ({B}, {A}); give more digits"
    )
    with pytest.raises(RunIdError, match="no wake of agents/a has a run id starting beef"):
        resolve(state, "beef", "agents/a")


@pytest.mark.parametrize(
    "command",
    [
        ["log", "--run"],
        ["transcript", "--run"],
        ["transcript"],
        ["log", "--egress", "--run"],
        ["diff", "--run"],
        ["undo", "--run"],
    ],
    ids=["log", "transcript--run", "transcript", "egress", "diff", "undo"],
)
def test_every_command_that_takes_a_run_id_refuses_an_ambiguous_prefix_in_one_line(state, command):
    agent_dir = str(state.parent)
    done = run_cli(command[0], agent_dir, *command[1:], "3f2a")
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"run id 3f2a is ambiguous: 2 wakes of {agent_dir} start with it ({B}, {A})" in done.stderr


def test_the_consoles_wake_page_takes_a_prefix_and_refuses_an_ambiguous_one(state):
    from orchestrator.console.app import Console, start
    from orchestrator.console.auth import Access
    from tests.helpers.console import TOKEN, Client

    listening = start(Console(state.parent.parent, Access(TOKEN, True)), "127.0.0.1", 0, ())
    try:
        client = Client(listening.url).sign_in()
        status, _, html = client.get("/agents/agent/wakes/abcd")
        ambiguous = client.get("/agents/agent/wakes/3f2a")
    finally:
        listening.stop()
    assert status == 200 and f"run {C}" in html
    assert ambiguous[0] == 404 and f"({B}, {A})" in ambiguous[2]


@pytest.mark.docker
def test_a_prefix_works_for_log_transcript_diff_and_undo_of_real_wakes(agent_dir):
    runs = []
    for _ in range(2):
        done = run_cli("wake", str(agent_dir), "--dry-run", timeout=180)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.splitlines()[-1])["run_id"])
    first, second = runs
    n = next(k for k in range(4, 13) if first[:k] != second[:k])  # the shortest prefixes that differ
    log = run_cli("log", str(agent_dir), "--run", first[:n])
    assert log.returncode == 0 and f"run {first}" in log.stdout, log.stderr
    transcript = run_cli("transcript", str(agent_dir), "--run", second[:n])
    assert transcript.returncode == 0 and f"run {second}" in transcript.stdout, transcript.stderr
    diff = run_cli("diff", str(agent_dir), "--run", first[:n])
    assert diff.returncode == 0 and f"wake {first}" in diff.stdout, diff.stderr
    undo = run_cli("undo", str(agent_dir), "--run", second[:n])
    assert undo.returncode == 0 and f"undid wake {second}" in undo.stdout, undo.stderr
