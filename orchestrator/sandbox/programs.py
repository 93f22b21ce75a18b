"""Every program of ours that runs inside a box, and how each is started.

The seccomp guard (first in every call), the pool's launcher, write_file's
script and the allowlist network's netns holder. They are data here so that
`policy explain`, the escape probes and the engine all name the same text.

## The seccomp guard: one more filter before any agent code runs

The engine's default seccomp profile is the first filter. Every call's first
process stacks one more on top (seccomp.py: what it refuses, and why), for
what no engine profile does for us:

- io_uring_setup, io_uring_enter and io_uring_register answer ENOSYS (as on a
  kernel without io_uring, so programs fall back). Engines before 25 let
  io_uring through (moby 25 removed io_uring_* from the default), and it has
  been a steady source of kernel privilege escalations; the escape suite's
  `blocks_io_uring` probe found it open on this project's CI engine.
- A set-uid or set-gid mode answers EPERM on chmod, open/creat and mknod and
  their *at forms, on every syscall ABI (i386's `int 0x80` included): a file
  the agent marks u+s in /workspace would be, on the host, a program that
  runs as the sandbox user for whoever starts it. In the box no_new_privs
  already makes the bits inert, and a bind mount cannot be nosuid through the
  engine's API (nor would that change the mode the host sees). The kernel
  refusing the mode replaces a walk of the workspace after every call
  (10-14 ms under runc, 94-540 ms under runsc on 1,000 files), which a
  command could also skip by killing or ptracing the process that walked.

We cannot ship a copy of the engine's profile, and a hand-written allowlist
would drift from it, so ours refuses only these and lets everything else go
on to the engine's. Seccomp filters are inherited across fork and exec and
can never be removed, and with no_new_privs set (it is) an unprivileged
process may install one.

## Our programs never run under the policy's environment

Each of ours is named by absolute path (PYTHON, BASH), never looked up
through a PATH, and runs under the container's environment, which is ours
alone (PATH/HOME/LANG, the allowlist's proxy variables, our programs'
sources). The policy's `env` reaches the agent's command and nothing else: it
rides as one JSON variable, COMMAND_ENV (or in the pool's handoff), and is
applied only at the command's own exec, with an environment built from
scratch. So a `sandbox.env` of `PATH: /workspace/bin:...` with a `python3`
planted there runs the agent's own `python3` in the agent's own commands,
never in place of the guard, the launcher or the write script.

Not here: the rest of the hardening (engine.py's container_spec), the pool's
host side (pool.py).
"""

from __future__ import annotations

import json

from orchestrator.sandbox.seccomp import FILTER

PYTHON = "/usr/bin/python3"         # the image's interpreter, by absolute path: never looked up on a PATH
BASH = "/bin/bash"                  # the shell a bash call runs, by absolute path likewise
COMMAND_ENV = "WAKELOOP_COMMAND_ENV"  # the command's whole environment, as JSON; popped by the guard
HELD = "held"                       # in the guard's line when a cold call's command is over (GUARD below)

# Python source, run as the first thing in the box (`python3 -I`): it sets
# no_new_privs and installs seccomp.py's filter (io_uring and openat2 answer
# ENOSYS; a set-uid or set-gid mode answers EPERM, on every ABI), as bytes
# assembled on the host at import.
INSTALL = r"""
import ctypes, struct
_prog = bytes.fromhex(%r)
_buf = ctypes.create_string_buffer(_prog, len(_prog))
_fprog = struct.pack("HxxxxxxP", len(_prog) // 8, ctypes.addressof(_buf))
_libc = ctypes.CDLL(None, use_errno=True)
if _libc.prctl(38, 1, 0, 0, 0) != 0 or _libc.prctl(22, 2, ctypes.c_char_p(_fprog), 0, 0) != 0:
    import os, sys
    sys.stderr.write(f"wakeloop: cannot install the seccomp filter: {os.strerror(ctypes.get_errno())}\n")
    os._exit(126)
""" % FILTER.hex()

def boot(name: str) -> str:
    """A one-line program that runs the program in $name, taking it out of the
    environment first. Our programs ride in the environment, not in argv, so that
    `ps` in the box shows one short line for each, not a kilobyte of source
    (tokens the model pays for), and the command never inherits them."""
    return f'import os; exec(os.environ.pop("{name}"))'


