"""The warm pool keeps its promises: single use, fresh state, nothing left, no stale settings."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import pytest

from orchestrator.sandbox.engine import LABEL
from tests.helpers import support

DEADLINE = 30


def run(box, command, timeout=DEADLINE):
    return box.run(command, timeout_s=timeout, max_output_chars=10_000)


def labelled(client, run_id) -> list[str]:
    found = client.api.containers(all=True, filters={"label": [f"{LABEL}=1", f"wakeloop.run_id={run_id}"]})
    return [c["Id"][:12] for c in found]


def wait_until_ready(box, count):
    assert box.pool.wait_ready(count, DEADLINE), "the pool never filled"


def test_every_call_gets_a_container_no_earlier_call_used(sandbox):
    wait_until_ready(sandbox, sandbox.pool.want)
    seen = set()
    for _ in range(6):
        idle = {cid[:12] for cid in sandbox.pool.idle()}
        result = run(sandbox, "true")
        assert result.container_id not in seen
        seen.add(result.container_id)
        if idle:
            assert result.container_id in idle, "a warm container was idle but the call went cold"


def test_nothing_one_call_writes_to_tmp_or_starts_is_seen_by_the_next(sandbox):
    wait_until_ready(sandbox, sandbox.pool.want)
    run(sandbox, "echo secret > /tmp/left; echo h > $HOME/h; (sleep 300 &) ; echo x > /dev/shm/s")
    after = run(sandbox, "ls /tmp /dev/shm; ps -e -o comm --no-headers")
    assert "left" not in after.output and "h" not in after.output.split()
    assert "sleep" not in after.output and "s" not in after.output.split()


def test_the_pool_is_empty_after_shutdown(sandbox, docker_client):
    wait_until_ready(sandbox, sandbox.pool.want)
    run(sandbox, "true")
    run(sandbox, "exit 3")
    assert labelled(docker_client, sandbox.run_id), "the pool should hold containers while open"
    sandbox.close()
    assert labelled(docker_client, sandbox.run_id) == []


def test_a_policy_change_never_hands_out_a_container_made_under_the_old_policy(sandbox, agent):
    wait_until_ready(sandbox, sandbox.pool.want)
    run(sandbox, "true")  # a refill is in flight under the old settings now
    for generation in range(3):
        sandbox.update_policy(replace(agent.policy.sandbox, env=(("GENERATION", str(generation)),)))
        assert run(sandbox, "echo $GENERATION").output == f"{generation}\n"
        assert run(sandbox, "echo $GENERATION").output == f"{generation}\n"


def test_write_file_through_a_pooled_container_keeps_bytes_and_stdin_order(sandbox, agent):
    wait_until_ready(sandbox, sandbox.pool.want)
    content = bytes(range(256)) * 4096  # 1 MiB, every byte value
    assert sandbox.write("blob.bin", content).exit_code == 0
    assert (agent.workspace / "blob.bin").read_bytes() == content


def test_a_pooled_command_reads_eof_on_stdin(sandbox):
    wait_until_ready(sandbox, sandbox.pool.want)
    result = run(sandbox, "cat; echo done", timeout=10)
    assert not result.timed_out and result.output == "done\n"


@pytest.mark.parametrize("warm", [0, 2], ids=["cold", "warm"])
def test_cold_and_warm_calls_agree(make_sandbox, warm):
    box = make_sandbox(warm=warm)
    if warm:
        wait_until_ready(box, box.pool.want)
    assert run(box, "echo $0 $(id -u) $(pwd) $HOSTNAME; exit 4").output == "bash 1000 /workspace sandbox\n"
    assert run(box, "exit 4").exit_code == 4
    timed = run(box, "sleep 100", timeout=1)
    assert timed.timed_out and timed.exit_code == 124
    assert box.write("w.txt", b"ok").output.startswith("wrote 2 bytes")


@pytest.mark.parametrize("warm", [0, 1], ids=["cold", "warm"])
def test_ps_shows_wakeloops_programs_as_short_lines_and_the_command_inherits_none(make_sandbox, warm):
    # The guard's and launcher's sources ride in pid 1's environment, not in argv:
    # `ps aux` was 4.3 KB of Python before, which the model pays for in tokens.
    box = make_sandbox(warm=warm)
    if warm:
        wait_until_ready(box, box.pool.want)
    listing, env = run(box, "ps -eo args=; echo ---; env").output.split("---\n")
    assert max(map(len, listing.splitlines())) < 200, listing
    assert ("WAKELOOP_LAUNCHER" in listing) == bool(warm)
    assert "WAKELOOP" not in env


@pytest.mark.parametrize("warm", [0, 1], ids=["cold", "warm"])
def test_the_policy_env_reaches_the_command_and_never_the_harness_programs(make_sandbox, agent, warm, monkeypatch):
    from orchestrator.sandbox import engine
    from orchestrator.sandbox.containers.programs import COMMAND_ENV, write_argv

    handed, real_handoff = [], engine.handoff  # what each pooled call hands its launcher
    monkeypatch.setattr(engine, "handoff", lambda *a: handed.append(a) or real_handoff(*a))
    env = (("FOO", "bar"), ("PATH", f"/workspace/bin:{engine.PATH}"))
    box = make_sandbox(replace(agent.policy.sandbox, env=env), warm=warm)
    if warm:
        wait_until_ready(box, box.pool.want)
    # The command sees the policy's env; pid 1 (whose environment is the
    # container's, under which the guard and launcher run) has no FOO of its own.
    result = run(box, "echo \"$FOO|$PATH\"; tr '\\0' '\\n' < /proc/1/environ | grep -c '^FOO=' || true")
    assert result.output == f"bar|/workspace/bin:{engine.PATH}\n0\n"
    config, _ = box.container_spec(write_argv("w.txt"), stdin=True, workdir="/")
    assert "FOO" not in config["environment"] and COMMAND_ENV not in config["environment"]
    assert config["environment"]["PATH"] == engine.PATH
    if warm:
        wait_until_ready(box, box.pool.want)
        assert box.write("w.txt", b"x").exit_code == 0
        assert [h[4] is None for h in handed] == [False, True]  # bash: the policy's env; write: ours
        assert handed[0][4]["FOO"] == "bar"


def test_a_failed_make_or_remove_does_not_stop_the_pool():
    # Plain functions stand in for the engine here: what is under test is the
    # pool's own thread, which must outlive any one failure.
    made, removed, failures = [], [], iter([RuntimeError("create failed"), None])

    def make() -> str:
        failure = next(failures, None)
        if failure:
            raise failure
        made.append(f"c{len(made)}")
        return made[-1]

    def remove(cid: str) -> None:
        removed.append(cid)
        if cid == "c0":
            raise RuntimeError("remove failed")

    from prometheus_client import REGISTRY

    from orchestrator import metrics
    from orchestrator.sandbox.containers.pool import WarmPool

    metrics.install()
    failed = "wakeloop_sandbox_pool_make_failures_total"
    before = REGISTRY.get_sample_value(failed) or 0.0
    pool = WarmPool(1, key=lambda: "k", make=make, remove=remove, alive=lambda cid: True)
    # The first make fails; calls go cold meanwhile, and each asks for a refill.
    for _ in range(100):
        if pool.take() is None and pool.wait_ready(1, 0.3):
            break
    assert pool.idle() == ["c0"]
    assert (REGISTRY.get_sample_value(failed) or 0) >= before + 1  # counted, not only survived
    first = pool.take()
    pool.discard(first)  # its removal raises
    assert pool.wait_ready(1, DEADLINE)
    pool.close()
    assert first in removed and set(made) <= set(removed)


def test_a_container_made_under_settings_that_changed_meanwhile_is_replaced_not_kept():
    # A wake's begin or finish changes the settings (the box's mount) while a refill is
    # being made: the drain counts that make as coming, so when it lands stale and is
    # removed, one is made under the new settings; before, the pool stayed empty.
    from orchestrator.sandbox.containers.pool import WarmPool

    key, door, begun, made, removed = ["old"], threading.Event(), threading.Event(), [], []

    def make() -> str:
        made.append(f"c{len(made)}:{key[0]}")
        begun.set()
        assert door.wait(DEADLINE), "the test never let the make through"
        return made[-1]

    pool = WarmPool(1, key=lambda: key[0], make=make, remove=removed.append, alive=lambda cid: True)
    try:
        assert begun.wait(DEADLINE)  # the first make is under way, under the old settings
        key[0] = "new"
        pool.drain()  # as _layer_changed does: nothing idle, one coming
        door.set()
        assert pool.wait_ready(1, DEADLINE), "the stale make was not replaced"
        assert pool.idle() == ["c1:new"] and removed == ["c0:old"]
    finally:
        pool.close()


@contextmanager
def lone_or_in_a_fleet(case: str, make, door: threading.Event):
    """A pool of 2 whose makes are `make`'s; with case "fleet", another wake's pool on the same
    engine wants a container too. Closed after, `door` opened first."""
    from orchestrator.sandbox.containers.pool import MakePace, WarmPool

    pace = MakePace()
    other = (
        WarmPool(1, key=lambda: "k", make=lambda: "o", remove=lambda cid: None, alive=lambda cid: True, pace=pace)
        if case == "fleet"
        else None
    )
    pool = WarmPool(2, key=lambda: "k", make=make, remove=lambda cid: None, alive=lambda cid: True, pace=pace)
    try:
        yield pool
    finally:
        door.set()
        pool.close()
        if other:
            other.close()


@pytest.mark.parametrize("case", ["alone", "fleet", "engine-too-slow"])
def test_a_call_that_waited_for_a_refill_grows_a_lone_wakes_pool_when_one_more_hides_it(case):
    # Plain functions stand in for the engine: what is under test is the rule (grow when
    # the last make took under (want + 1) x the time between calls). Calls come 0.5 s
    # apart (a model turn). The second make takes 1.2 turns (a runsc make on a small
    # host): two in flight hide it. Six turns (the engine saturated) is not hidden by two
    # either, and two at once only slow each other: no growth. Nor when another wake
    # wants containers. The third make is held at the door: the third call waits for it.
    # The margins are wide for a loaded host: growth needs the make 0.4 s within its bound,
    # no growth needs a turn stretched from 0.5 s past 1.5 s.
    door, made, turn_s = threading.Event(), [], 0.5
    slow_s = 6 * turn_s if case == "engine-too-slow" else 1.2 * turn_s

    def make() -> str:
        if len(made) == 1:
            time.sleep(slow_s)  # the engine's work, not a wait for anything
        elif made:
            assert door.wait(DEADLINE), "the test never let the make through"
        made.append(f"c{len(made)}")
        return made[-1]

    with lone_or_in_a_fleet(case, make, door) as pool:
        assert pool.wait_ready(1, DEADLINE) and pool.want == 1
        first = pool.take()  # the wake's first call; its refill is slow
        assert pool.wait_ready(1, DEADLINE)
        pool.done(first)
        pool.done(pool.take())  # the second finds it ready; its refill is held
        time.sleep(turn_s)  # the model's turn (the scenario, not a wait for anything)
        third = threading.Thread(target=pool.take)
        third.start()
        support.wait_for(lambda: pool.waits == 1, "the third call waiting for its refill", DEADLINE)
        assert pool.want == (2 if case == "alone" else 1)
        door.set()
        third.join(DEADLINE)
        assert not third.is_alive()


@pytest.mark.parametrize("case", ["alone", "fleet", "no-model"])
def test_a_wakes_first_call_that_waits_for_its_first_fill_grows_a_lone_wakes_pool(case, monkeypatch):
    # The first fill began as the wake did, a model turn before its first call: a call that
    # still finds nothing ready says a refill will not be ready within a turn either, so one
    # more ahead begins now (under runsc, growing only at the second call's wait made calls
    # two and three wait too). Not in a fleet: there the one more is another agent's call.
    # Nor when the first call came sooner than any model answers (a dry run's script).
    from orchestrator.sandbox.containers import pool as pool_module
    from orchestrator.sandbox.containers.pool import FIRST_TURN_S

    door = threading.Event()

    def make() -> str:
        assert door.wait(DEADLINE), "the test never let the make through"
        return "c"

    with lone_or_in_a_fleet(case, make, door) as pool:
        if case == "no-model":  # however loaded the host, this take comes sooner than any model's turn
            monkeypatch.setattr(pool_module, "FIRST_TURN_S", DEADLINE)
        else:
            time.sleep(FIRST_TURN_S)  # the model's first turn (the scenario, not a wait for anything)
        first = threading.Thread(target=pool.take)
        first.start()
        support.wait_for(lambda: pool.waits == 1, "the first call waiting for its first fill", DEADLINE)
        assert pool.want == (2 if case == "alone" else 1)
        door.set()
        first.join(DEADLINE)
        assert not first.is_alive()


@pytest.mark.parametrize("make_s", [0.0, 2.0], ids=["fits-the-turn", "outlasts-it"])
def test_a_refill_that_fits_in_the_models_turn_begins_when_its_call_ends(make_s):
    # Plain functions stand in for the engine. A make well within the model's turn
    # (the think time, here 0.3 s) is put off until the call ends, so that it does
    # not compete with the call for the cores; a longer one begins beside the call
    # (2 s: deferred only if a loaded host stretched the 0.3 s turn past 2.5 s).
    from orchestrator.sandbox.containers.pool import MakePace, WarmPool

    made = []

    def make() -> str:
        if made:
            time.sleep(make_s)  # the engine's work, not a wait for anything
        made.append(f"c{len(made)}")
        return made[-1]

    pool = WarmPool(1, key=lambda: "k", make=make, remove=lambda cid: None, alive=lambda cid: True, pace=MakePace())
    try:
        assert pool.wait_ready(1, DEADLINE)
        first = pool.take()  # the wake's first call: nothing measured yet, refilled at once
        assert pool.wait_ready(1, DEADLINE)
        pool.done(first)
        time.sleep(0.3)  # the model's turn
        cid = pool.take()
        assert pool._making == (0 if make_s == 0 else 1)
        pool.done(cid)
        assert pool._making == 1 or pool.idle(), "the refill begins at the call's end at the latest"
        assert pool.wait_ready(1, DEADLINE)
    finally:
        pool.close()


def test_a_refill_put_off_until_its_call_ends_begins_when_the_call_raises():
    # engine.py's call that raised (its container removed at once) says ended(), not done():
    # the refill put off until the call's end must begin all the same.
    from orchestrator.sandbox.containers.pool import MakePace, WarmPool

    made: list[str] = []

    def make() -> str:
        made.append(f"c{len(made)}")
        return made[-1]

    pool = WarmPool(1, key=lambda: "k", make=make, remove=lambda cid: None, alive=lambda cid: True, pace=MakePace())
    try:
        assert pool.wait_ready(1, DEADLINE)
        pool.done(pool.take())  # the wake's first call: a make is measured
        assert pool.wait_ready(1, DEADLINE)
        time.sleep(0.3)  # the model's turn: far longer than an instant make, so the refill is put off
        pool.take()
        assert pool._making == 0 and not pool.idle(), "the refill waits for the call's end"
        pool.ended()  # the call raised; its container is gone already
        assert pool.wait_ready(1, DEADLINE), "the refill began when the call ended"
    finally:
        pool.close()


def test_what_a_calls_end_sets_off_waits_for_the_harness_unless_a_call_or_close_comes(monkeypatch):
    # Plain functions stand in for the engine. Right after a call the harness has work of
    # its own (the call's records, the next request to the model): the used container's
    # removal, and a refill put off until the call's end, begin QUIET_S after that end. A
    # call that comes sooner has its refill begun at once, and close() removes at once.
    from orchestrator.sandbox.containers import pool as pool_module
    from orchestrator.sandbox.containers.pool import MakePace, WarmPool

    made: list[str] = []
    began: list[float] = []
    removed: dict[str, float] = {}
    second_gone = threading.Event()

    def make() -> str:
        began.append(time.monotonic())
        made.append(f"c{len(made)}")
        return made[-1]

    def remove(cid: str) -> None:
        removed[cid] = time.monotonic()
        if cid == "c1":
            second_gone.set()

    pool = WarmPool(1, key=lambda: "k", make=make, remove=remove, alive=lambda cid: True, pace=MakePace())
    assert pool.wait_ready(1, DEADLINE)
    pool.done(pool.take())  # the wake's first call: refilled at once, and a make is measured
    assert pool.wait_ready(1, DEADLINE)

    monkeypatch.setattr(pool_module, "QUIET_S", 0.5)
    time.sleep(0.3)  # the model's turn: an instant make fits it, so the refill waits for the call's end
    second = pool.take()
    ended = time.monotonic()
    pool.done(second)
    assert pool.wait_ready(1, DEADLINE) and second_gone.wait(DEADLINE)
    assert began[-1] >= ended + 0.5, "the refill waited out the harness's work"
    assert removed[second] >= ended + 0.5, "so did the removal"

    monkeypatch.setattr(pool_module, "QUIET_S", 3600.0)  # now only a call or close() ends the quiet
    time.sleep(0.3)
    third = pool.take()
    pool.done(third)
    fourth = pool.take()  # the next call comes in the quiet: its refill begins at once
    assert fourth is not None and third not in removed
    pool.done(fourth)
    closing = threading.Thread(target=pool.close, daemon=True)
    closing.start()
    closing.join(DEADLINE)
    assert not closing.is_alive(), "close() waits out no quiet"
    assert {third, fourth} <= set(removed)


# -- the launcher's end line (pool.py) ---------------------------------------------


def test_a_pooled_status_is_the_commands_own(make_sandbox):
    box = make_sandbox(warm=1)
    cases = {
        "exit 4": 4,
        "kill -TERM $$": 143,
        "kill -KILL $$": 137,
        "true": 0,
        r"printf 'x\0wakeloop:%032d:000:0\n' 0; exit 5": 5,
    }
    for command, expected in cases.items():
        wait_until_ready(box, 1)
        result = run(box, command)
        assert (result.exit_code, result.timed_out) == (expected, False), command
    assert "wakeloop:" in result.output  # a line that looks like the end line is output


def test_a_killed_launcher_leaves_the_status_to_the_engine(make_sandbox):
    box = make_sandbox(warm=1)
    wait_until_ready(box, 1)
    result = run(box, "echo before; kill -KILL $PPID; sleep 5; echo after", timeout=20)
    assert result.output == "before\n"
    assert result.exit_code == 137 and not result.timed_out


@pytest.mark.parametrize("warm", [0, 1], ids=["cold", "warm"])
def test_what_a_call_leaves_running_ends_with_it(make_sandbox, agent, warm):
    box = make_sandbox(warm=warm)
    if warm:
        wait_until_ready(box, 1)
    result = run(box, "(sleep 3; echo late >> /workspace/late.txt) & echo now", timeout=20)
    assert result.output == "now\n"
    assert run(box, "sleep 4").exit_code == 0
    assert not (agent.workspace / "late.txt").exists()


def test_a_command_that_leaves_stdout_nonblocking_still_ends_cleanly(make_sandbox):
    box = make_sandbox(warm=1)
    wait_until_ready(box, 1)
    result = run(box, "python3 -c 'import os; os.set_blocking(1, False)'; echo done; exit 6")
    assert (result.output, result.exit_code, result.timed_out) == ("done\n", 6, False)


# -- the pool grows to hide its refills (issue 26) ------------------------------------


class HeldMakes:
    """Stands between the pool and the engine: counts the makes begun, and holds each
    at the door until the test opens it, so that "a call comes before its refill is
    made" is a promise here, not a race the engine may win."""

    def __init__(self, pool):
        self.make, self.begun, self.door = pool._make, 0, threading.Event()
        pool._make = self

    def __call__(self) -> str:
        self.begun += 1
        assert self.door.wait(DEADLINE), "the test never let the make through"
        return self.make()


