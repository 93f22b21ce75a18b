"""wakeloop on a three-node Docker Swarm (scripts/swarm-lab.sh), deployed with `docker stack deploy`.

One lab for the module, torn down whatever happens (the fixture's finally;
scripts/test.sh runs `swarm-lab.sh down` too, for a pytest killed outright),
started while a workspace disk of this host's is mounted (host_disk), which
the lab must not hold.
The stack runs this checkout's code: compose.yaml (alone, as `docker stack deploy` reads it) with the source
mounted over the image's (the image may be older than the checkout).

Skipped only when the lab cannot be built here, with the reason: not root,
or a tool the lab needs missing. Anything else that fails is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.escapes.registry import THROUGH_A_BROKER
from orchestrator.policy.agent import load_agent
from orchestrator.records.placement import read_node
from orchestrator.records.state import load_state
from orchestrator.sandbox.disks import disk, disk_survey
from orchestrator.sandbox.engine import DockerSandbox
from tests.helpers import REPO, make_agent, wait_for
from tests.helpers.mounts import mounts

# serial: its own three engines and twelve agents would load the other worker's tests, and it waits
# on theirs (scripts/test.sh runs the serial tests alone, after the rest)
pytestmark = [pytest.mark.swarm, pytest.mark.docker, pytest.mark.serial]

LAB = Path(os.environ.get("WAKELOOP_SWARM_LAB", "/var/tmp/wakeloop-swarm-lab"))
SCRIPT = REPO / "scripts" / "swarm-lab.sh"
NODES = {"swx-n1": 1, "swx-n2": 2, "swx-n3": 3}
LOST = "swx-n3"  # never the orchestrator's node (placed on swx-n1 below)
# Four agents a node, each due every 15 s: a dry wake makes five boxes, about 2 CPU-s here, so
# these ask for 1.6 of the host's two cores (thirty every 5 s asked for twelve: every wake queued
# behind the others and the module took 8 minutes, 96 % of the CPU, on 2026-12-03).
AGENTS, EVERY = 12, "15s"
DISKED = {"s9", "s10", "s11"}  # with a workspace disk of their own, on their node (plain_container.py)
UP_S, DEPLOY_S, NODE_S = 180, 120, 240  # NODE_S: a lost node's agents all skipped 32 s after its stop here
BRIDGE_NS = "swx-br"  # the lab's own network, where the nodes' host-mode ports are


def _missing() -> str:
    if os.geteuid() != 0:
        return "the swarm lab needs root (network namespaces, a dockerd per node)"
    for tool in ("dockerd", "ip", "nsenter", "unshare", "docker"):
        if shutil.which(tool) is None:
            return f"the swarm lab needs {tool}, not found on PATH"
    return ""


def lab(*args: str, timeout: float = UP_S) -> subprocess.CompletedProcess:
    done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"swarm-lab.sh {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def on(node: int, *args: str, timeout: float = 60) -> str:
    done = subprocess.run(
        ["docker", "-H", f"unix://{LAB}/n{node}/docker.sock", *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"docker {' '.join(args)} on node {node}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def host_disk(docker_client, tmp_path_factory):
    """A box of this host's with its workspace disk attached (mounted), made before the lab: as an
    agent's on a busy host. Closed (its disk released) by the test, or after the module."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    agent = load_agent(make_agent(tmp_path_factory.mktemp("host"), "host", policy={"sandbox": {"disk": "64m"}}))
    box = DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, client=docker_client, warm=0)
    yield box
    box.close()