LAUNCHER_ENV = "WAKELOOP_LAUNCHER"
LAUNCH_ARGV = [PYTHON, "-I", "-c", boot(LAUNCHER_ENV)]   # the pool's launcher, run by the guard itself (GUARD)


# Installs the filter, then becomes the program given as its arguments, which
# must be named by absolute path (execvp would search a PATH, execv a relative
# name in the cwd: /workspace). Its stderr joins its stdout on one pipe, so the
# order the model sees is the order things were printed (the engine keeps two
# pipes apart). With $WAKELOOP_COMMAND_ENV (a cold call's command) the program
# gets exactly that environment, and its own name as argv[0] ($0 is "bash", as
# for a shell found on a PATH), and the guard stays as its parent: when it
# exits, everything else in the box is killed, as the pool's launcher does,
# and its status is the call's. Without it (the pool's launcher, the write
# script) the program is one of ours: it keeps our environment and takes the
# guard's place; the pool's launcher (LAUNCH_ARGV) runs in the guard's own
# interpreter instead of a second one, which a warm container's make paid for
# (a Python start: 20-60 ms under runc, 50-140 ms under gVisor on a loaded
# 2-core host), as did the call that competed with it for the cores.
#
# A cold call's command gets no stdin (/dev/null), but the engine holds the
# guard's stdin open (a pipe): once the command is over, the guard writes the
# HELD line and waits for the host to close it. Meanwhile the box still
# stands, so its memory cgroup does too, and the host reads that cgroup's count
# of OOM kills (oom.py), which the engine's own flag misses when the box exits
# soon after the kill (Docker's OOM event then loses the race with the exit).
# The line carries no secret and the host trusts nothing in it: the status is
# the engine's, the count the kernel's; a command that prints it early only
# makes the host read the count early. Without a pipe on stdin (a `docker run`
# of these settings) there is no line and no wait.
GUARD = INSTALL + f"""
import json, os, stat, sys
os.dup2(1, 2)
env = os.environ.pop({COMMAND_ENV!r}, None)
if not sys.argv[1].startswith("/"):
    sys.stderr.write(f"wakeloop: not an absolute path: {{sys.argv[1]}}\\n")
    os._exit(127)
if env is None and sys.argv[1:] == {LAUNCH_ARGV!r}:
    exec(os.environ.pop({LAUNCHER_ENV!r}), {{"__name__": "__main__"}})   # the launcher: see LAUNCHER
    os._exit(0)
if env is None:
    os.execv(sys.argv[1], sys.argv[1:])
held = stat.S_ISFIFO(os.fstat(0).st_mode)
pid = os.fork()
if pid == 0:
    try:
        if held:
            os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
        os.execve(sys.argv[1], [os.path.basename(sys.argv[1]), *sys.argv[2:]], json.loads(env))
    finally:
        os._exit(127)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
code = 128 - code if code < 0 else code
try:
    os.kill(-1, 9)   # as the launcher: nothing the command started outlives the call
except ProcessLookupError:
    pass
if held:
    os.set_blocking(1, True)   # the command may have left the shared pipe non-blocking
    os.write(1, b"\\0wakeloop:{HELD}:%03d:?\\n" % code)
    while os.read(0, 4096):
        pass
os._exit(code)
"""
GUARD_ENV = "WAKELOOP_GUARD"        # the container's environment carries GUARD under this name


def guarded(argv: list[str]) -> list[str]:
    """argv, run under the extra filter (the container's environment must hold GUARD_ENV)."""
    return [PYTHON, "-I", "-c", boot(GUARD_ENV), *argv]


def command_argv(command: str) -> list[str]:
    """What a bash call runs: the command travels as an argument, never pasted into a shell string."""
    return [BASH, "-c", command]


def carried(env: dict[str, str]) -> str:
    """The command's environment as the value of COMMAND_ENV."""
    return json.dumps(env, sort_keys=True)




