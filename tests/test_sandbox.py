"""The sandbox against the real engine: one test (or more) per promise of issue 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc
from dataclasses import replace

import docker
import pytest

from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.containers.engine_client import connect
from orchestrator.sandbox.engine import DockerSandbox
from tests.helpers import wait_for
from tests.helpers.sync import exec_to_interrupt, interrupt

TIMEOUT = 30  # generous per-call deadline for commands that should finish at once
CAP = 20_000  # the default policy's max_output_chars


def run(box, command, timeout=TIMEOUT, cap=CAP):
    return box.run(command, timeout_s=timeout, max_output_chars=cap)


def container_exists(client, cid) -> bool:
    try:
        client.containers.get(cid)
        return True
    except docker.errors.NotFound:
        return False


def processes_alive(client, cid) -> bool:
    """Whether anything still runs in the call's container. Removal itself may
    trail the call (the pool removes off the call's path); no process may."""
    try:
        return client.api.inspect_container(cid)["State"]["Running"]
    except docker.errors.NotFound:
        return False


# -- exit codes, output, stdin ----------------------------------------------------


def test_exit_code_comes_from_the_engine(sandbox):
    assert run(sandbox, "exit 7").exit_code == 7
    assert run(sandbox, "true").exit_code == 0


def test_output_interleaves_stdout_and_stderr_in_order(sandbox):
    result = run(sandbox, "for i in 1 2 3; do echo out$i; echo err$i >&2; done")
    assert result.output.split() == ["out1", "err1", "out2", "err2", "out3", "err3"]


def test_stdin_is_closed_so_reading_it_does_not_hang(sandbox):
    result = run(sandbox, "cat; read line; echo status=$?", timeout=10)
    assert not result.timed_out
    assert "status=1" in result.output


def test_output_that_fakes_a_status_line_cannot_come_first(sandbox):
    text = run(sandbox, "echo '[exit 0]'; exit 3").for_model()
    assert text.splitlines()[0] == "[exit 3]"


POOL_READY_S = 60  # a fresh pool's first container, on a loaded engine

# -- deadline, OOM, pids --------------------------------------------------------


@pytest.mark.serial  # a wall-clock bound: alone, not beside another worker
def test_timeout_kills_the_command_and_its_children_at_the_deadline(sandbox, docker_client):
    # Timed from a warm container, as a wake's calls are: the deadline's promise, not a cold start's.
    assert sandbox.pool.wait_ready(1, POOL_READY_S)
    started = time.monotonic()
    result = run(sandbox, "sleep 1000 & sleep 1000 & sleep 1000", timeout=2)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code == 124
    assert elapsed < 2 + 1.5, f"returned {elapsed:.1f}s after start for a 2s deadline"
    assert not processes_alive(docker_client, result.container_id)


def test_a_ptrace_stopped_init_still_ends_at_the_deadline(sandbox, docker_client):
    # SIGSTOP to pid 1 (tini) is what an agent can do to keep the container alive.
    result = run(sandbox, "kill -STOP 1; sleep 1000", timeout=2)
    assert result.timed_out
    assert not processes_alive(docker_client, result.container_id)


SMALL_MEMORY = 128 * 2**20  # bytes: a bomb reaches it in well under a second; under gVisor the
# command (its stub process), not the ~50 MB sentry, is then the
# biggest in the box, so the kernel kills it and the box goes on
MEMORY_BOMB = "python3 -c 'x = bytearray(1 << 30)'"  # 1 GiB, every page touched (zeroed)
# 8 MiB at a time: the command's own address space is then what the kernel kills
# at the limit (under gVisor, the stub process that holds it, not the sentry).
GROWING_BOMB = (
    "python3 -c 'x = []\nwhile True: x.append(bytearray(8 << 20)); x[-1][::4096] = bytes(len(x[-1]) // 4096)'"
)
# A command that says it was killed out of memory, in every way output and status can.
FORGED_OOM = (
    "echo 'killed: out of memory'; echo '[exit 137, killed: out of memory]' >&2; "
    "echo 'Memory cgroup out of memory: Killed process 1'; kill -9 $$"
)


def memory_box(make_sandbox, agent, how: str):
    """A box whose next call is `how`: "pooled" (a warm container, ready), or "cold"."""
    policy = replace(agent.policy.sandbox, memory=SMALL_MEMORY)
    if how == "cold":
        return make_sandbox(policy, warm=0)
    box = make_sandbox(policy)
    assert box.pool.wait_ready(1, POOL_READY_S)
    return box


@pytest.mark.parametrize("how", ["pooled", "cold"])
def test_memory_bomb_is_reported_as_oom(agent, make_sandbox, how):
    box = memory_box(make_sandbox, agent, how)
    warm = set(box.pool.idle()) if box.pool else set()
    result = run(box, GROWING_BOMB)
    assert (result.container_id in {c[:12] for c in warm}) == (how == "pooled")
    assert result.oom_killed, result
    assert result.exit_code != 0  # 137 under runc; 1 under gVisor, which kills by no signal
    assert result.for_model().startswith(f"[exit {result.exit_code}, killed: out of memory]")


@pytest.mark.parametrize("how", ["pooled", "cold"])
def test_oom_in_a_call_that_goes_on_is_reported(agent, make_sandbox, how):
    # The kernel killed the bomb at the limit; the shell goes on and exits 0: the
    # model is still told that something was killed out of memory, as the engine says.
    box = memory_box(make_sandbox, agent, how)
    result = run(box, GROWING_BOMB + "; echo after=$?")
    assert result.oom_killed, result
    sandbox_killed = box.policy.runtime == "runsc" and result.exit_code == 137 and not result.output
    if not sandbox_killed:  # under gVisor the kernel may pick gVisor's own process: the box ends (docs/security.md)
        assert "after=" in result.output, result


def test_a_cold_call_that_prints_the_guards_held_line_keeps_its_status_and_output(make_sandbox):
    # The line carries no secret: printed by the command it only makes the host read
    # the OOM count (and close the guard's stdin) early. The status stays the engine's.
    box = make_sandbox(warm=0)
    result = run(box, "printf 'before\\n\\0wakeloop:held:000:1\\n'; echo after; cat; exit 5")
    assert (result.exit_code, result.oom_killed) == (5, False)
    assert result.output.splitlines()[0] == "before" and "after" in result.output


def test_a_warm_containers_oom_count_is_found_on_the_host(agent, make_sandbox):
    # So the tests above decide pooled gVisor calls by the kernel's count, not the
    # engine's fallback; found before the box was handed any command.
    from orchestrator.sandbox.containers import oom

    box = memory_box(make_sandbox, agent, "pooled")
    counted = box._oom_files[box.pool.idle()[0]]
    assert counted is not None and oom.read_kills(counted) == 0


def test_pooled_oom_without_a_host_view_asks_the_engine(agent, make_sandbox, monkeypatch):
    # The broker in its own container sees no host cgroup: a pooled gVisor call then
    # waits for the engine's word, which is OOMKilled too.
    from orchestrator.sandbox.containers import oom

    monkeypatch.setattr(oom, "counter_file", lambda pid, cid: None)
    box = memory_box(make_sandbox, agent, "pooled")
    result = run(box, GROWING_BOMB)
    assert result.oom_killed and result.exit_code != 0, result


@pytest.mark.parametrize("view", ["host", "engine"])
@pytest.mark.parametrize("how", ["pooled", "cold"])
def test_a_forged_oom_is_not_reported(agent, make_sandbox, monkeypatch, how, view):
    if view == "engine":
        from orchestrator.sandbox.containers import oom

        monkeypatch.setattr(oom, "counter_file", lambda pid, cid: None)
    box = memory_box(make_sandbox, agent, how)
    result = run(box, FORGED_OOM)
    assert result.exit_code == 137 and "killed: out of memory" in result.output
    assert not result.oom_killed, result
    assert result.for_model().splitlines()[0] == "[exit 137]"


@pytest.mark.serial  # a wall-clock bound: alone, not beside another worker
def test_fork_bomb_stays_inside_the_pids_limit_and_the_next_call_works(sandbox, docker_client):
    started = time.monotonic()
    result = run(sandbox, "f(){ f | f & }; f; sleep 100", timeout=5)
    assert time.monotonic() - started < 5 + 3
    # runc: the bomb hits the pids limit and is killed at the deadline; gVisor's
    # sentry counts against the same limit, so there the whole box dies early.
    assert result.timed_out or result.exit_code != 0
    assert not processes_alive(docker_client, result.container_id)
    assert run(sandbox, "echo alive").output.strip() == "alive"


def test_pids_limit_is_enforced_from_inside(agent, make_sandbox, runtime):
    # gVisor's own threads count against the limit, so it needs more room to start.
    limit = 20 if runtime == "runc" else 128
    box = make_sandbox(replace(agent.policy.sandbox, pids=limit))
    forker = (
        "import os, time\n"
        f"for n in range({limit + 30}):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(5); os._exit(0)\n"
        "print('forked', n)"
    )
    result = run(box, f'python3 -c "{forker}"', timeout=15)
    if runtime == "runsc" and not result.output:
        # gVisor's sentry needs threads under the same limit: at the limit the
        # whole box stops (exit 2, no output). Held, if less informative.
        assert result.exit_code != 0 and not result.timed_out
        return
    assert result.output.startswith("forked"), result.output
    assert int(result.output.split()[1]) < limit


# -- filesystem, network, identity -----------------------------------------------


@pytest.mark.parametrize("path", ["/x", "/usr/x", "/etc/passwd", "/proc/sys/kernel/hostname"])
def test_writes_outside_workspace_and_tmp_fail(sandbox, path):
    result = run(sandbox, f"echo x > {path} && echo WROTE")
    assert "WROTE" not in result.output


def test_tmp_is_capped(agent, make_sandbox):
    box = make_sandbox(replace(agent.policy.sandbox, tmp_size=8 * 2**20))
    result = run(box, "head -c 20M /dev/zero > /tmp/big; echo rc=$?; du -m /tmp/big | cut -f1")
    assert "rc=1" in result.output
    assert int(result.output.split()[-1]) <= 8


def test_no_network_interface_but_loopback(sandbox):
    result = run(sandbox, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; cat /proc/net/route")
    lines = result.output.split()
    assert lines[0] == "lo" and "eth0" not in lines
    assert "00000000" not in result.output.split("Iface", 1)[-1]  # no default route


def test_the_boxs_own_tools_work_on_the_workspace(sandbox, agent):
    # runsc before 20240729 answered coreutils' statx with EINVAL: `ls -la` failed.
    (agent.workspace / "seen.txt").write_text("x")
    result = run(sandbox, "ls -la /workspace && stat -c %s /workspace/seen.txt && ls -ld /tmp")
    assert result.exit_code == 0, result.output
    assert "seen.txt" in result.output


def test_runs_as_non_root_with_no_capabilities(sandbox):
    # prctl(PR_GET_NO_NEW_PRIVS), since gVisor's /proc/self/status has no NoNewPrivs line
    no_new_privs = "python3 -c 'import ctypes; print(\"nnp\", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'"
    result = run(sandbox, f"id -u; grep -E 'Cap(Eff|Prm|Bnd)' /proc/self/status; {no_new_privs}")
    assert result.output.split()[0] != "0"
    assert "CapEff:\t0000000000000000" in result.output
    assert "CapBnd:\t0000000000000000" in result.output
    assert "nnp 1" in result.output


def test_host_environment_and_api_key_are_absent(sandbox, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-canary-4242")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    result = run(sandbox, "env; cat /proc/1/environ | tr '\\0' '\\n'")
    assert "sk-ant-canary-4242" not in result.output
    assert "ANTHROPIC" not in result.output
    assert "proxy.invalid" not in result.output and "https_proxy=" not in result.output.lower()  # the host's
    assert sorted(line.split("=")[0] for line in result.output.splitlines()[:6] if "=" in line)


def test_environment_is_exactly_the_minimal_set(sandbox):
    names = {
        line.split("=", 1)[0] for line in run(sandbox, "env -0 | tr '\\0' '\\n'").output.splitlines() if "=" in line
    }
    assert names <= {"PATH", "HOME", "LANG", "HOSTNAME", "PWD", "SHLVL", "_"}


# -- persistence between calls ---------------------------------------------------


def test_workspace_persists_but_tmp_and_home_do_not(sandbox, agent):
    run(sandbox, "echo kept > /workspace/kept.txt; echo gone > /tmp/gone.txt; echo gone > $HOME/h.txt")
    after = run(sandbox, "cat /workspace/kept.txt; ls /tmp/gone.txt $HOME/h.txt 2>&1 | wc -l; ls /tmp")
    assert after.output.splitlines()[0] == "kept"
    assert "gone.txt" not in after.output and "h.txt" not in after.output
    assert (agent.workspace / "kept.txt").read_text() == "kept\n"


def test_a_background_process_does_not_outlive_its_call(sandbox, agent):
    first = run(
        sandbox,
        "nohup sh -c 'while :; do date >> /workspace/beat; sleep 0.2; done' >/dev/null 2>&1 & sleep 0.5; echo started",
    )
    assert "started" in first.output
    size = (agent.workspace / "beat").stat().st_size
    second = run(sandbox, "sleep 1; ps -e -o comm --no-headers")
    assert "sh" not in second.output.split()
    assert (agent.workspace / "beat").stat().st_size == size


# -- write_file ------------------------------------------------------------------


def test_write_creates_parents_and_keeps_bytes_exactly(sandbox, agent):
    content = b"line1\n\x00binary\xff\xfe\n" * 1000
    result = sandbox.write("deep/er/file.bin", content)
    assert result.exit_code == 0, result.output
    assert (agent.workspace / "deep/er/file.bin").read_bytes() == content


@pytest.mark.parametrize(
    "path,reason",
    [
        ("../x", "'..'"),
        ("/etc/x", "absolute"),
        ("a/../../x", "'..'"),
        ("a\0b", "NUL"),
        ("a\nb", "control"),
        ("", "empty"),
        (".", "workspace itself"),
    ],
)
def test_write_refuses_bad_paths_before_any_container(sandbox, path, reason):
    result = sandbox.write(path, b"x")
    assert result.exit_code != 0 and reason in result.output
    assert result.container_id == ""


def test_write_through_a_symlink_pointing_outside_fails_and_leaves_the_host_untouched(sandbox, agent, tmp_path):
    outside = tmp_path / "host-file"
    outside.write_text("host original\n")
    (agent.workspace / "escape").symlink_to(outside)
    (agent.workspace / "dirlink").symlink_to(tmp_path)
    for path in ("escape", "dirlink/host-file", "dirlink/new-file"):
        result = sandbox.write(path, b"pwned\n")
        assert result.exit_code != 0, path
        assert "refused" in result.output
    assert outside.read_text() == "host original\n"
    assert not (tmp_path / "new-file").exists()


def test_write_through_a_symlink_inside_the_workspace_names_the_real_path(sandbox, agent):
    # The policy's globs judge the path as written; a symlink (say `h -> .git/hooks`)
    # must not carry a write past them. The model is told the real path instead.
    (agent.workspace / "real").mkdir()
    os.chown(agent.workspace / "real", 1000, 1000)  # as the agent would have made it
    (agent.workspace / "alias").symlink_to("real")
    result = sandbox.write("alias/f.txt", b"ok")
    assert result.exit_code != 0 and "write to real/f.txt instead" in result.output
    assert not (agent.workspace / "real/f.txt").exists()
    assert sandbox.write("real/f.txt", b"ok").exit_code == 0
    assert (agent.workspace / "real/f.txt").read_bytes() == b"ok"


def test_write_refuses_a_fifo_without_hanging(sandbox, agent):
    os.mkfifo(agent.workspace / "pipe")
    os.chown(agent.workspace / "pipe", 1000, 1000)
    result = sandbox.write("pipe", b"x", timeout_s=10)
    assert not result.timed_out
    assert result.exit_code == 3 and result.output.startswith("refused: pipe")


def test_write_in_append_mode_adds_to_the_end_and_refuses_a_symlink_as_write_does(sandbox, agent, tmp_path):
    assert sandbox.write("memory/journal/d.md", b"one\n", append=True).exit_code == 0
    result = sandbox.write("memory/journal/d.md", b"two\n", append=True)
    assert result.exit_code == 0 and result.output.startswith("appended 4 bytes")
    assert (agent.workspace / "memory/journal/d.md").read_bytes() == b"one\ntwo\n"
    outside = tmp_path / "host-file"
    outside.write_text("host original\n")
    os.chmod(outside, 0o666)  # writable by anyone: only not following the link protects it
    (agent.workspace / "memory/journal/e.md").symlink_to(outside)
    (agent.workspace / "memory/journal/f.md").symlink_to("d.md")
    for path in ("memory/journal/e.md", "memory/journal/f.md"):
        result = sandbox.write(path, b"pwned\n", append=True)
        assert result.exit_code == 3 and result.output.startswith("refused"), path
    assert outside.read_text() == "host original\n"
    assert (agent.workspace / "memory/journal/d.md").read_bytes() == b"one\ntwo\n"


@pytest.mark.parametrize(
    "repo, planted, path",
    [
        ("lib.git", ["HEAD", "objects/", "refs/"], "lib.git/config"),  # a bare repo's config
        ("lib.git", ["HEAD", "objects/", "refs/"], "lib.git/hooks/post-checkout"),
        ("vendor/x", ["HEAD", "objects/", "refs/"], "vendor/x/config.worktree"),
        ("vendor/x", ["HEAD", "objects/", "refs/"], "vendor/x/commondir"),
        ("", ["HEAD", "objects/", "refs/"], "config"),  # the workspace itself
        ("r", ["HEAD", "objects/", "refs/"], "r/Config"),  # case-folded later
        ("r", ["head", "Objects/", "REFS/"], "r/hooks/pre-commit"),
        ("r", ["hooks/", "objects/", "refs/"], "r/HEAD"),  # the last mark, hooks first
        ("r", ["config", "HEAD", "refs/"], "r/objects/pack/x"),
    ],
)
def test_write_refuses_an_embedded_bare_git_repositorys_config_and_hooks(sandbox, agent, repo, planted, path):
    where = agent.workspace / repo
    for name in planted:
        (where / name).mkdir(parents=True) if name.endswith("/") else (
            where.mkdir(parents=True, exist_ok=True),
            (where / name).write_text("ref: refs/heads/main\n"),
        )
    subprocess.run(["chown", "-R", "1000:1000", str(agent.workspace)], check=True)
    result = sandbox.write(path, b"[core]\n\tfsmonitor = id\n", timeout_s=TIMEOUT)
    assert result.exit_code == 3 and "git takes it for a repository" in result.output, result.output
    assert "protect_git" in result.output
    assert not (agent.workspace / path).exists()
    # protect_git off (a policy's choice): the same write goes through
    result = sandbox.write(path, b"[core]\n", timeout_s=TIMEOUT, protect_git=False)
    assert result.exit_code == 0, result.output


def test_write_leaves_ordinary_directories_named_like_git_parts_alone(sandbox, agent):
    (agent.workspace / "app/refs").mkdir(parents=True)
    (agent.workspace / "app/HEAD").write_text("not git\n")
    subprocess.run(["chown", "-R", "1000:1000", str(agent.workspace)], check=True)
    for path in ("app/config", "app/hooks/useThing.ts", "src/hooks/x.ts", "objects/a"):
        result = sandbox.write(path, b"x\n", timeout_s=TIMEOUT)
        assert result.exit_code == 0, (path, result.output)


# -- set-id bits -------------------------------------------------------------------

SETID_PLANT = (
    "cp /bin/true su && chmod 755 su && (chmod 4755 su; mkdir -p d && cp /bin/true d/sg && "
    "chmod 2755 d/sg; cp su d/sg2; chmod 6755 d/sg2; ln -s su link; chmod u+s link; "
    "stat -c '%a %n' su d/sg d/sg2); echo last >&2; exit 7"
)


@pytest.mark.parametrize("warm", [None, 0], ids=["pooled", "cold"])
def test_set_id_bits_are_refused_in_the_box_and_never_reach_the_host(make_sandbox, agent, warm):
    box = make_sandbox(**({} if warm is None else {"warm": warm}))
    result = run(box, SETID_PLANT)
    # refused by the kernel as the command asks; the call's status and output order kept
    assert result.exit_code == 7, result.output
    assert result.output.count("Operation not permitted") == 4, result.output
    assert result.output.splitlines()[-4:] == ["755 su", "755 d/sg", "755 d/sg2", "last"]
    for name in ("su", "d/sg", "d/sg2"):
        assert os.lstat(agent.workspace / name).st_mode & 0o7777 == 0o755, name
    assert os.path.islink(agent.workspace / "link")


# What may answer the same call without 06000 in place of "ok", per runtime: the
# engine's default profile predates fchmodat2 (ENOSYS), gVisor lacks it (EPERM),
# keeps O_TMPFILE from its gofer mounts (EOPNOTSUPP), and refuses every i386 call.
PLAIN_MAY_FAIL = {
    "runc": {("x86_64", "fchmodat2"): "ENOSYS", ("i386", "fchmodat2"): "ENOSYS"},
    "runsc": {("x86_64", "fchmodat2"): "EPERM", ("x86_64", "tmpfile"): "ENOTSUP"},
}


def test_every_way_to_a_set_id_mode_is_refused_on_every_abi(make_sandbox, agent, runtime):
    from orchestrator.escapes.lab import python_command
    from orchestrator.escapes.setid import ATTEMPTS, kept_bits

    modes = (0o4755, 0o2755, 0o6755, 0o755)
    program = ATTEMPTS + f"attempt_all(abis(), CHMODS + CREATES, {modes!r})\n"
    result = run(make_sandbox(warm=0), python_command(program))
    answers = {
        (abi, call, int(mode, 8)): said
        for abi, call, mode, said in (
            line.split()[1:] for line in result.output.splitlines() if line.startswith("ATTEMPT ")
        )
    }
    assert len(answers) == 2 * 11 * len(modes), result.output  # x86_64 and i386, each call, each mode
    for (abi, call, mode), said in answers.items():
        if runtime == "runsc" and abi == "i386":  # gVisor refuses the whole ABI
            want = "EPERM"
        elif call == "openat2":  # glibc falls back to openat, which is checked
            want = "ENOSYS"
        elif mode & 0o6000:
            want = "EPERM"
        else:
            want = PLAIN_MAY_FAIL[runtime].get((abi, call), "ok")
        assert said == want, (abi, call, oct(mode), said)
    assert kept_bits(agent.workspace) == {}
    made = [f"{abi}-{call}-755" for (abi, call, mode), said in answers.items() if said == "ok"]
    assert made and all((agent.workspace / "setid" / name).lstat().st_mode & 0o7777 == 0o755 for name in made)


def test_ordinary_modes_files_and_fifos_still_work(sandbox, agent):
    result = run(
        sandbox,
        "umask 022; touch a && chmod 700 a && mkfifo p && install -m 750 /bin/true t && "
        "python3 -c \"import os; os.close(os.open('b', os.O_CREAT | os.O_WRONLY, 0o1755))\" && "
        "mkdir -m 1777 sticky && stat -c '%a %n' a t b sticky",
    )
    assert result.ok, result.output
    assert result.output.split() == ["700", "a", "750", "t", "1755", "b", "1777", "sticky"]


# -- output size and memory ------------------------------------------------------


@pytest.mark.serial  # a wall-clock bound: alone, not beside another worker
@pytest.mark.parametrize("runtime", ["runc"])  # gVisor's streaming is the 1 GB probe's (bounds_huge_output)
def test_100mb_of_output_comes_back_truncated_fast_with_flat_host_memory(sandbox):
    tracemalloc.start()
    started = time.monotonic()
    result = run(sandbox, "head -c 100M /dev/urandom | base64 -w 200", timeout=60)
    elapsed = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.exit_code == 0
    assert result.truncated and result.output_bytes > 100 * 2**20
    assert len(result.output) < CAP + 500
    assert "output truncated" in result.output
    assert peak < 10 * 2**20, f"host held {peak / 2**20:.1f} MiB while streaming"
    assert elapsed < 30, f"100 MB took {elapsed:.1f}s"


def test_escape_sequences_and_nul_bytes_are_stripped(sandbox):
    result = run(sandbox, r"printf 'a\033[2J\033]0;title\007b\000c\r\nd\n'")
    assert result.output == "abc\nd\n"


# -- clear errors, not tracebacks ---------------------------------------------------


def test_unreachable_engine_is_one_line_that_says_how_to_start_it(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxError) as err:
        connect()
    assert "start it" in str(err.value) and "\n" not in str(err.value)


def test_missing_image_says_which_command_builds_it(agent, docker_client):
    policy = replace(agent.policy.sandbox, image="wakeloop-sandbox:does-not-exist")
    with pytest.raises(SandboxError, match="wakeloop image build"):
        DockerSandbox(agent.workspace, policy, client=docker_client)


def test_missing_workspace_is_a_clear_error(tmp_path, agent, docker_client):
    with pytest.raises(SandboxError, match="does not exist"):
        DockerSandbox(tmp_path / "nope", agent.policy.sandbox, client=docker_client)


# -- the CLI ---------------------------------------------------------------------


def wakeloop(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=120, **kw
    )


def test_sandbox_exec_prints_what_the_model_sees_and_exits_with_the_status(agent_dir):
    proc = wakeloop("sandbox", "exec", str(agent_dir), "--", "echo hello; exit 5")
    assert proc.returncode == 5
    assert proc.stdout == "[exit 5]\nhello\n\n"


def test_sandbox_exec_with_a_bad_agent_dir_is_one_line(tmp_path):
    proc = wakeloop("sandbox", "exec", str(tmp_path / "missing"), "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "wakeloop init" in proc.stderr


@pytest.mark.serial  # a wall-clock bound: alone, not beside another worker
def test_ctrl_c_mid_call_removes_the_container(agent_dir, docker_client):
    proc = exec_to_interrupt(agent_dir, "sleep 1000")
    try:
        workspace = str((agent_dir / "workspace").resolve())
        found = wait_for(
            lambda: docker_client.api.containers(
                filters={
                    "label": [  # one listing: no lookup to race
                        "wakeloop.sandbox=1",
                        f"wakeloop.workspace={workspace}",
                    ]
                }
            ),
            "the call's container to start",
            30,
        )
        code, err = interrupt(proc, 30)
    finally:
        proc.kill()  # a process that hung holds the disk: later tests must not inherit it
    assert code == 130, err
    assert not container_exists(docker_client, found[0]["Id"])


def test_leftovers_from_a_crash_are_removed_at_start(sandbox, docker_client):
    config, host = sandbox.container_spec(["sleep", "1000"], "crashed")
    config["labels"]["wakeloop.run_id"] = "an-earlier-run"
    cid = docker_client.api.create_container(**config, host_config=docker_client.api.create_host_config(**host))["Id"]
    assert sandbox.cleanup_leftovers() == 1
    assert not container_exists(docker_client, cid)
    assert sandbox.run("echo still works", 30, 100).output == "still works\n"  # its own pool is kept
