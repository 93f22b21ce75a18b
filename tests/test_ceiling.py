"""The broker's ceiling: reading it, and what it refuses. (The broker enforcing it
on real requests is in test_broker.py; the attack, in the escape suite.)"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.policy.ceiling import Ceiling, load_ceiling
from orchestrator.policy.schema import DEFAULT, PolicyError, load_policy

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "policies" / "ceiling.yaml"
CLI = [sys.executable, "-m", "orchestrator"]
CLI_TIMEOUT_S = 60


def with_box(**changes):
    return replace(DEFAULT, sandbox=replace(DEFAULT.sandbox, **changes))


def test_the_shipped_ceiling_admits_every_shipped_policy_and_the_default():
    ceiling = load_ceiling(SHIPPED)
    for path in sorted((REPO / "policies").glob("*.yaml")):
        if path != SHIPPED:
            assert ceiling.refusal(load_policy(path)) is None, path.name
    assert ceiling.refusal(DEFAULT) is None
    assert ceiling.networks == ("none", "allowlist")     # no open egress unless the user adds it


def test_each_kind_of_ask_over_the_ceiling_is_refused_naming_its_key():
    ceiling = Ceiling(runtimes=("runsc",), images=("wakeloop-sandbox:latest",), networks=("none",),
                      max={"memory": 2**30, "pids": 512, "cpus": 2, "timeout_s": 600}, source="c.yaml")
    assert ceiling.refusal(with_box(runtime="runsc")) is None
    assert ceiling.refusal(with_box(runtime="runc")) == (
        "<defaults>: sandbox.runtime: runc is not one the broker allows: runsc (ceiling c.yaml)")
    assert "sandbox.image: debian:bookworm-slim is not" in ceiling.refusal(
        with_box(runtime="runsc", image="debian:bookworm-slim"))
    assert "sandbox.network: bridge is not" in ceiling.refusal(with_box(runtime="runsc", network="bridge"))
    assert ceiling.refusal(with_box(runtime="runsc", pids=100_000)) == (
        "<defaults>: sandbox.pids: 100,000 is over the broker's ceiling of 512 (ceiling c.yaml)")
    assert "sandbox.memory: 4,294,967,296 bytes is over the broker's ceiling of 1,073,741,824 bytes" in (
        ceiling.refusal(with_box(runtime="runsc", memory=4 * 2**30)))
    assert "sandbox.cpus: 2.5 is over" in ceiling.refusal(with_box(runtime="runsc", cpus=2.5))
    slow = replace(DEFAULT, sandbox=replace(DEFAULT.sandbox, runtime="runsc"),
                   tools=replace(DEFAULT.tools, write_file=replace(DEFAULT.tools.write_file, timeout_s=3600)))
    assert "tools.write_file.timeout_s: 3,600 is over" in ceiling.refusal(slow)


def test_a_refusal_names_the_line_of_the_key_that_asks_too_much(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nsandbox:\n  memory: 1g\n  pids: 4096\n")
    refusal = Ceiling(max={"pids": 1024}, source="c.yaml").refusal(load_policy(policy))
    assert refusal == f"{policy}:4: sandbox.pids: 4,096 is over the broker's ceiling of 1,024 (ceiling c.yaml)"


def test_an_empty_ceiling_limits_nothing(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# nothing\n")
    assert load_ceiling(path).refusal(with_box(pids=10**6, network="bridge", runtime="kata")) is None


@pytest.mark.parametrize("text, message", [
    ("runtimes: [runc]\nmaximum: {pids: 5}\n", "c.yaml:2: maximum: unknown key"),
    ("networks: [none, wide]\n", "c.yaml:1: networks: wide is not one of none, allowlist, bridge"),
    ("images: wakeloop-sandbox:latest\n", "c.yaml:1: images: expected a non-empty list of names"),
    ("max:\n  memory: 512x\n", "c.yaml:2: max.memory: expected a size like 64m"),
    ("max:\n  pids: -1\n", "c.yaml:2: max.pids: expected a number of at least 0, got -1"),
    ("max:\n  swap: 1g\n", "c.yaml:2: max.swap: unknown key; max bounds memory"),
    ("- runc\n", "c.yaml: (top level): a ceiling is a mapping"),
    ("runtimes: [runc\n", "c.yaml: not YAML text"),
])
def test_a_bad_ceiling_is_one_line_naming_the_file_line_and_key(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        load_ceiling(path)
    assert str(caught.value).startswith(f"{tmp_path}/{message}")
    assert "\n" not in str(caught.value)


def test_policy_check_reads_the_ceiling_as_a_ceiling():
    done = subprocess.run(CLI + ["policy", "check", str(SHIPPED)], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)
    assert (done.returncode, done.stdout.strip()) == (0, f"ok: {SHIPPED} (a broker ceiling)"), done.stderr


def test_the_broker_will_not_start_on_a_bad_ceiling(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("max:\n  pids: lots\n")
    (tmp_path / "agents").mkdir()
    done = subprocess.run(CLI + ["broker", str(tmp_path / "agents"), "--socket", str(tmp_path / "s"),
                                 "--ceiling", str(bad)], capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"wakeloop: {bad}:2: max.pids: expected a number of at least 0, got 'lots'\n"
    assert not (tmp_path / "s").exists()
