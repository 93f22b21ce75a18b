"""Fixtures for the escape suite: a lab under the test's temp dir, on each runtime.

Every box a probe makes is labelled with a workspace under this session's
temp dir, so the session's no-leftover check (tests/conftest.py) covers
them, weakened ones included.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.escapes.core import Lab
from orchestrator.policy import SandboxPolicy


@pytest.fixture
def make_lab(docker_client, runtime, tmp_path):
    """Lab(sandbox_class=...) under the default policy and `runtime`."""
    def make(sandbox_class=None, **policy_changes) -> Lab:
        policy = replace(SandboxPolicy(), runtime=runtime, **policy_changes)
        kwargs = {"sandbox_class": sandbox_class} if sandbox_class else {}
        return Lab(client=docker_client, policy=policy, base=tmp_path / "lab", **kwargs)
    return make