# Runs in the pooled container as LAUNCH_ARGV, its source in $WAKELOOP_LAUNCHER
# (boot() says why), which it pops before the command. Once it listens for its
# handoff it prints READY_LINE, which the host (attached since before the
# start) reads while making the container: so a container the pool hands out
# has its two interpreters (guard, launcher) already up, which under gVisor is
# 0.1-0.3 s a call would otherwise wait for. It then reads an 8-byte
# length and that many bytes of JSON {argv, cwd, stdin, env, end} from fd 0 with
# os.read, which never reads past what it asks for: whatever follows on stdin
# is left for the command (write_file's content). Without stdin the command
# gets /dev/null, as a cold call's does; its stderr joins its stdout. As the
# guard does, it runs argv[0] by absolute path only, under `env` and its own
# name when the handoff has an env (the agent's command), else under its own
# environment (the write script). Our own Python program (env None and
# `python3 -I -c SOURCE`: write_file's script) runs in the launcher's
# interpreter instead: under gVisor a Python start is 50-140 ms of the call.
# Nothing of the agent's runs in the box before or during it, and it exits
# as its subprocess did (sys.exit's code; 1 and the traceback on an error).
# Any other command is started with vfork (Popen with
# close_fds, which takes _posixsubprocess's vfork path; posix_spawn's clone3 gets
# EPERM, not ENOSYS, under gVisor's seccomp): a fork copies the launcher's address
# space first, which gVisor's sentry does slowly (45 against 25 ms for `bash -c
# true`, measured in a runsc box).
#
# The launcher stays as the command's parent and, when the command exits,
# writes its status on stdout after the command's last byte: the caller then
# returns at once instead of waiting ~100-200 ms for the engine to notice the
# exit. Before it writes, it kills every other process in the box but init, so
# the call ends as a cold call does: nothing it started outlives it. The line
# carries the call's 128-bit nonce, which the command cannot learn: it arrived
# before the command existed, and the launcher makes itself non-dumpable first,
# so a process of the same uid can neither ptrace it nor read its memory
# through /proc. Output that merely looks like the line is output. The OOM
# count is the container's own cgroup's (read-only in the box); "?" where the
# runtime shows no such count (gVisor), and the host reads it instead (oom.py).
LAUNCHER = r"""
import ctypes, json, os, subprocess
if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:   # PR_SET_DUMPABLE 0
    os._exit(125)
def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            os._exit(125)
        data += chunk
    return data
def ooms():
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return "1" if int(line.split()[1]) else "0"
        except (OSError, ValueError):
            pass
    return "?"
def ours(source, args):
    # One of our Python programs (env None: write_file's script), run here: one
    # interpreter start fewer on the call's path. Its exit is a subprocess's would be.
    import sys, traceback
    sys.argv = ["-c", *args]
    try:
        exec(compile(source, "<string>", "exec"), {"__name__": "__main__"})
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code & 0xFF
os.write(1, b"\0wakeloop:ready\n")
spec = json.loads(read_exact(int.from_bytes(read_exact(8), "big")))
os.chdir(spec["cwd"])
argv, env = spec["argv"], spec["env"]
if env is None and argv[:3] == ["/usr/bin/python3", "-I", "-c"] and len(argv) > 3:
    code = ours(argv[3], argv[4:])
elif argv[0].startswith("/"):
    try:
        code = subprocess.Popen([argv[0] if env is None else os.path.basename(argv[0]), *argv[1:]],
                                executable=argv[0], env=env, stdin=None if spec["stdin"] else subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, close_fds=True, restore_signals=False).wait()
    except OSError:
        code = 127
    code = 128 - code if code < 0 else code
else:
    os.write(1, b"wakeloop: not an absolute path: %s\n" % argv[0].encode())
    code = 127
try:
    os.kill(-1, 9)   # what the command left running ends before the caller hears it is done
except ProcessLookupError:
    pass
os.set_blocking(1, True)   # the command may have left the shared pipe non-blocking
os.write(1, b"\0wakeloop:%s:%03d:%s\n" % (spec["end"].encode(), code, ooms().encode()))
"""

READY_LINE = b"\0wakeloop:ready\n"   # the launcher's first output: it is listening for its handoff


