"""Privilege attacks: become root, regain capabilities, reach kernel interfaces
that have carried container escapes (namespaces, keyrings, bpf, perf, io_uring,
modules), inject keystrokes, or stop the box's init so it never ends.

Not here: set-id bits reaching the host (setid.py, whose probes are listed here too).
"""

from __future__ import annotations

import threading
import time

from orchestrator.escapes import setid
from orchestrator.escapes.lab import Probe, Trial, escaped, held, python_command
from orchestrator.sandbox.containers.deadline import KILL_GRACE_S

CATEGORY = "privileges"
STOPPED_INIT_DEADLINE_S = 4  # the call's own deadline: short, the point is that it is kept
HOST_SLACK_S = 15  # beyond deadline + kill grace, the host has lost control of the call


def _py(name: str, expected: str, program: str) -> Probe:
    return Probe(name, CATEGORY, expected, lambda t: t.py(program))


runs_as_unprivileged_user = _py(
    "runs_as_unprivileged_user",
    "real, effective and saved uid/gid are not 0",
    r"""
ids = os.getresuid() + os.getresgid()
if 0 in ids or 0 in os.getgroups(): escaped(f"uid/gid 0 present: {ids} groups {os.getgroups()}")
else: held(f"uids/gids {ids}")
""",
)

holds_no_capabilities = _py(
    "holds_no_capabilities",
    "every capability set is empty, the bounding set included",
    r"""
caps = {}
for line in open("/proc/self/status"):
    if line.startswith("Cap"):
        k, v = line.split(":"); caps[k] = int(v, 16)
held_caps = {k: hex(v) for k, v in caps.items() if v}
if held_caps: escaped(f"capabilities held: {held_caps}")
else: held("CapInh/CapPrm/CapEff/CapBnd/CapAmb all zero")
""",
)

sets_no_new_privs = _py(
    "sets_no_new_privs",
    "no_new_privs is set: no exec can gain privileges",
    r"""
flag = libc.prctl(39, 0, 0, 0, 0)   # PR_GET_NO_NEW_PRIVS
if flag == 1: held("prctl(PR_GET_NO_NEW_PRIVS) = 1")
else: escaped(f"no_new_privs not set: prctl says {flag}")
""",
)

enforces_seccomp_filter = _py(
    "enforces_seccomp_filter",
    "a seccomp filter stands between the box and the host kernel (or a user-space kernel, gVisor, does)",
    r"""
line = [l for l in open("/proc/self/status") if l.startswith("Seccomp:")]
mode = line[0].split()[1] if line else "?"
if mode == "2": held("Seccomp: 2 (filter)")
elif not ON_HOST_KERNEL:
    held(f"no filter in the box, but its syscalls are served by a user-space kernel ({os.uname().release}), "
         f"not the host's ({HOST_KERNEL})")
else: escaped(f"seccomp mode {mode}: no filter between the box and the host kernel")
""",
)

blocks_unshare_namespaces = _py(
    "blocks_unshare_namespaces",
    "no new user, mount, net, pid, uts or ipc namespace can be made in the host kernel",
    r"""
import subprocess
made = []
flags = {"user": 0x10000000, "mount": 0x20000, "net": 0x40000000, "pid": 0x20000000,
         "uts": 0x4000000, "ipc": 0x8000000, "cgroup": 0x2000000}
for name, flag in flags.items():
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.unshare(flag) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0: made.append(name)
r = subprocess.run(["bash", "-c", "unshare -Ur id -u 2>&1"], capture_output=True, text=True)
if r.returncode == 0 and r.stdout.strip() == "0": made.append("unshare -Ur (root in a user ns)")
if made and ON_HOST_KERNEL: escaped("created namespaces in the host kernel: " + ", ".join(made))
elif made: held(f"namespaces ({', '.join(made)}) exist only in the box's user-space kernel {os.uname().release}, "
                "not the host's")
else: held("unshare refused for every namespace type")
""",
)


