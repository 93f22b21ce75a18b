"""Finding a container's count of OOM kills on the host (orchestrator/sandbox/containers/oom.py),
on made-up /proc and cgroup trees: cgroup v1 and v2, a reused pid, nothing to see.
The engine's use of it, on real containers, is in test_sandbox.py."""

from __future__ import annotations

from orchestrator.sandbox.containers import oom

CID = "ab" * 32


def tree(tmp_path, cgroup_lines: str, files: dict[str, str]):
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(cgroup_lines)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return proc, root


def test_v1_memory_controller_count(tmp_path):
    proc, root = tree(
        tmp_path,
        f"5:cpu,cpuacct:/docker/{CID}\n4:memory:/docker/{CID}\n",
        {f"memory/docker/{CID}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"},
    )
    found = oom.counter_file(42, CID, proc, root)
    assert found == root / "memory" / "docker" / CID / "memory.oom_control"
    assert oom.read_kills(found) == 2


def test_v2_unified_count(tmp_path):
    proc, root = tree(
        tmp_path,
        f"0::/system.slice/docker-{CID}.scope\n",
        {f"system.slice/docker-{CID}.scope/memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n"},
    )
    found = oom.counter_file(42, CID, proc, root)
    assert found is not None and oom.read_kills(found) == 0


def test_a_pid_now_in_another_cgroup_is_not_the_containers(tmp_path):
    # The container died and its pid went to another process: never that one's count.
    other = "cd" * 32
    proc, root = tree(
        tmp_path, f"4:memory:/docker/{other}\n", {f"memory/docker/{other}/memory.oom_control": "oom_kill 5\n"}
    )
    assert oom.counter_file(42, CID, proc, root) is None


def test_nothing_to_see_is_none(tmp_path):
    proc, root = tree(tmp_path, f"4:memory:/docker/{CID}\ngarbage\n", {})  # no cgroup files here
    assert oom.counter_file(42, CID, proc, root) is None
    assert oom.counter_file(7, CID, proc, root) is None  # no such process
    assert oom.counter_file(0, CID, proc, root) is None  # the engine's "not running"
    proc, root = tree(
        tmp_path / "old",
        f"4:memory:/docker/{CID}\n",
        {f"memory/docker/{CID}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n"},
    )
    assert oom.counter_file(42, CID, proc, root) is None  # a kernel before 4.13 keeps no count


def test_the_usual_place_needs_no_pid(tmp_path):
    root = tmp_path / "cgroup"
    (root / "memory" / "docker" / CID).mkdir(parents=True)
    (root / "memory" / "docker" / CID / "memory.oom_control").write_text("oom_kill 1\n")
    assert oom.read_kills(oom.usual_counter_file(CID, root)) == 1
    assert oom.usual_counter_file("cd" * 32, root) is None and oom.usual_counter_file("", root) is None
