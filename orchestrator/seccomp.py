"""One more seccomp filter, installed inside the box before any agent code runs.

The engine's default seccomp profile is the first filter. Engines before 25
let io_uring through it (moby 25 removed io_uring_* from the default), and
io_uring has been a steady source of kernel privilege escalations; the escape
suite's `blocks_io_uring` probe found it open on this project's CI engine.
We cannot ship a copy of the engine's profile, and a hand-written allowlist
would drift from it, so instead every call's first process stacks a tiny
filter on top: io_uring_setup, io_uring_enter and io_uring_register answer
ENOSYS (as on a kernel without io_uring, so programs fall back), everything
else goes on to the engine's filter. Seccomp filters are inherited across
fork and exec and can never be removed, and with no_new_privs set (it is) an
unprivileged process may install one.

Not here: the rest of the hardening (sandbox.py's container_spec).
"""

from __future__ import annotations

# Python source, run as the first thing in the box (`python3 -I`). The BPF
# program: A = syscall nr without the x32 bit; 425 <= A <= 427 (io_uring_*,
# the same numbers on every architecture's unified table) -> ERRNO(ENOSYS);
# else ALLOW.
INSTALL = r"""
import ctypes, struct
_prog = b"".join(struct.pack("HBBI", *op) for op in (
    (0x20, 0, 0, 0),            # ld  [nr]
    (0x54, 0, 0, 0xBFFFFFFF),   # and ~__X32_SYSCALL_BIT
    (0x35, 0, 2, 425),          # jge io_uring_setup ? next : allow
    (0x25, 1, 0, 427),          # jgt io_uring_register ? allow : next
    (0x06, 0, 0, 0x00050026),   # ret ERRNO(ENOSYS)
    (0x06, 0, 0, 0x7FFF0000),   # ret ALLOW
))
_buf = ctypes.create_string_buffer(_prog, len(_prog))
_fprog = struct.pack("HxxxxxxP", len(_prog) // 8, ctypes.addressof(_buf))
_libc = ctypes.CDLL(None, use_errno=True)
if _libc.prctl(38, 1, 0, 0, 0) != 0 or _libc.prctl(22, 2, ctypes.c_char_p(_fprog), 0, 0) != 0:
    import os, sys
    sys.stderr.write(f"wakeloop: cannot install the seccomp filter: {os.strerror(ctypes.get_errno())}\n")
    os._exit(126)
"""

# Installs the filter, then becomes the command given as its arguments.
GUARD = INSTALL + "import os, sys\nos.execvp(sys.argv[1], sys.argv[1:])\n"
GUARD_ENV = "WAKELOOP_GUARD"        # the container's environment carries GUARD under this name


def boot(name: str) -> str:
    """A one-line program that runs the program in $name, taking it out of the
    environment first. Our programs ride in the environment, not in argv, so that
    `ps` in the box shows one short line for each, not a kilobyte of source
    (tokens the model pays for), and the command never inherits them."""
    return f'import os; exec(os.environ.pop("{name}"))'


def guarded(argv: list[str]) -> list[str]:
    """argv, run under the extra filter (the container's environment must hold GUARD_ENV)."""
    return ["python3", "-I", "-c", boot(GUARD_ENV), *argv]