@pytest.fixture(scope="module")
def stack(request, host_disk):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    try:
        lab("up")
        root, certs = LAB / "agents", LAB / "certs"
        for i in range(AGENTS):
            disk = "64m" if f"s{i}" in DISKED else "none"
            make_agent(root, f"s{i}", schedule=EVERY, policy={"sandbox": {"disk": disk}}, live=False)
        subprocess.run(
            [str(REPO / ".venv/bin/wakeloop"), "swarm", "certs", str(certs)], check=True, capture_output=True
        )
        (certs / "anthropic-api-key").write_text("-\n")  # a dry run: no key
        # The shipped ceiling, but for max.disk: most of these agents have no disk (so that one can move)
        ceiling = yaml.safe_load((REPO / "policies" / "ceiling.yaml").read_text())
        del ceiling["max"]["disk"]
        (LAB / "policies").mkdir()
        (LAB / "policies" / "ceiling.yaml").write_text(yaml.safe_dump(ceiling))
        source = LAB / "source.yaml"  # this checkout's code over the image's
        mounts = [f"{REPO}/orchestrator:/opt/wakeloop/src/orchestrator:ro"]
        mounts.append(f"{REPO}/scripts/docker-entrypoint.sh:/usr/local/bin/wakeloop-entrypoint:ro")
        pinned = {"placement": {"constraints": ["node.hostname == swx-n1"]}}
        source.write_text(
            yaml.safe_dump(
                {"services": {"broker": {"volumes": mounts}, "orchestrator": {"volumes": mounts, "deploy": pinned}}}
            )
        )
        env = {**os.environ, "WAKELOOP_AGENTS": str(root), "WAKELOOP_CERTS": str(certs), "WAKELOOP_DRY_RUN": "true"}
        env["WAKELOOP_POLICIES"] = str(LAB / "policies")
        env["DOCKER_HOST"] = f"unix://{LAB}/n1/docker.sock"
        deploy = ["docker", "stack", "deploy", "-c", str(REPO / "compose.yaml"), "-c", str(source)]
        subprocess.run([*deploy, "--resolve-image", "never", "wakeloop"], env=env, check=True, capture_output=True)
        failed = request.session.testsfailed
        yield root
        if request.session.testsfailed > failed:  # what the orchestrator said, before the lab goes
            print(on(1, "service", "logs", "--tail", "80", "wakeloop_orchestrator"))
    finally:
        subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=UP_S)
        print(f"swarm lab: {time.monotonic() - started:.0f} s from up to down")
    assert not LAB.exists(), f"swarm-lab.sh down left {LAB}"


