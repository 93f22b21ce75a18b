"""`docker compose up` in this repository: both images build, the demo agent wakes, down leaves nothing.

The run uses its own project name, so it never touches another stack on the
engine, and forces a dry run whatever a local .env says: this test never
calls the real API.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from orchestrator.sandbox.disks import disk
from tests.helpers import REPO, make_agent, scrubbed_env, wait_for
from tests.helpers.life import LIFE_POLICY, live_a_life, prepare

DISKS = REPO / "disks"  # compose's ./disks: the agents' workspace disks
BUILD_S = 900  # both images from scratch: apt and pip over the network
FIRST_WAKE_S = 150  # the demo wakes every 60s; a first wake is due at once or within 60s
DOWN_S = 120  # compose stops the orchestrator gracefully (its wake ends first)
LIFE_WAKE_S = 300  # one wake of the life: the 50 MB file, or 5,000 files committed, on a loaded host
RECEIPT = re.compile(r"demo: wake (\d+) (\w+).* \| receipt (\{.*\})$")
WORKSPACE_LABEL = "wakeloop.workspace=/agents/demo/workspace"  # the broker's view of the demo workspace


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONSOLE_PORT = free_port()  # not 8765: another stack on this engine may hold it


def compose_env() -> dict:
    env = scrubbed_env()
    env["WAKELOOP_DRY_RUN"] = "true"  # overrides a live .env: this test never calls the API
    env["WAKELOOP_CONSOLE_PORT"] = str(CONSOLE_PORT)
    return env


@pytest.fixture(scope="module")
def compose():
    setup = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
    assert setup.returncode == 0, (
        f"docker compose (v2) is not available; scripts/test.sh installs it (ensure_compose): {setup.stderr.strip()}"
    )
    project = f"wakeloop-test-{uuid.uuid4().hex[:8]}"

    def run(*args, timeout=DOWN_S, check=True):
        done = subprocess.run(
            ["docker", "compose", "-p", project, *args],
            cwd=REPO,
            env=compose_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert done.returncode == 0, f"docker compose {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done

    run.project = project  # the volumes down must remove are labelled with it
    disks_before = set(DISKS.glob("*.img"))
    token = REPO / "agents" / "console.token"
    token_before = token.exists()
    yield run
    if not token_before:
        token.unlink(missing_ok=True)
    run("down", "--volumes", "--remove-orphans", check=False)
    made = set(DISKS.glob("*.img")) - disks_before
    for image in made:  # the broker released it at its stop
        image.unlink()
        for kind in (".lock", ".use", ".call", ".engine"):
            image.with_suffix(kind).unlink(missing_ok=True)
        for point in (".view", ".box"):  # its mount points, empty once unmounted
            if image.with_suffix(point).is_dir():
                image.with_suffix(point).rmdir()
    index = DISKS / "index.json"
    if made and index.exists():  # and the index forgets them
        entries = json.loads(index.read_text())
        entries["disks"] = {k: v for k, v in entries["disks"].items() if k not in {i.stem for i in made}}
        index.write_text(json.dumps(entries))


def sandbox_containers(docker_client) -> list:
    return docker_client.api.containers(all=True, filters={"label": ["wakeloop.sandbox=1", WORKSPACE_LABEL]})


def test_compose_up_wakes_the_demo_agent_and_down_leaves_no_sandbox(compose, docker_client):
    compose("up", "--build", "--detach", timeout=BUILD_S)

    deadline, match = time.monotonic() + FIRST_WAKE_S, None
    while match is None and time.monotonic() < deadline:
        logs = compose("logs", "--no-color", "--no-log-prefix", "orchestrator").stdout
        match = next((m for m in map(RECEIPT.search, logs.splitlines()) if m), None)
        if match is None:
            time.sleep(1)
    assert match, f"no receipt from the demo agent in {FIRST_WAKE_S}s:\n{logs[-3000:]}"
    wake_no, status, receipt = int(match.group(1)), match.group(2), json.loads(match.group(3))
    assert status == "done" and receipt["live"] is False and receipt["tool_calls"] >= 1

    # The workspace is on the demo's disk, which only the broker mounts: the
    # orchestrator reads it through the broker, as a wake's context does.
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    context = compose("exec", "-T", "orchestrator", "wakeloop", "context", "/agents/demo").stdout
    assert f"--- {day}.md ---" in context and f"Wake #{wake_no}" in context
    host_journal = REPO / f"agents/demo/workspace/memory/journal/{day}.md"  # the folder, not the disk
    assert f"Wake #{wake_no}" not in (host_journal.read_text() if host_journal.exists() else "")

    broker_logs = compose("logs", "--no-color", "broker").stdout
    assert "broker: serving run/write" in broker_logs and "demo: run exit" in broker_logs
    # The wake is a transaction here too, on a host whose / is a private mount (the engine
    # mounts the disk and the wake's overlay: engine_mounts.py): committed at its end, its
    # diff readable, and its boxes saw the agent's files only (the dry run's `ls -la; find .`).
    run_id = receipt["run_id"]
    assert re.search(rf"demo: wake {run_id} committed: [1-9][0-9]* changed", broker_logs), broker_logs[-3000:]
    diff = compose("exec", "-T", "orchestrator", "wakeloop", "diff", "/agents/demo", "--run", run_id, "--json")
    assert f"memory/journal/{day}.md" in {p["change"]["path"] for p in json.loads(diff.stdout)["paths"]}
    transcript = (REPO / f"agents/demo/state/transcripts/{run_id}.jsonl").read_text()
    assert "./memory/core.md" in transcript and "lost+found" not in transcript and ".wakeloop" not in transcript
    assert "ceiling /policies/ceiling.yaml" in broker_logs  # what an edited agent.yaml cannot exceed
    ids = {s: compose("ps", "-q", s).stdout.strip() for s in ("broker", "orchestrator")}
    broker, orchestrator = (docker_client.api.inspect_container(ids[s]) for s in ("broker", "orchestrator"))
    assert not any(e.startswith("ANTHROPIC_") for e in broker["Config"]["Env"] or [])
    assert not any("docker.sock" in m["Source"] for m in orchestrator["Mounts"])
    # Healthchecks: the orchestrator started only once the broker answered ping; its console's
    # /healthz follows (one 10 s interval after its start). Logs rotate on both.
    health = lambda s: (docker_client.api.inspect_container(ids[s])["State"].get("Health") or {}).get("Status")
    assert health("broker") == "healthy"
    wait_for(lambda: health("orchestrator") == "healthy", "the console's healthcheck", timeout_s=60)
    for inspected in (broker, orchestrator):
        assert inspected["HostConfig"]["LogConfig"] == {
            "Type": "json-file",
            "Config": {"max-file": "3", "max-size": "10m"},
        }

    # The console, published on the host's loopback: the sign-in URL in the log (the host's port),
    # then the demo on the fleet page; its wake in /metrics (open on loopback).
    assert re.search(r"console: http://0\.0\.0\.0:8765/ \(token .*\); actions on", logs), logs[-3000:]
    sign_in = re.search(rf"console: sign in at (http://127\.0\.0\.1:{CONSOLE_PORT}/login\?token=\S+)", logs)
    assert sign_in, logs[-3000:]
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    with opener.open(sign_in.group(1), timeout=30) as signed_in:  # the cookie, then / without the token
        assert signed_in.url == f"http://127.0.0.1:{CONSOLE_PORT}/" and 'id="agent-demo"' in signed_in.read().decode()
    with pytest.raises(urllib.error.HTTPError) as foreign:
        urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{CONSOLE_PORT}/metrics", headers={"Host": "rebind.example"}),
            timeout=30,
        )
    assert foreign.value.code == 421
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{CONSOLE_PORT}/metrics", timeout=30).read().decode()
    assert re.search(r'wakeloop_wakes_total\{agent="demo",status="done"\} [1-9]', metrics)

    # An agent's ordinary life through the broker, the engine mounting its disk: ten wakes, each
    # checked from inside the next, then an undo (tests/helpers/life.py).
    life = REPO / "agents" / f"life-{uuid.uuid4().hex[:8]}"
    try:
        make_agent(life.parent, life.name, schedule="0 0 1 1 *", policy={"version": 1, **LIFE_POLICY})
        prepare(life)
        cli = lambda *args: compose("exec", "-T", "orchestrator", "wakeloop", *args, timeout=LIFE_WAKE_S, check=False)
        live_a_life(cli, life, f"/agents/{life.name}")
    finally:
        shutil.rmtree(life, ignore_errors=True)

    compose("down", "--volumes", timeout=DOWN_S)  # as the README writes it
    assert compose("ps", "-a", "-q").stdout.strip() == ""
    project = docker_client.volumes.list(filters={"label": f"com.docker.compose.project={compose.project}"})
    assert project == [] and (REPO / "agents/demo/state").is_dir()  # no volume; the agent kept
    assert sandbox_containers(docker_client) == []
    ours = lambda labels: (labels or {}).get(disk.LABEL, "").startswith("/var/lib/wakeloop/disks/")  # the broker's
    keepers = docker_client.api.containers(all=True, filters={"label": disk.LABEL})
    volumes = docker_client.api.volumes(filters={"label": disk.LABEL}).get("Volumes") or []
    assert [c["Names"] for c in keepers if ours(c["Labels"])] == [] and [v for v in volumes if ours(v["Labels"])] == []


def _readme_opening() -> str:
    """The README's first two code blocks: the two commands a newcomer needs, then how to stop."""
    blocks = (REPO / "README.md").read_text().split("```")
    return blocks[1] + blocks[3]


