"""A sandbox's gVisor boxes join one empty network namespace; runc boxes keep their own
(orchestrator/sandbox/egress/netns.py). What they can reach through it: the probe
boxes_share_no_loopback and its weakened control (tests/escapes/)."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.policy.schema import SandboxPolicy
from orchestrator.sandbox.egress import netns
from orchestrator.sandbox.engine import DockerSandbox
from tests.helpers import wait_for

TIMEOUT, CAP = 30, 20_000


def _holders(client, box) -> list[dict]:
    return client.api.containers(all=True, filters={"label": f"{netns.LABEL}={box.workspace}"})


def _running_boxes(client, box) -> list[dict]:
    filters = {"label": f"wakeloop.workspace={box.workspace}", "status": "running"}
    return client.api.containers(filters=filters)  # one listing: no lookup to race a removal


def test_gvisor_boxes_join_one_holder_runc_boxes_keep_their_own(make_sandbox, docker_client, runtime):
    box = make_sandbox(warm=1)
    for _ in range(3):
        assert box.run("echo ok", timeout_s=TIMEOUT, max_output_chars=CAP).output.strip() == "ok"
    # The pool's box ahead stays until a call takes it (its refill may still be on its way).
    idle = wait_for(lambda: _running_boxes(docker_client, box), "the pool's box ahead", TIMEOUT)
    modes = {c["HostConfig"]["NetworkMode"] for c in idle}
    holders = _holders(docker_client, box)
    if runtime == "runsc":
        assert [h["State"] for h in holders] == ["running"]
        assert modes == {f"container:{holders[0]['Id']}"}  # as the engine lists it: by id
        assert docker_client.api.inspect_container(holders[0]["Id"])["HostConfig"]["Runtime"] == "runc"
    else:
        assert holders == [] and modes == {"none"}
    box.close()
    assert _holders(docker_client, box) == []


def test_a_holder_gone_is_made_anew_for_the_next_box(agent, docker_client, engine_runtimes):
    assert "runsc" in engine_runtimes, "scripts/setup-runsc.sh registers it"
    policy = replace(agent.policy.sandbox, runtime="runsc")
    with DockerSandbox(agent.workspace, policy, agent=agent.name, client=docker_client, warm=0) as box:
        assert box.run("true", timeout_s=TIMEOUT, max_output_chars=CAP).exit_code == 0
        docker_client.api.remove_container(_holders(docker_client, box)[0]["Id"], force=True)  # an operator's rm -f
        assert box.run("echo again", timeout_s=TIMEOUT, max_output_chars=CAP).output.strip() == "again"
        assert [h["State"] for h in _holders(docker_client, box)] == ["running"]
    assert _holders(docker_client, box) == []


def test_holders_an_earlier_run_left_are_removed_and_ours_kept(make_sandbox, docker_client, runtime):
    box = make_sandbox(warm=0)
    stale = netns.Holder(docker_client, box.workspace, box.policy.image)
    stale.ensure()  # a crashed run's: never closed
    try:
        assert box.run("true", timeout_s=TIMEOUT, max_output_chars=CAP).exit_code == 0
        ours = {h["Names"][0] for h in _holders(docker_client, box)} - {"/" + stale.name}
        assert box.cleanup_leftovers() == 1
        assert {h["Names"][0] for h in _holders(docker_client, box)} == ours
        assert len(ours) == (runtime == "runsc")
    finally:
        stale.close()


def test_a_brokers_sweep_removes_the_holders_under_its_root_only(docker_client, tmp_path):
    root, image = tmp_path / "agents", SandboxPolicy().image
    left = [netns.Holder(docker_client, root / name / "workspace", image) for name in ("a", "b")]
    elsewhere = netns.Holder(docker_client, tmp_path / "agents-too" / "workspace", image)  # a prefix, not a parent
    try:
        for holder in (*left, elsewhere):
            holder.ensure()
        assert netns.leftovers(docker_client, root) == 2
        found = docker_client.api.containers(all=True, filters={"label": netns.LABEL})
        assert [c["Names"][0] for c in found if str(tmp_path) in c["Labels"][netns.LABEL]] == ["/" + elsewhere.name]
    finally:
        for holder in (*left, elsewhere):
            holder.close()


def test_a_policy_that_leaves_gvisor_drops_the_holder_and_one_that_returns_makes_another(
    agent, docker_client, engine_runtimes
):
    assert "runsc" in engine_runtimes, "scripts/setup-runsc.sh registers it"
    under = {rt: replace(agent.policy.sandbox, runtime=rt) for rt in ("runsc", "runc")}
    with DockerSandbox(agent.workspace, under["runsc"], agent=agent.name, client=docker_client, warm=0) as box:
        for runtime, holders in (("runsc", 1), ("runc", 0), ("runsc", 1)):
            box.update_policy(under[runtime])
            assert box.run("echo ok", timeout_s=TIMEOUT, max_output_chars=CAP).output.strip() == "ok"
            assert len(_holders(docker_client, box)) == holders, runtime
    assert _holders(docker_client, box) == []
