"""Fixtures for the escape suite: a lab under the test's temp dir, on each runtime.

Every box a probe makes is labelled with a workspace under this session's
temp dir, so the session's no-leftover check (tests/conftest.py) covers
them, weakened ones included.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import pytest

from orchestrator.escapes.lab import Lab
from orchestrator.policy.schema import SandboxPolicy


@pytest.fixture
def make_lab(docker_client, runtime, tmp_path):
    """Lab(sandbox_class=...) under the default policy and `runtime`."""

    def make(sandbox_class=None, **policy_changes) -> Lab:
        policy = replace(SandboxPolicy(), runtime=runtime, **policy_changes)
        kwargs = {"sandbox_class": sandbox_class} if sandbox_class else {}
        return Lab(client=docker_client, policy=policy, base=tmp_path / "lab", **kwargs)

    return make


@pytest.fixture
def surface_lab(docker_client, tmp_path) -> Lab:
    """A lab for the probes of the surfaces around the box, which make no box."""
    return Lab(client=docker_client, policy=SandboxPolicy(), base=tmp_path / "lab")


@pytest.fixture(scope="session", autouse=True)
def no_orphaned_shims(docker_client):
    """Engine 20.10 with runsc leaves a containerd shim behind for every container
    that fails to start, and the CVE-2024-21626 probes make several on purpose
    (a workdir of /proc/self/fd/N). At the end, stop the shims whose container
    the engine no longer has, and only those: nothing else on the host is touched."""
    yield
    # Shims first, then the engine's list: a shim another test session's container started
    # meanwhile (a parallel worker's) had its container created before, so it is known.
    shims = _moby_shims()
    known = {c["Id"] for c in docker_client.api.containers(all=True)}
    for pid, args in shims:
        container = args[args.index("-id") + 1] if "-id" in args else None
        if container and container not in known:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _moby_shims() -> list[tuple[int, list[str]]]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                args = cmdline.read().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue
        if args[0].endswith("containerd-shim-runc-v2") and "moby" in args:
            found.append((int(entry), args))
    return found