def test_one_compose_file_runs_one_host_with_its_override_and_a_swarm_alone():
    # `docker compose up` reads compose.yaml and compose.override.yaml; `docker stack deploy -c
    # compose.yaml` reads compose.yaml alone, through the docker CLI's own loader (format 3.x),
    # which refuses what only compose knows. Both are the CLI's, no engine needed.
    def loaded(*argv: str) -> dict:
        done = subprocess.run(["docker", *argv], cwd=REPO, env=compose_env(), capture_output=True, timeout=60)
        assert done.returncode == 0, f"docker {' '.join(argv)}: {done.stderr.decode()}"
        return yaml.safe_load(done.stdout)

    one_host = loaded("compose", "config")
    host = one_host["services"]
    assert set(host) == {"sandbox-image", "broker", "orchestrator"}
    # The README's `docker compose down --volumes` leaves nothing but what it says it keeps: the one
    # named volume (the broker's socket) goes with --volumes; ./agents and ./disks are host folders.
    assert "\ndocker compose down --volumes " in _readme_opening()
    assert set(one_host["volumes"]) == {"broker-socket"}
    kept = {v["source"] for s in host.values() for v in s.get("volumes", []) if v["type"] == "bind"}
    assert {Path(k).relative_to(REPO).as_posix() for k in kept if k.startswith(str(REPO))} == {
        "agents",
        "disks",
        "policies",  # the checkout's own, read-only
    }
    broker, orchestrator = host["broker"], host["orchestrator"]
    assert "--socket" in broker["entrypoint"] and broker["device_cgroup_rules"] and not broker.get("ports")
    assert not broker.get("secrets") and not orchestrator.get("secrets")  # no certificates on one host
    assert broker["environment"]["WAKELOOP_NODE"] == ""  # one broker, no node
    assert [p["host_ip"] for p in orchestrator["ports"]] == ["127.0.0.1"]  # the console on loopback only

    swarm = loaded("stack", "config", "-c", "compose.yaml")["services"]
    assert set(swarm) == {"broker", "orchestrator"}
    assert swarm["broker"]["deploy"]["mode"] == "global" and "--plain-container" in swarm["broker"]["entrypoint"]
    assert "/policies/ceiling.yaml" in swarm["broker"]["entrypoint"]  # a swarm's broker holds the ceiling too
    assert swarm["orchestrator"]["environment"]["WAKELOOP_BROKER"] == "tls://tasks.broker:7443"
    # no console: a swarm publishes a port on every address (it ignores 127.0.0.1)
    assert not swarm["orchestrator"].get("ports")