# Runs inside the container as `/usr/bin/python3 -I` (no cwd or PYTHON* in sys.path, so a
# module planted in the workspace cannot stand in for the stdlib). It resolves the
# path inside the box, refuses targets outside /workspace and paths through a
# symlink (naming the real path, which the model can then ask for and the
# policy's globs then judge), walks the path with O_NOFOLLOW so a symlink swapped
# in meanwhile fails instead of being followed, and writes only to a regular
# file. Content arrives on stdin; argv[2] is "write" (replace the file) or
# "append" (the journal stub: add to the end, with the same refusals).
#
# argv[3] "git" is the policy's protect_git, for what its globs cannot see: a
# bare repository planted anywhere (a directory holding HEAD, objects/ and
# refs/, which is all git asks of a git directory) runs its hooks/ and reads its
# config, config.worktree and commondir. In each directory on the way, the
# workspace included, a write that adds one of those names, or one of the three
# marks, is refused when the directory would then hold all three marks and one
# of them. Names are compared in any case, as a case-folding filesystem (the
# user's, later) would. The listing is of the directory the walk holds open.
WRITE_SCRIPT = r"""
import os, stat, sys
root, rel, append = "/workspace", sys.argv[1], sys.argv[2] == "append"
git = sys.argv[3:4] == ["git"]
MARKS, RUNS = {"head", "objects", "refs"}, {"config", "config.worktree", "commondir", "hooks"}
def bare_repo(fd, name, where):
    name = name.lower()
    if not git or name not in MARKS | RUNS:
        return
    after = {n.lower() for n in os.listdir(fd)} | {name}
    if MARKS <= after and RUNS & after:
        print(f"refused: {rel}: {where or 'the workspace'} holds HEAD, objects/ and refs/, so git "
              f"takes it for a repository and would run what its {name} says; protect_git keeps "
              "write_file out of a repository's config and hooks. This is deliberate.")
        sys.exit(3)
target = os.path.realpath(os.path.join(root, rel))
if os.path.commonpath([root, target]) != root or target == root:
    print(f"refused: {rel} resolves to {target}, outside /workspace"); sys.exit(3)
if target != os.path.normpath(os.path.join(root, rel)):
    # The policy's globs were checked on the path as written; a symlink on the
    # way would carry the write somewhere they never saw. Name the real path.
    real = os.path.relpath(target, root)
    print(f"refused: {rel} goes through a symlink; write to {real} instead"); sys.exit(3)
parts = os.path.relpath(target, root).split(os.sep)
try:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for i, part in enumerate(parts[:-1]):
        bare_repo(fd, part, "/".join(parts[:i]))
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    bare_repo(fd, parts[-1], "/".join(parts[:-1]))
    # O_RDWR|O_NONBLOCK opens even a FIFO at once, so the check below can refuse it.
    out = os.open(parts[-1], os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                  | (os.O_APPEND if append else 0), 0o644, dir_fd=fd)
except OSError as exc:
    print(f"refused: {rel}: {exc.strerror}"); sys.exit(3)
if not stat.S_ISREG(os.fstat(out).st_mode):
    print(f"refused: {rel} exists and is not a regular file"); sys.exit(3)
os.set_blocking(out, True)
if not append:
    os.ftruncate(out, 0)
n = 0
while chunk := sys.stdin.buffer.read(1 << 16):
    n += os.write(out, chunk)
print(f"{'appended' if append else 'wrote'} {n} bytes to {os.path.relpath(target, root)}")
"""


def write_argv(path: str, append: bool = False, protect_git: bool = True) -> list[str]:
    """What a write_file call runs in the box (from /, content on stdin)."""
    return [PYTHON, "-I", "-c", WRITE_SCRIPT, path, "append" if append else "write",
            "git" if protect_git else "-"]


NOBODY = "65534"                        # the holder sleeps as this uid after dropping everything

# Runs as root with only NET_ADMIN, SETUID and SETGID, then drops all of it.
HOLDER_SCRIPT = (
    "ip route del default 2>/dev/null; ip -6 route flush table main 2>/dev/null; "
    "if ip route | grep -q '^default'; then echo 'holder: default route still there'; exit 1; fi; "
    "echo ready; "
    f"exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups --inh-caps=-all "
    "--bounding-set=-all sleep infinity"
)