def lab_loops() -> set[str]:
    """The loop devices whose file is on the lab's tmpfs: the nodes' brokers' disks."""
    lab_fs = os.stat(LAB).st_dev
    out = subprocess.run(["losetup", "-n", "-l", "-O", "NAME,BACK-MAJ:MIN"], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        name, numbers = line.split()
        major, minor = numbers.split(":")
        if os.makedev(int(major), int(minor)) == lab_fs:
            found.add(name)
    return found


def test_the_lab_holds_none_of_the_hosts_disks(stack, host_disk):
    """Started while a disk of the host's was mounted, no node's mount namespace has a mount of it,
    of a loop device but the nodes' own brokers', or under the host's disks' folder: the host
    releases the disk while the lab runs, at once."""
    assert host_disk.disk is not None and host_disk.disk.hold is not None
    device, key = host_disk.disk.device, host_disk.disk.key
    assert any(source == device for source, _ in mounts()), "the host's disk is mounted here"
    folder = str(disk.disks_dir())
    for node in NODES.values():
        pid = (LAB / f"n{node}" / "dockerd.pid").read_text().strip()
        held = [(s, m) for s, m in mounts(pid) if s.startswith("/dev/loop") and s not in lab_loops()]
        held += [(s, m) for s, m in mounts(pid) if m == folder or m.startswith(folder + "/")]
        assert held == [], f"node {node}'s namespace holds the host's mounts: {held}"
    started = time.monotonic()
    host_disk.close()
    assert host_disk.release_problem is None, host_disk.release_problem
    assert disk_survey.devices(key) == [], f"{device} still attached"
    print(f"the host's disk released in {time.monotonic() - started:.1f} s with the lab up")


def receipt(root: Path, agent: str):
    state, _ = load_state(root / agent / "state")
    return state.last_receipt


def placements(root: Path) -> dict[str, str | None]:
    return {f"s{i}": read_node(root / f"s{i}" / "state") for i in range(AGENTS)}


def labelled(node: int) -> set[str]:
    """The agents whose sandbox containers are on this node's engine now."""
    out = on(node, "ps", "-a", "--filter", "label=wakeloop.sandbox", "--format", '{{.Label "wakeloop.agent"}}')
    return set(out.split())


def test_agents_spread_stay_and_wait_for_a_lost_node(stack):
    root = stack

    started = time.monotonic()

    def woken() -> dict[str, str | None] | None:
        p = placements(root)
        return p if all(p.values()) and all(receipt(root, a) for a in p) else None

    placed = wait_for(woken, "every agent placed and woken once", DEPLOY_S)
    by_node = {name: {a for a, n in placed.items() if n == name} for name in NODES}
    count = {name: len(agents) for name, agents in by_node.items()}
    assert all(count.values()), count  # spread over every node
    # ... by each node's measured rate (broker/nodes.py): the last agent a node took left it with no
    # more agents per container/s than any other would have had with one more
    rate = {name: ping(number).get("rate") for name, number in NODES.items()}
    print(f"placed {count} at rates {rate} ({time.monotonic() - started:.0f} s)")
    known = [r for r in rate.values() if r]
    share = {name: rate[name] or (sum(known) / len(known) if known else 1.0) for name in NODES}
    by_rate = all(count[i] / share[i] <= (count[j] + 1) / share[j] + 1e-9 for i in NODES for j in NODES)
    # The rates are asked now; an agent placed before its nodes' brokers had measured theirs was
    # placed as if all were alike (nodes.py: "not measured yet: as the others"), so an even spread
    # is also what the placement promises (seen: 4/4/4 at rates 4.6/3.4/3.5 measured after it).
    even = max(count.values()) - min(count.values()) <= 1
    assert by_rate or even, (count, rate)

    # Each agent's calls run on its own node's engine, and only there: every agent seen there by now
    # (a box lives for a call, or a wake's pool), none elsewhere.
    seen: dict[str, set[str]] = {name: set() for name in NODES}

    def calls_where_placed():
        for name, number in NODES.items():
            agents = labelled(number)
            assert agents <= by_node[name], f"{name} ran calls of agents placed elsewhere: {agents - by_node[name]}"
            seen[name] |= agents
        return all(seen[name] == by_node[name] for name in NODES)

    wait_for(calls_where_placed, "every node running its own agents' calls", DEPLOY_S)
    print(f"every agent's calls seen on its node ({time.monotonic() - started:.0f} s)")

    # The agents with a disk woke on it: its volume on their node's engine and no other's (a swarm
    # task gets no loop devices; its broker, a plain container of the node's engine, does).
    for agent in sorted(DISKED):
        assert receipt(root, agent).status == "done", receipt(root, agent)
        for name, number in NODES.items():
            volumes = on(number, "volume", "ls", "-q", "--filter", f"name=wakeloop-disk-{agent}-").split()
            assert bool(volumes) == (placed[agent] == name), f"{agent} on {placed[agent]}: {name} has {volumes}"

    # A node lost: its agents skip, saying why; the others keep waking.
    stopping = time.monotonic()
    lab("stop", str(NODES[LOST]), timeout=NODE_S)
    stopped = time.monotonic()
    lost_at = {a: receipt(root, a).wake for a in placed}
    wait_for(
        lambda: all((r := receipt(root, a)) and r.status == "skipped_node" for a in by_node[LOST]),
        f"{LOST}'s agents skipped",
        NODE_S,
    )
    assert LOST in receipt(root, sorted(by_node[LOST])[0]).reason
    print(
        f"{LOST} stopped in {stopped - stopping:.0f} s; its agents all skipped "
        f"{time.monotonic() - stopped:.0f} s after ({time.monotonic() - started:.0f} s)"
    )
    kept = set(placed) - by_node[LOST]
    wait_for(
        lambda: all((r := receipt(root, a)).status == "done" and r.wake > lost_at[a] for a in kept),
        "the other nodes' agents waking on",
        NODE_S,
    )
    status = subprocess.run(
        [str(REPO / ".venv/bin/wakeloop"), "status", str(root)], capture_output=True, text=True, timeout=60
    ).stdout
    for agent in by_node[LOST]:
        line = next(line for line in status.splitlines() if line.startswith(agent + " "))
        assert "unavailable" in line and LOST in line, line
    assert placements(root) == placed  # nobody moved
    print(f"the others woke on ({time.monotonic() - started:.0f} s)")

    # One of them moved by hand (`wakeloop move`) to a live node: it wakes there, its old node still down.
    moved = sorted(by_node[LOST] - DISKED)[0]
    done = on_the_bridge("move", str(root / moved), "--to", "swx-n1", WAKELOOP_BROKER="tls://10.211.0.11:7443")
    assert done.returncode == 0 and f"{LOST} -> swx-n1" in done.stdout, done.stdout + done.stderr
    moved_at, on_n1 = receipt(root, moved).wake, set()

    def woke_on_n1() -> bool:
        on_n1.update(labelled(1))  # its calls' containers, seen across polls
        return (r := receipt(root, moved)).status == "done" and r.wake > moved_at and moved in on_n1

    wait_for(woke_on_n1, f"{moved} waking on swx-n1", NODE_S)
    placed[moved] = "swx-n1"
    by_node[LOST].discard(moved)
    assert placements(root) == placed
    print(f"{moved} moved to swx-n1 and woke there ({time.monotonic() - started:.0f} s)")

    # The node back: its agents wake there again.
    back_at = {a: receipt(root, a).wake for a in by_node[LOST]}
    lab("start", str(NODES[LOST]), timeout=NODE_S)
    wait_for(
        lambda: all((r := receipt(root, a)).status == "done" and r.wake > back_at[a] for a in by_node[LOST]),
        f"{LOST}'s agents waking again",
        NODE_S,
    )
    assert placements(root) == placed
    # Its broker is a plain container its task started: the one the stopped engine left was removed
    # by the new task before it started its own (a task cannot clean up when its engine goes).
    brokers = on(NODES[LOST], "ps", "-a", "--filter", "label=wakeloop.broker-of", "--format", "{{.State}}").split()
    assert brokers == ["running"], f"{LOST}'s plain broker containers after its return: {brokers}"
    print(f"{LOST}'s agents woke again ({time.monotonic() - started:.0f} s)")

    # An agent with a disk moved (`wakeloop move`, run in the orchestrator's task as an operator
    # would) between two live nodes: its disk streamed there, its journal with it, the old one gone.
    mover = sorted(DISKED)[0]
    source = placed[mover]
    dest = next(name for name in NODES if name not in (source, LOST))
    journal = json.dumps({"op": "read", "agent": mover, "what": "journal_names"})
    before = json.loads(probe("ours", NODES[source], request=journal).splitlines()[-1])["result"]["value"]
    assert before, f"{mover} has woken on {source}: its journal is there"
    orchestrator = on(1, "ps", "-q", "--filter", "label=com.docker.swarm.service.name=wakeloop_orchestrator").split()

    def moved_disk() -> str | None:
        done = subprocess.run(
            ["docker", "-H", f"unix://{LAB}/n1/docker.sock", "exec", orchestrator[0]]
            + ["wakeloop", "move", f"/agents/{mover}", "--to", dest],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode and "is waking" in done.stderr:  # serve's wake of it holds its lock: again
            return None
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    said = wait_for(moved_disk, f"{mover} moved off a wake of it", NODE_S)
    assert f"its disk moved from {source} to {dest}" in said and "agreed at both ends" in said, said
    assert f"deleted its old disk on {source}" in said, said
    placed[mover] = dest
    assert placements(root) == placed
    moved_at, on_dest = receipt(root, mover).wake, set()

    def woke_on_dest() -> bool:
        on_dest.update(labelled(NODES[dest]))
        return (r := receipt(root, mover)).status == "done" and r.wake > moved_at and mover in on_dest

    wait_for(woke_on_dest, f"{mover} waking on {dest}", NODE_S)
    after = json.loads(probe("ours", NODES[dest], request=journal).splitlines()[-1])["result"]["value"]
    assert set(before) <= set(after), (before, after)
    for name, number in NODES.items():
        volumes = on(number, "volume", "ls", "-q", "--filter", f"name=wakeloop-disk-{mover}-").split()
        assert bool(volumes) == (name == dest), f"{mover} moved to {dest}: {name} has {volumes}"
    old = on(NODES[source], "ps", "-q", "--filter", "label=wakeloop.broker-of").split()
    images = on(NODES[source], "exec", old[0], "ls", "/var/lib/wakeloop/disks").split()
    assert not [i for i in images if i.startswith(f"{mover}-") and i.endswith(".img")], images
    print(f"{mover}'s disk moved from {source} to {dest}, woke there ({time.monotonic() - started:.0f} s)")


PROBE = """
import json, socket, ssl, sys
from pathlib import Path
how, certs, other, ip, request = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5]
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname = False
context.load_verify_locations(certs / "wakeloop-ca.pem")
if how == "ours":
    context.load_cert_chain(certs / "wakeloop-orchestrator.pem", certs / "wakeloop-orchestrator.key")
if how == "other_ca":
    context.load_cert_chain(other / "wakeloop-orchestrator.pem", other / "wakeloop-orchestrator.key")
if how == "broker_own":
    context.load_cert_chain(certs / "wakeloop-broker.pem", certs / "wakeloop-broker.key")
try:
    with socket.create_connection((ip, 7443), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="wakeloop-broker") as s:
            s.sendall(request.encode() + b"\\n")
            line = s.makefile("rb").readline()
            print(json.dumps(json.loads(line)) if line else "closed")
except (OSError, ssl.SSLError) as exc:
    print("refused:", exc)
"""


def probe(how: str, node: int, other: Path | None = None, request: str = '{"op": "ping"}') -> str:
    """PROBE from the lab's bridge (where the nodes' host-mode ports are) to node N's broker."""
    done = subprocess.run(
        ["ip", "netns", "exec", BRIDGE_NS, str(REPO / ".venv/bin/python"), "-c", PROBE, how, str(LAB / "certs")]
        + [str(other or LAB / "certs"), f"10.211.0.1{node}", request],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout + done.stderr


def on_the_bridge(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """`wakeloop ARGS` from the lab's bridge, as a machine of the stack runs it: the orchestrator's
    certificate, and `env`."""
    return subprocess.run(
        ["ip", "netns", "exec", BRIDGE_NS, str(REPO / ".venv/bin/wakeloop"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "WAKELOOP_TLS_DIR": str(LAB / "certs"), **env},
    )


def ping(node: int) -> dict:
    """Node N's broker's ping, asked with the stack's own certificate: {} if it did not answer."""
    out = probe("ours", node)
    try:
        reply = json.loads(out.splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return reply.get("result", {}) if isinstance(reply, dict) and reply.get("ok") else {}


def test_a_broker_answers_only_the_stacks_orchestrator(stack):
    other = LAB / "other-certs"  # a CA of another stack: a valid certificate, not ours
    subprocess.run([str(REPO / ".venv/bin/wakeloop"), "swarm", "certs", str(other)], check=True, capture_output=True)

    def answered() -> dict | None:
        reply = ping(2)
        return reply if reply.get("node") else None

    assert wait_for(answered, "node 2's broker answering our certificate", NODE_S)["node"] == "swx-n2"
    for how in ("none", "other_ca", "broker_own"):
        out = probe(how, 2, other)
        assert '"ok"' not in out and ("refused" in out or "closed" in out), f"{how}: {out}"


def test_a_nodes_broker_holds_the_ceiling_whatever_the_orchestrator_asks(stack):
    # A taken-over orchestrator writes an agent over the ceiling and asks a node's broker (with the
    # stack's own certificate) to serve it: refused, as on one host. Paused, so serve leaves it alone.
    from orchestrator.records import health

    staged = make_agent(LAB / "staged", "over", policy={"sandbox": {"disk": "none", "memory": "4g"}}, live=False)
    health.set_paused(staged / "state", True)
    staged.rename(stack / "over")
    out = probe("ours", 2, request='{"op": "check", "agent": "over"}')
    assert '"ok": false' in out and "over the broker's ceiling" in out and "sandbox.memory" in out, out


# Two or three of each category of registry.THROUGH_A_BROKER: all 69 take ~4 min on the lab's nodes
# (tests/escapes/test_through_a_broker.py runs them all through a broker on this host). Not
# caps_workspace_file_size: the lab's agents folder is a tmpfs, whose pages count against the
# box's memory, so its 1 GiB file is killed for memory first (exit 137, INCONCLUSIVE).
ON_A_NODE = [
    "blocks_reading_host_files",
    "blocks_mount",
    "blocks_leaked_host_fds",
    "write_file_refuses_path_tricks",
    "write_file_refuses_symlinks",
    "runs_as_unprivileged_user",
    "holds_no_capabilities",
    "enforces_seccomp_filter",
    "blocks_setuid_bit_at_creation",
    "has_no_interface_but_lo",
    "has_no_route_to_metadata",
    "hides_api_key",
    "hides_other_agents_workspaces",
    "hides_docker_socket",
    "kills_background_processes",
    "caps_process_count",
    "caps_memory",
    "blocks_changing_policy_or_mandate",
]


def test_the_escape_suite_holds_through_a_nodes_broker_over_mutual_tls(stack, tmp_path):
    """`wakeloop escapes --broker` as an operator runs it from a machine of the stack: the
    orchestrator's certificate, the shared agents folder, node 2's broker at its host-mode port."""
    assert set(ON_A_NODE) <= {p.name for p in THROUGH_A_BROKER}
    from orchestrator.records import health

    for i in range(AGENTS):  # `wakeloop pause`, as above: the nodes' cores for the probes, not for wakes
        health.set_paused(stack / f"s{i}" / "state", True)
    started = time.monotonic()
    done = on_the_bridge(
        "escapes",
        "--json",
        *("--broker", "tls://10.211.0.12:7443", "--root", str(stack), "--node", "swx-n2"),
        *(f"--probe={name}" for name in ON_A_NODE),
        timeout=600,
        WAKELOOP_REPORTS=str(tmp_path),
    )
    assert done.stdout.startswith("{"), f"exit {done.returncode}: {done.stderr[-3000:]}"
    report = json.loads(done.stdout)
    verdicts = {o["probe"]: o["verdict"] for o in report["probes"]}
    assert set(verdicts.values()) == {"HELD"}, [
        (o["probe"], o["observed"]) for o in report["probes"] if o["verdict"] != "HELD"
    ]
    assert done.returncode == 0 and sorted(verdicts) == sorted(ON_A_NODE), done.stderr[-2000:]
    assert report["through"] == "through the broker of node swx-n2 at tls://10.211.0.12:7443", report["through"]
    assert [p.name for p in stack.iterdir() if "escapes-" in p.name] == []  # the trials and the lab's folder
    print(f"{len(verdicts)} probes held through swx-n2's broker ({time.monotonic() - started:.0f} s)")
