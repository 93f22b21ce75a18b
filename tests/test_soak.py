"""The short soak: bench/soak.py's own soak() for under a minute, in the suite.

serve with dry-run agents waking every second, against the real engine, its
state/ rotating on a tiny rotate_size. It fails when serve's open
descriptors or its memory grow by more than a quarter between the first and
the last quarter of the run (after the warm-up), when descriptors ever pass
MAX_FDS, when a wake fails, when the
log did not rotate, or when anything is left behind. What a longer run shows
is the bench's to print (docs/benchmarks.md, "The soak").

The descriptor count promise is also checked on one call, deterministically:
a call may not leave a socket for the garbage collector to close. And the
memory promise on one wake: it leaves none of its objects in a reference
cycle (such objects wait for a rare full collection: serve's RSS saw-tooth).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from bench import soak as bench_soak
from tests.helpers import make_agent
from tests.helpers.support import CLI_TIMEOUT_S, REPO, scrubbed_env

AGENTS = 3  # few: the warm-up (each agent's first wake) ends early in the run
SECONDS = 45  # the run; with set-up and shutdown the test stays under a minute
SAMPLE_S = 1.0  # ~45 samples, ~35 after the warm-up: a quarter averages eight or more
MAX_GROWTH = 1.25  # last quarter over first: more is a leak (the bar)
# serve's open descriptors, at any sample: stdio, the log, the engine client's 25
# per-URL pools and the calls in flight measure 33-45 here. With a client per wake
# (before) this run peaked at 193 and grew in a saw-tooth the collector set.
MAX_FDS = 100
TINY_LOG = {"rotate_size": "4k"}  # every wake or two rotates: the soak exercises retention too
CALLS = 6  # calls counted in the one-sandbox check
# Calls before counting. The SDK keeps a connection pool per URL (a container's
# start, wait, inspect, delete: ~5 new URLs a call) in an LRU of 25 pools, each
# keeping its idle connection until evicted: a bounded set, full after ~5 calls.
WARM_CALLS = 8


@pytest.mark.serial  # growth read over a timed soak: alone, where no other test's load moves it
@pytest.mark.docker
def test_serve_holds_descriptors_and_memory_flat_under_a_short_soak(tmp_path):
    tmp = tmp_path / "soak"
    tmp.mkdir()
    try:
        result = bench_soak.soak(tmp, AGENTS, SECONDS, SAMPLE_S, state=TINY_LOG)
    finally:
        left = bench_soak.cleanup(tmp)
        bench_soak.release_disks(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    table = bench_soak.table(result)
    print(table)  # with -s: the numbers behind a pass
    assert result.failures == [], table
    assert result.wakes >= AGENTS, table
    assert result.growth("fds") <= MAX_GROWTH, table
    assert result.peak("fds") < MAX_FDS, table
    assert result.growth("rss_kb") <= MAX_GROWTH, table
    assert result.rotated > 0, table
    assert left == 0, table


@pytest.mark.docker
def test_a_sandbox_call_leaves_no_socket_for_the_collector(agent_dir, runtime):
    """With the collector off, as it may be for a long while in a busy serve, calls
    open no descriptor that outlives them. Cold calls (no pool), in a process of its
    own with an engine client of its own: no thread another test left running (a pool's
    refill on the shared client) can open one meanwhile, and counted once the disk's
    settler has synced and landed the calls (it holds the disk's descriptors while it
    does), so the count is exact. Before the fix each call left about three."""
    done = subprocess.run(
        [sys.executable, "-c", DESCRIPTORS_LEFT, str(agent_dir), runtime],
        cwd=REPO,
        env=scrubbed_env(),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["after"] - seen["before"] <= 0, f"{CALLS} calls left {seen['after'] - seen['before']}: {seen['new']}"


DESCRIPTORS_LEFT = f"""
import gc, json, os, sys
from dataclasses import replace
from orchestrator.policy.agent import load_agent
from orchestrator.sandbox.disks import disk_room
from orchestrator.sandbox.engine import DockerSandbox

def open_fds():
    fds = {{}}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{{fd}}")
        except FileNotFoundError:  # listdir's own descriptor, closed by now
            pass
    return fds

agent = load_agent(sys.argv[1])
box = DockerSandbox(agent.workspace, replace(agent.policy.sandbox, runtime=sys.argv[2]), agent=agent.name, warm=0)
try:
    for _ in range({WARM_CALLS}):  # fills the engine client's pools; from here a new pool evicts one
        assert box.run("true", 30, 1000).exit_code == 0
    gc.disable()
    disk_room.settled(box.disk.key)  # a call's disk is synced off its path, a descriptor held meanwhile
    before = open_fds()
    for _ in range({CALLS}):
        assert box.run("true", 30, 1000).exit_code == 0
    disk_room.settled(box.disk.key)
    after = open_fds()
finally:
    box.close()
new = sorted(target for fd, target in after.items() if before.get(fd) != target)
print(json.dumps({{"before": len(before), "after": len(after), "new": new}}))
"""


LEFT_IN_CYCLES = """
import gc, json, sys
from bench.wake_cost import StandInSandbox
from orchestrator.policy.agent import load_agent
from orchestrator.wake.loop import wake

agent = load_agent(sys.argv[1])
wake(agent, sandbox=StandInSandbox(workspace=agent.workspace))  # the first: lazy imports, caches
gc.collect()
gc.disable()
receipt = wake(agent, sandbox=StandInSandbox(workspace=agent.workspace))
gc.set_debug(gc.DEBUG_SAVEALL)  # what the collection finds unreachable stays in gc.garbage
gc.collect()
ours = sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("orchestrator.")})
print(json.dumps({"status": receipt.status, "ours": ours}))
"""


def test_a_wake_leaves_none_of_its_objects_for_the_collector(tmp_path):
    """With the collector off, a finished dry-run wake (every call answered by the bench's
    stand-in sandbox: no engine) leaves no object of ours in a reference cycle: refcounting
    frees it all when the wake returns. Before the fix the gate and registry held the wake's
    bound methods, and 13 kinds of ours stayed (the wake, its gate, registry, transcript, context, ...).
    In a process of its own: no thread another test left running can add cycles of its own."""
    agent_dir = make_agent(tmp_path, "cyclic")
    done = subprocess.run(
        [sys.executable, "-c", LEFT_IN_CYCLES, str(agent_dir)],
        cwd=REPO,
        env=scrubbed_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["status"] == "done", seen
    assert seen["ours"] == [], f"a wake left these of ours in reference cycles: {seen['ours']}"
