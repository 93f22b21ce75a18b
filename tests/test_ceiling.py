"""The broker's ceiling: reading it, and what it refuses. (The broker enforcing it
on real requests is in test_broker.py; the attack, in the escape suite.)"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.policy.ceiling import Ceiling, load_ceiling
from orchestrator.policy.load import load_policy
from orchestrator.policy.schema import DEFAULT, PolicyError
from tests.helpers import REPO

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
    assert ceiling.networks == ("none", "allowlist")  # no open egress unless the user adds it


def test_each_kind_of_ask_over_the_ceiling_is_refused_naming_its_key():
    ceiling = Ceiling(
        runtimes=("runsc",),
        images=("wakeloop-sandbox:latest",),
        networks=("none",),
        max={"memory": 2**30, "pids": 512, "cpus": 2, "timeout_s": 600},
        source="c.yaml",
    )
    assert ceiling.refusal(with_box(runtime="runsc")) is None
    assert ceiling.refusal(with_box(runtime="runc")) == (
        "<defaults>: sandbox.runtime: runc is not one the broker allows: runsc (ceiling c.yaml)"
    )
    assert "sandbox.image: debian:bookworm-slim is not" in ceiling.refusal(
        with_box(runtime="runsc", image="debian:bookworm-slim")
    )
    assert "sandbox.network: bridge is not" in ceiling.refusal(with_box(runtime="runsc", network="bridge"))
    assert ceiling.refusal(with_box(runtime="runsc", pids=100_000)) == (
        "<defaults>: sandbox.pids: 100,000 is over the broker's ceiling of 512 (ceiling c.yaml)"
    )
    assert "sandbox.memory: 4,294,967,296 bytes is over the broker's ceiling of 1,073,741,824 bytes" in (
        ceiling.refusal(with_box(runtime="runsc", memory=4 * 2**30))
    )
    assert "sandbox.cpus: 2.5 is over" in ceiling.refusal(with_box(runtime="runsc", cpus=2.5))
    slow = replace(
        DEFAULT,
        sandbox=replace(DEFAULT.sandbox, runtime="runsc"),
        tools=replace(DEFAULT.tools, write_file=replace(DEFAULT.tools.write_file, timeout_s=3600)),
    )
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


def load_error(tmp_path: Path, text: str) -> str:
    """What load_ceiling says of a c.yaml holding `text` (it must refuse it)."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        load_ceiling(path)
    return str(caught.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("runtimes: [runc]\nmaximum: {pids: 5}\n", "c.yaml:2: maximum: unknown key"),
        ("networks: [none, wide]\n", "c.yaml:1: networks: wide is not one of none, allowlist, bridge"),
        ("images: wakeloop-sandbox:latest\n", "c.yaml:1: images: expected a non-empty list of names"),
        ("max:\n  memory: 512x\n", "c.yaml:2: max.memory: expected a size like 64m"),
        ("max:\n  pids: -1\n", "c.yaml:2: max.pids: expected a number of at least 0, got -1"),
        ("max:\n  swap: 1g\n", "c.yaml:2: max.swap: unknown key; max bounds memory"),
        ("- runc\n", "c.yaml: (top level): a ceiling is a mapping"),
        ("runtimes: [runc\n", "c.yaml: not YAML text"),
    ],
)
def test_a_bad_ceiling_is_one_line_naming_the_file_line_and_key(tmp_path, text, message):
    error = load_error(tmp_path, text)
    assert error.startswith(f"{tmp_path}/{message}")
    assert "\n" not in error


def test_policy_check_reads_the_ceiling_as_a_ceiling():
    done = subprocess.run(
        CLI + ["policy", "check", str(SHIPPED)], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"ok: {SHIPPED} (a broker ceiling)"), done.stderr