def _stopped_init(t: Trial) -> str:
    """Stop the box's init (ptrace attach, then SIGSTOP) and stay: the call must
    still end at its deadline, and its container must be gone."""
    attack = r"""
pid = 1
r = libc.ptrace(16, pid, None, None)   # PTRACE_ATTACH: stops init
how = "ptrace-attached" if r == 0 else f"ptrace refused ({errno.errorcode.get(ctypes.get_errno())})"
try:
    os.kill(1, 19)                    # SIGSTOP as well, in case ptrace was refused
    how += ", SIGSTOP sent"
except OSError as exc:
    how += f", SIGSTOP refused ({exc.strerror})"
print("init:", how, flush=True)
import time
while True: time.sleep(1)
"""
    result, waited, error = None, None, []

    def call():
        nonlocal result
        try:
            result = t.box.run(python_command(attack), timeout_s=STOPPED_INIT_DEADLINE_S, max_output_chars=2000)
        except Exception as exc:  # reported below, not swallowed
            error.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(STOPPED_INIT_DEADLINE_S + KILL_GRACE_S + HOST_SLACK_S)
    waited = time.monotonic() - started
    left = t.containers_left()
    for container in left:
        container.remove(force=True)
    if worker.is_alive():
        return escaped(f"the call was still running {waited:.0f} s after a {STOPPED_INIT_DEADLINE_S} s deadline")
    if error:
        return f"the call failed: {error[0]}"
    if left:
        return escaped(f"container {left[0].short_id} outlived its call")
    assert result is not None  # the call returned: no error, not alive
    what = result.output.strip().splitlines()[0] if result.output.strip() else "(no output)"
    if not result.timed_out:
        return f"the attack ended by itself before the deadline: {what}"
    return held(f"{what}; killed at the deadline, ended in {result.duration_ms / 1000:.1f} s, container removed")


ends_call_with_ptrace_stopped_init = Probe(
    "ends_call_with_ptrace_stopped_init",
    CATEGORY,
    "with init ptrace-stopped the call still ends at its deadline and its container is removed",
    _stopped_init,
)

blocks_ptrace_outside_box = _py(
    "blocks_ptrace_outside_box",
    "no process outside the box can be traced (none is even visible)",
    r"""
def cgroup(pid):
    try:
        return open(f"/proc/{pid}/cgroup").read()
    except OSError:
        return None
# The box's own processes share its cgroup; one visible in another (a shared
# pid namespace) is a foreign process, attacked like an invisible one.
own = cgroup("self")
mine = {int(p) for p in os.listdir("/proc") if p.isdigit() and cgroup(p) in (own, None)}
traced = []
for pid in range(1, 4096):
    if pid in mine: continue
    if libc.ptrace(16, pid, None, None) == 0:   # PTRACE_ATTACH
        traced.append(pid); libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    elif ctypes.get_errno() == errno.EPERM:
        traced.append(f"{pid}?EPERM(exists)")
if traced: escaped(f"foreign pids reachable: {traced[:5]}")
else: held("every pid outside the box's own is ESRCH: nothing to trace")
""",
)

blocks_keyctl = _py(
    "blocks_keyctl",
    "add_key/keyctl fail (kernel keyrings are not namespaced)",
    r"""
r1, e1 = call("add_key", b"user", b"wakeloop-probe", b"x", 1, -4)   # KEY_SPEC_SESSION_KEYRING
r2, e2 = call("keyctl", 0, -3, 0)                                  # KEYCTL_GET_KEYRING_ID, user keyring
if r1 >= 0 or r2 >= 0: escaped(f"keyring reachable: add_key {r1} {e1}, keyctl {r2} {e2}")
else: held(f"add_key {e1}, keyctl {e2}")
""",
)

blocks_bpf = _py(
    "blocks_bpf",
    "bpf(2) fails",
    r"""
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (ctypes.c_uint32 * 4)(2, 4, 4, 1), 16)   # BPF_MAP_CREATE, array, 4-byte key/value, 1 entry
r, err = call("bpf", 0, attr, 128)
if r >= 0: escaped("bpf(BPF_MAP_CREATE) succeeded")
else: held(f"bpf refused: {err}")
""",
)

blocks_perf_event_open = _py(
    "blocks_perf_event_open",
    "perf_event_open(2) fails",
    r"""
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (ctypes.c_uint32 * 2)(1, 128), 8)    # PERF_TYPE_SOFTWARE, size
# exclude_kernel and exclude_hv: what an unprivileged process may ask at perf_event_paranoid 2
ctypes.memmove(ctypes.addressof(attr) + 40, (ctypes.c_uint64 * 1)((1 << 5) | (1 << 6)), 8)
r, err = call("perf_event_open", attr, 0, -1, -1, 0)
if r >= 0: escaped("perf_event_open succeeded")
else: held(f"perf_event_open refused: {err}")
""",
)

