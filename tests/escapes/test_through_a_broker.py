"""`wakeloop escapes --broker`: the box's probes through a broker over mutual TLS (issue 24).

The broker runs in this process, on 127.0.0.1 with the stack's certificates,
as `wakeloop broker --listen tls://...` runs on a swarm node; the command
talks to it over the wire only (its lab has no engine: a probe that read one
would say so). tests/test_swarm.py runs the same command against a real
node's broker. The weakened control gives the broker's boxes root and the
default capabilities: the same probes, through the same wire, then escape.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.broker import tls
from orchestrator.cli.wakeloop import main
from orchestrator.escapes import ESCAPED, HELD
from orchestrator.escapes.registry import THROUGH_A_BROKER
from orchestrator.records.escape_reports import REPORTS_ENV
from orchestrator.sandbox.engine import DockerSandbox
from tests.conftest import SERIAL_PROBES
from tests.helpers.broker import served_tls

pytestmark = pytest.mark.docker


@pytest.fixture
def broker(tmp_path, monkeypatch, capsys):
    """(address, ROOT) of a broker over mutual TLS; this process holds the orchestrator's certificate."""
    certs, root = tmp_path / "certs", tmp_path / "agents"
    tls.make_certs(certs)
    root.mkdir()
    monkeypatch.setenv(tls.TLS_DIR_ENV, str(certs))
    monkeypatch.setenv(REPORTS_ENV, str(tmp_path / "reports"))
    with served_tls(root, certs, capsys) as address:
        yield address, root


def escapes(tmp_path, *args: str) -> tuple[int, dict]:
    """The exit code and the report kept for the console (stdout has the broker's log lines too)."""
    code = main(["escapes", *args])
    (kept,) = (tmp_path / "reports").iterdir()
    return code, json.loads(kept.read_text())


# The probes whose verdict rests on a wall-clock bound (tests/conftest.py SERIAL_PROBES, today
# bounds_huge_output: 1 GB within a deadline) run alone in the serial phase; the other 68 beside
# the rest of the suite, which takes their minute off the serial phase.
SERIAL = sorted(p.name for p in THROUGH_A_BROKER if p.name in SERIAL_PROBES)
PARALLEL = sorted(p.name for p in THROUGH_A_BROKER if p.name not in SERIAL_PROBES)


@pytest.mark.parametrize(
    "probes", [pytest.param(SERIAL, marks=pytest.mark.serial, id="serial"), pytest.param(PARALLEL, id="the-rest")]
)
def test_the_box_probes_hold_through_a_broker_over_mutual_tls_and_leave_its_root_as_it_was(broker, tmp_path, probes):
    assert probes  # without a --probe the command would run them all
    address, root = broker
    code, report = escapes(tmp_path, "--broker", address, "--root", str(root), *(f"--probe={p}" for p in probes))
    verdicts = {o["probe"]: o["verdict"] for o in report["probes"]}
    assert verdicts == dict.fromkeys(probes, HELD), [
        (o["probe"], o["observed"]) for o in report["probes"] if o["verdict"] != HELD
    ]
    assert code == 0 and report["through"] == f"through the broker at {address}"
    assert list(root.iterdir()) == []  # every trial agent and the lab's own folder removed


def test_the_same_probes_escape_a_broker_whose_boxes_run_as_root_with_all_default_caps(broker, tmp_path, monkeypatch):
    spec = DockerSandbox.container_spec

    def as_root(self, *args, **kwargs):
        config, host = spec(self, *args, **kwargs)
        config["user"] = "0:0"
        del host["cap_drop"]
        return config, host

    monkeypatch.setattr(DockerSandbox, "container_spec", as_root)  # the broker's boxes: it runs in this process
    address, root = broker
    probes = ["runs_as_unprivileged_user", "holds_no_capabilities"]
    code, report = escapes(tmp_path, "--broker", address, "--root", str(root), *(f"--probe={p}" for p in probes))
    assert code == 1
    assert {o["probe"]: o["verdict"] for o in report["probes"]} == dict.fromkeys(probes, ESCAPED), report


def test_escapes_through_a_broker_refuses_what_it_cannot_run_in_one_line(tmp_path, capsys):
    policy = tmp_path / "disk.yaml"
    policy.write_text("sandbox: {disk: 1g}\n")
    socket = str(tmp_path / "none.sock")
    cases = [
        (["--broker", socket], "--broker ADDRESS and --root ROOT go together"),
        (["--broker", socket, "--root", str(tmp_path), "--probe", "kills_at_deadline"], "runs only on this host"),
        (["--broker", socket, "--root", str(tmp_path), "--policy", str(policy)], "need `sandbox.disk: none`"),
        (["--broker", socket, "--root", str(tmp_path / "nowhere")], "is not a folder"),
    ]
    for args, said in cases:
        assert main(["escapes", *args]) == 2, args
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
