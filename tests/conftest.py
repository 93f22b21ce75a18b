"""Shared fixtures: a real Docker engine, a real agent directory, a real sandbox.

Nothing here mocks the docker SDK. The suite needs a running engine and the
sandbox image; `.ci/run` (scripts/test.sh) provides both on a bare machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import docker
import pytest

from orchestrator.agent import init_agent, load_agent
from orchestrator.sandbox import LABEL, DockerSandbox

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def docker_client():
    client = docker.from_env()
    client.ping()  # no engine is a failure, not a skip: CI always has one
    return client


@pytest.fixture
def agent_dir(tmp_path) -> Path:
    """A fresh agent made by `wakeloop init`, workspace owned by the sandbox user."""
    return init_agent(tmp_path / "agent")


@pytest.fixture
def agent(agent_dir):
    return load_agent(agent_dir)


@pytest.fixture
def sandbox(agent, docker_client) -> DockerSandbox:
    return DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, client=docker_client)


def our_containers(client, base: Path) -> list:
    """Sandbox containers whose workspace lies under this test session's temp dir."""
    found = client.containers.list(all=True, filters={"label": f"{LABEL}=1"})
    return [c for c in found if c.labels.get("wakeloop.workspace", "").startswith(str(base))]


@pytest.fixture(scope="session", autouse=True)
def no_container_left_behind(tmp_path_factory, docker_client):
    """After the whole session, not one sandbox container of ours may exist."""
    base = tmp_path_factory.getbasetemp()
    yield
    left = our_containers(docker_client, base)
    for container in left:
        container.remove(force=True)
    assert not left, f"sandbox containers left behind: {[c.short_id for c in left]}"


def pytest_report_header(config):
    return f"docker: {os.environ.get('DOCKER_HOST', 'unix:///var/run/docker.sock')}"