blocks_io_uring = _py(
    "blocks_io_uring",
    "io_uring_setup(2) on the host kernel fails (engines before 25 allowed it)",
    r"""
params = ctypes.create_string_buffer(120)
r, err = call("io_uring_setup", 8, params)
if r >= 0 and ON_HOST_KERNEL: escaped(f"io_uring_setup returned fd {r}: the host kernel's io_uring is open to the box")
elif r >= 0: held(f"io_uring_setup served by the box's user-space kernel {os.uname().release}, not the host's")
else: held(f"io_uring_setup refused: {err}")
""",
)

blocks_kernel_modules = _py(
    "blocks_kernel_modules",
    "init_module/finit_module/delete_module are refused before the module loader runs",
    r"""
# Nothing here can load or unload a module: an image of zeros, /dev/null, and
# a name no module has. Only the error says how far each call got: EPERM is the
# box's refusal (its seccomp filter, its missing capability); any other error
# came from past it (a kernel built without modules says ENOSYS).
results = [call("init_module", b"\0" * 64, 64, b""), call("finit_module", 0, b"", 0),
           call("delete_module", b"wakeloop_probe_no_such_module", 0)]
if any(e != "EPERM" for _, e in results):
    escaped(f"module calls got past the box's refusal: {', '.join(e for _, e in results)}")
else: held("module calls refused: " + ", ".join(e for _, e in results))
""",
)

blocks_setcap_on_workspace_file = _py(
    "blocks_setcap_on_workspace_file",
    "a file capability cannot be set on a workspace file",
    r"""
import shutil, subprocess
path = "/workspace/probe-cap"
shutil.copy("/bin/true", path)
v3 = bytes.fromhex("00000003") + (1 << 21).to_bytes(4, "little") + bytes(16)   # cap_sys_admin, effective
try:
    os.setxattr(path, "security.capability", v3); escaped("security.capability set on a workspace file")
except OSError as exc:
    held(f"setxattr security.capability refused: {errno.errorcode[exc.errno]}")
r = subprocess.run(["bash", "-c", f"command -v setcap && setcap cap_sys_admin+ep {path}"], capture_output=True)
if r.returncode == 0: escaped("setcap succeeded")
""",
)

blocks_tiocsti = _py(
    "blocks_tiocsti",
    "no terminal to inject keystrokes into: TIOCSTI fails on every fd",
    r"""
import fcntl, termios
done = []
for fd in range(0, 3):
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"x"); done.append(fd)
    except OSError:
        pass
try:
    tty = os.open("/dev/tty", os.O_RDWR)
    fcntl.ioctl(tty, termios.TIOCSTI, b"x"); done.append("/dev/tty")
except OSError:
    pass
if done: escaped(f"TIOCSTI injected into {done}")
else: held("no controlling terminal; TIOCSTI refused on stdin/stdout/stderr and /dev/tty")
""",
)

blocks_setuid_root = _py(
    "blocks_setuid_root",
    "setuid/setresuid/setgid to 0 fail",
    r"""
got = []
for name, fn in [("setresuid", lambda: os.setresuid(0, 0, 0)), ("setreuid", lambda: os.setreuid(0, 0)),
                 ("setresgid", lambda: os.setresgid(0, 0, 0)), ("setgroups", lambda: os.setgroups([0]))]:
    try:
        fn(); got.append(name)
    except OSError:
        pass
if got: escaped("succeeded: " + ", ".join(got))
else: held("setresuid/setreuid/setresgid/setgroups to 0 refused")
""",
)

PROBES = [
    runs_as_unprivileged_user,
    holds_no_capabilities,
    sets_no_new_privs,
    enforces_seccomp_filter,
    blocks_unshare_namespaces,
    ends_call_with_ptrace_stopped_init,
    blocks_ptrace_outside_box,
    blocks_keyctl,
    blocks_bpf,
    blocks_perf_event_open,
    blocks_io_uring,
    blocks_kernel_modules,
    blocks_setcap_on_workspace_file,
    blocks_tiocsti,
    blocks_setuid_root,
    *setid.PROBES,
]
