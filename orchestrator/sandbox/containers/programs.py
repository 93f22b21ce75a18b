"""Every program of ours that runs inside a box, and how each is started.

The seccomp guard (first in every call), the pool's launcher, write_file's
script, the text editor's (in_box/edit.py) and the allowlist network's netns holder. The Python ones are real
files in in_box/ (shipped as package data, checked by ruff and mypy like the
rest, for the image's python3: 3.11), read here once at import, so that
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
from importlib.resources import files

from orchestrator.sandbox.containers.seccomp import FILTER

PYTHON = "/usr/bin/python3"  # the image's interpreter, by absolute path: never looked up on a PATH
BASH = "/bin/bash"  # the shell a bash call runs, by absolute path likewise
COMMAND_ENV = "WAKELOOP_COMMAND_ENV"  # the command's whole environment, as JSON; popped by the guard
HELD = "held"  # in the guard's line when a cold call's command is over (GUARD below)


def _program(name: str, marks: dict[str, str] | None = None) -> str:
    """The program in_box/ holds under `name`, as the box gets it: each mark replaced by its value. A mark is
    valid Python where it stands (a string literal, or text inside one), so ruff and mypy check
    the file as it is; one that is missing fails at import, never in a box."""
    text = (files("orchestrator.sandbox.containers") / "in_box" / f"{name}.py").read_text(encoding="utf-8")
    for mark, value in (marks or {}).items():
        if mark not in text:
            raise RuntimeError(f"in_box/{name}.py has no {mark} to fill in")
        text = text.replace(mark, value)
    return text


# Python source, run as the first thing in the box (`python3 -I`): it sets
# no_new_privs and installs seccomp.py's filter (io_uring and openat2 answer
# ENOSYS; a set-uid or set-gid mode answers EPERM, on every ABI), as bytes
# assembled on the host at import.
INSTALL = _program("install_filter", {'"__FILTER_HEX__"': repr(FILTER.hex())})


def boot(name: str) -> str:
    """A one-line program that runs the program in $name, taking it out of the
    environment first. Our programs ride in the environment, not in argv, so that
    `ps` in the box shows one short line for each, not a kilobyte of source
    (tokens the model pays for), and the command never inherits them."""
    return f'import os; exec(os.environ.pop("{name}"))'


LAUNCHER_ENV = "WAKELOOP_LAUNCHER"
LAUNCH_ARGV = [PYTHON, "-I", "-c", boot(LAUNCHER_ENV)]  # the pool's launcher, run by the guard itself (GUARD)


# Installs the filter, writes the allowlist proxy's CA bundle to CA_FILE when the
# container's environment carries CA_ENV (network.py says why it travels so: the box
# mounts nothing but its workspace), then becomes the program given as its arguments, which
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
CA_FILE = "/tmp/wakeloop-ca.pem"  # in the box: Debian's store plus the allowlist proxy's CA (network.py)
CA_ENV = "WAKELOOP_EGRESS_CA"  # the container's (not the command's) environment: that CA's PEM, popped by the guard
GUARD = INSTALL + _program(
    "guard",
    {
        '"__CA_ENV__"': repr(CA_ENV),
        "__CA_FILE__": CA_FILE,
        '"__COMMAND_ENV__"': repr(COMMAND_ENV),
        "__HELD__": HELD,
        '["__LAUNCH_ARGV__"]': repr(LAUNCH_ARGV),
        '"__LAUNCHER_ENV__"': repr(LAUNCHER_ENV),
    },
)
GUARD_ENV = "WAKELOOP_GUARD"  # the container's environment carries GUARD under this name


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
LAUNCHER = _program("launcher")

READY_LINE = b"\0wakeloop:ready\n"  # the launcher's first output: it is listening for its handoff


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
WRITE_SCRIPT = _program("write_script")


def write_argv(path: str, append: bool = False, protect_git: bool = True) -> list[str]:
    """What a write_file call runs in the box (from /, content on stdin)."""
    return [PYTHON, "-I", "-c", WRITE_SCRIPT, path, "append" if append else "write", "git" if protect_git else "-"]


# The text editor's and the memory tool's one program (sandbox/containers/editor_request.py builds its request), run
# as the write script is: `python3 -I` from /, under our environment, its request on stdin. It walks every
# path from /workspace with O_NOFOLLOW and edits through the descriptor it opened (in_box/edit.py says how).
EDIT_SCRIPT = _program("edit")


def edit_argv() -> list[str]:
    """What a text editor or memory call runs in the box (from /, its request as JSON on stdin)."""
    return [PYTHON, "-I", "-c", EDIT_SCRIPT]


NOBODY = "65534"  # the holder sleeps as this uid after dropping everything

# Runs as root with only NET_ADMIN, SETUID and SETGID, then drops all of it.
HOLDER_SCRIPT = (
    "ip route del default 2>/dev/null; ip -6 route flush table main 2>/dev/null; "
    "if ip route | grep -q '^default'; then echo 'holder: default route still there'; exit 1; fi; "
    "echo ready; "
    f"exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups --inh-caps=-all "
    "--bounding-set=-all sleep infinity"
)