def test_a_wake_whose_calls_come_faster_than_a_refill_keeps_more_ahead_and_waits_less(make_sandbox, monkeypatch):
    from orchestrator.sandbox.containers import engine_client
    from orchestrator.sandbox.containers.pool import MakePace

    # This wake alone on the engine: other tests' pools are not part of it.
    monkeypatch.setattr(engine_client, "pace", lambda client, runtime: MakePace())
    box = make_sandbox(warm=2)
    pool = box.pool
    wait_until_ready(box, 1)
    assert pool.want == 1
    pool._made_s = None  # the first fill's time on a loaded test host is not under test: growth is
    makes = HeldMakes(pool)
    takes, take = [], pool.take
    pool.take = lambda: takes.append(bool(cid := take())) or cid

    # A turn of two tool calls: the second comes while the first's refill is still held.
    assert run(box, "true").exit_code == 0
    second = threading.Thread(target=lambda: run(box, "true"))
    second.start()
    support.wait_for(lambda: pool.waits == 1, "the second call waiting for a refill", DEADLINE)
    assert pool.want == 2, "a call that waited for a refill grows the pool"
    makes.door.set()
    second.join(DEADLINE)
    assert not second.is_alive()

    # The model's next turn outlasts two refills: the same two calls now wait for none.
    wait_until_ready(box, 2)
    for _ in range(2):
        assert run(box, "true").exit_code == 0
    assert pool.waits == 1 and pool.want == 2

    # The wake winds down: the journal's stub takes a container already made or being
    # made, and what its end leaves unused is at most the one more the grown pool
    # kept ahead (a make not yet begun at wind_down is dropped).
    pool.wind_down()
    assert run(box, "true").exit_code == 0
    box.close()
    calls, made = 5, 1 + makes.begun
    assert pool.waits <= 2 and made - calls <= 1, f"{made} containers for {calls} calls"
    assert takes == [True] * calls, "no call went cold"