def test_the_broker_will_not_start_on_a_bad_ceiling(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("max:\n  pids: lots\n")
    (tmp_path / "agents").mkdir()
    done = subprocess.run(
        CLI + ["broker", str(tmp_path / "agents"), "--socket", str(tmp_path / "s"), "--ceiling", str(bad)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"wakeloop: {bad}:2: max.pids: expected a number of at least 0, got 'lots'\n"
    assert not (tmp_path / "s").exists()


def test_users_env_names_and_hosts_are_bounded_naming_their_key():
    ceiling = Ceiling(
        users=(1000, 60000), env_names=("LANG", "LC_*"), hosts=("pypi.org", "*.pythonhosted.org"), source="c.yaml"
    )
    assert ceiling.refusal(with_box(user="1000:1000")) is None
    assert ceiling.refusal(with_box(user="999:1000")) == (
        "<defaults>: sandbox.user: 999:1000 is outside the uids and gids the broker allows: "
        "1000 to 60000 (ceiling c.yaml)"
    )
    assert "sandbox.user: 1000:65534 is outside" in ceiling.refusal(with_box(user="1000:65534"))
    # "auto" is bounded as the broker resolved it for the workspace (its owner)
    assert ceiling.refusal(with_box(), user="1000:1000") is None
    assert "sandbox.user: auto (auto: the workspace owner is 70000:70000) is outside" in (
        ceiling.refusal(with_box(), user="70000:70000")
    )
    assert ceiling.refusal(with_box(env=(("LANG", "C"), ("LC_ALL", "C")))) is None
    assert ceiling.refusal(with_box(env=(("LANG", "C"), ("LD_PRELOAD", "/tmp/x.so")))) == (
        "<defaults>: sandbox.env.LD_PRELOAD: LD_PRELOAD is not a name the broker lets a policy set: "
        "LANG, LC_* (ceiling c.yaml)"
    )
    allow = lambda *hosts: with_box(network="allowlist", allow_hosts=hosts)
    assert ceiling.refusal(allow("pypi.org", "files.pythonhosted.org")) is None
    for asked in ("example.org", "*.pypi.org", "pythonhosted.org", "pypi.org:8443", "evilpypi.org"):
        assert f"sandbox.allow_hosts: {asked} is not a host the broker allows" in ceiling.refusal(allow(asked)), asked


def test_root_is_refused_even_by_a_ceiling_without_users():
    assert "sandbox.user: auto (auto: the workspace owner is 0:0) is outside" in Ceiling().refusal(
        with_box(), user="0:0"
    )
    assert Ceiling().refusal(with_box(), user="1000:1000") is None


def test_an_empty_env_names_or_hosts_list_allows_none():
    ceiling = Ceiling(env_names=(), hosts=())
    assert "sandbox.env.LANG" in ceiling.refusal(with_box(env=(("LANG", "C"),)))
    assert "sandbox.allow_hosts: pypi.org" in ceiling.refusal(with_box(network="allowlist", allow_hosts=("pypi.org",)))


def test_the_shipped_ceiling_bounds_users_env_hosts_and_the_brokers_capacity():
    ceiling = load_ceiling(SHIPPED)
    assert ceiling.users == (1000, 60000)
    assert "LD_PRELOAD" in ceiling.refusal(with_box(env=(("LD_PRELOAD", "x"),)))
    assert "example.org" in ceiling.refusal(with_box(network="allowlist", allow_hosts=("example.org",)))
    assert {k: ceiling.max[k] for k in ("calls", "calls_per_agent", "agents")} == {
        "calls": 16,
        "calls_per_agent": 4,
        "agents": 32,
    }


@pytest.mark.parametrize(
    "text, message",
    [
        ("users: {min: 0, max: 10}\n", "c.yaml:1: users: expected {min: 1000, max: 60000}"),
        ("users: {min: 2000, max: 1000}\n", "c.yaml:1: users: expected"),
        ("env_names: [LANG, 'LD PRELOAD']\n", "c.yaml:1: env_names: 'LD PRELOAD' is not a variable name"),
        ("hosts:\n  - pypi.org\n  - 10.0.0.1\n", "c.yaml:3: hosts: '10.0.0.1' is an IP address"),
        ("max:\n  calls: 0\n", "c.yaml:2: max.calls: expected a whole number of at least 1, got 0"),
        ("max:\n  agents: 2.5\n", "c.yaml:2: max.agents: expected a whole number of at least 1"),
    ],
)
def test_a_bad_users_env_names_hosts_or_capacity_is_one_line(tmp_path, text, message):
    assert load_error(tmp_path, text).startswith(f"{tmp_path}/{message}")


def test_the_ceiling_bounds_disk_and_files_and_refuses_no_disk_at_all():
    ceiling = Ceiling(max={"disk": 4 * 2**30, "files": 200_000}, source="c.yaml")
    assert ceiling.refusal(with_box(disk=2 * 2**30, files=100_000)) is None
    assert ceiling.refusal(with_box(disk=8 * 2**30)) == (
        "<defaults>: sandbox.disk: 8,589,934,592 bytes is over the broker's ceiling of 4,294,967,296 bytes "
        "(ceiling c.yaml)"
    )
    assert "sandbox.files: 1,000,000 is over the broker's ceiling of 200,000" in ceiling.refusal(
        with_box(files=1_000_000)
    )
    assert ceiling.refusal(with_box(disk=0)) == (
        "<defaults>: sandbox.disk: none (a folder with no limit) is over the broker's ceiling of "
        "4,294,967,296 bytes (ceiling c.yaml)"
    )
    assert load_ceiling(SHIPPED).refusal(with_box(disk=0)) is not None  # the shipped one wants a disk


# -- every number a policy can ask for has a bound ------------------------------------


def schema_numbers(cls=None, prefix: str = "") -> dict[str, type]:
    """Every int, float or size field of the policy schema's dataclasses, by dotted key,
    walked from the declared types (not from ceiling.py, whose walk this checks)."""
    import dataclasses
    import typing

    from orchestrator.policy.schema import Policy

    cls = cls or Policy
    found = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            found |= schema_numbers(kind, f"{prefix}{f.name}.")
        elif kind in (int, float) and f.name != "version":  # version asks the host for nothing
            found[prefix + f.name] = kind
    return found


def test_the_schema_walk_finds_the_numbers_we_know_of():
    keys = schema_numbers()
    for known in (
        "tools.bash.max_output_chars",
        "tools.send_message.max_chars",
        "sandbox.memory",
        "sandbox.disk",
        "budget.max_usd_per_day",
        "state.rotate_days",
        "transcript.max_wake_bytes",
    ):
        assert known in keys


def test_the_ceiling_bounds_every_number_a_policy_can_ask_for():
    """A number the schema gains without a bound here would let a policy ask the broker for any amount."""
    ceiling = load_ceiling(SHIPPED)
    unbounded = sorted(key for key in schema_numbers() if key.rsplit(".", 1)[1] not in ceiling.max)
    assert unbounded == [], f"no bound in {SHIPPED.name} for: {', '.join(unbounded)}"


@pytest.mark.parametrize("key", sorted(schema_numbers()))
def test_each_number_past_its_bound_is_refused_naming_its_key(key):
    ceiling = load_ceiling(SHIPPED)
    limit = ceiling.max[key.rsplit(".", 1)[1]]
    over = limit * 2 + 1
    policy = _with(DEFAULT, key.split("."), int(over) if schema_numbers()[key] is int else float(over))
    refusal = ceiling.refusal(policy)
    assert refusal and f": {key}: " in refusal and "is over the broker's ceiling" in refusal, refusal


@pytest.mark.parametrize("key", ["budget.max_usd_per_wake", "budget.max_usd_per_day", "sandbox.disk"])
def test_zero_meaning_no_limit_is_over_a_bound(key):
    refusal = load_ceiling(SHIPPED).refusal(_with(DEFAULT, key.split("."), 0))
    assert refusal and f": {key}: " in refusal, refusal


def test_max_output_chars_of_a_hundred_billion_is_refused():
    policy = _with(DEFAULT, ["tools", "bash", "max_output_chars"], 100_000_000_000)
    assert "tools.bash.max_output_chars: 100,000,000,000 is over the broker's ceiling of 1,000,000" in (
        load_ceiling(SHIPPED).refusal(policy)
    )


def _with(obj, path: list[str], value):
    if len(path) == 1:
        return replace(obj, **{path[0]: value})
    return replace(obj, **{path[0]: _with(getattr(obj, path[0]), path[1:], value)})
