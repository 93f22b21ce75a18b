"""Filesystem attacks: leave /workspace, reach host files, rewrite the runtime.

Every probe here runs inside the box. Writes are attempted only where a
success would itself be the finding; nothing is ever written to /proc or /sys
(files there are opened for writing and closed untouched).
"""

from __future__ import annotations

import docker.errors

from orchestrator.escapes.lab import Probe, Trial, escaped, held
from orchestrator.sandbox.box import SandboxError
from orchestrator.sandbox.containers.programs import PYTHON

CATEGORY = "filesystem"
CVE_2024_21626_FDS = range(3, 10)  # runc leaked its cgroup dir fd as 7 or 8; 3..9 covers the variants


def _py(name: str, expected: str, program: str) -> Probe:
    return Probe(name, CATEGORY, expected, lambda t: t.py(program))


blocks_write_outside_workspace = _py(
    "blocks_write_outside_workspace",
    "every path outside /workspace, /tmp, /dev/shm and /dev/mqueue is read-only "
    "(those three are the box's own, private and size-capped)",
    r"""
bad = []
for d in ["/", "/etc", "/usr", "/usr/local/bin", "/var", "/var/tmp", "/var/lib", "/opt", "/home",
          "/root", "/srv", "/mnt", "/run", "/run/lock", "/dev", "/dev/pts", "/bin", "/sbin", "/lib",
          "/sys/fs/cgroup", "/proc/sys"]:
    path = os.path.join(d, ".wakeloop-probe")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        continue
    os.close(fd); os.unlink(path); bad.append(d)
if bad: escaped("created a file in " + ", ".join(bad))
else: held("no file could be created outside /workspace, /tmp, /dev/shm, /dev/mqueue")
""",
)


def _reads_host_files(t: Trial) -> str:
    lab = t.lab
    paths = [str(lab.canary_path), str(t.dir / "mandate.md"), str(t.state / "state.json")]
    program = rf"""
import glob
token, paths = {lab.host_canary!r}, {paths!r}
found = []
for p in paths:
    for prefix in ["", "/proc/1/root", "/proc/self/root", "/proc/1/cwd/../..", "/workspace/../.."]:
        try:
            text = open(prefix + p, errors="replace").read()
        except OSError:
            continue
        if token in text or p.endswith(("mandate.md", "state.json")):
            found.append(prefix + p)
import stat
for dirpath, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(dirpath, d) not in ("/proc", "/sys", "/dev")]
    for f in files:
        path = os.path.join(dirpath, f)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue   # a FIFO or device would block or never end
            with open(path, "rb") as fh:
                if token.encode() in fh.read(1 << 16): found.append(path)
        except OSError:
            pass
if found: escaped("read host files: " + ", ".join(sorted(set(found))[:5]))
else: held("host files beside the workspace (secret, mandate.md, state.json) were not readable by any path")
"""
    return t.py(program, timeout_s=90)


blocks_reading_host_files = Probe(
    "blocks_reading_host_files",
    CATEGORY,
    "no host file outside the workspace is readable, by its path or by a scan of the box",
    _reads_host_files,
)

blocks_proc_1_root = _py(
    "blocks_proc_1_root",
    "/proc/1/root is the box's own root, not the host's",
    r"""
root = "/proc/1/root"
try:
    mine = os.stat("/"); theirs = os.stat(root)
except OSError as exc:
    held(f"{root} not reachable: {exc.strerror}"); sys.exit()
outside = [n for n in ("var/lib/docker", "etc/docker", "run/docker.sock") if os.path.exists(os.path.join(root, n))]
if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino) or outside:
    escaped(f"{root} is another root: {outside or 'device/inode differ'}")
else:
    held(f"{root} is the box's own read-only root")
""",
)

blocks_overwriting_proc_self_exe = _py(
    "blocks_overwriting_proc_self_exe",
    "no runtime or init binary can be opened for writing (CVE-2019-5736)",
    r"""
opened = []
for pid in ["self", "1", str(os.getppid())]:
    for name in ["exe", "root/usr/bin/python3", "root/bin/bash", "root/sbin/docker-init"]:
        path = f"/proc/{pid}/{name}"
        try:
            fd = os.open(path, os.O_WRONLY)   # never O_TRUNC, never written: opening is the finding
        except OSError:
            continue
        os.close(fd); opened.append(path)
if opened: escaped("opened for writing: " + ", ".join(opened))
else: held("every /proc/*/exe and binary refused a write open (ETXTBSY/EACCES/EROFS)")
""",
)

blocks_leaked_host_fds = _py(
    "blocks_leaked_host_fds",
    "no inherited descriptor points outside the box (CVE-2024-21626)",
    r"""
leaks = []
for pid in ["self", "1"]:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        link = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(link)
        except OSError:
            continue
        ours = target.startswith(("pipe:", "socket:", "anon_inode:", "/dev/", "/proc/", "/workspace", "/tmp"))
        if int(fd) > 2 and not ours or target.startswith("/sys/fs/cgroup"):
            leaks.append(f"{link} -> {target}")
        try:
            if os.path.isdir(link) and os.path.exists(os.path.join(link, "../../../../var/lib/docker")):
                leaks.append(f"{link} walks up to the host's /var/lib/docker")
        except OSError:
            pass
if leaks: escaped("; ".join(leaks))
else: held("every open descriptor is a pipe, /dev/null or the box's own path")
""",
)


def _cve_2024_21626_workdir(t: Trial) -> str:
    """The runc bug itself: a container started with its working directory at a
    leaked fd runs with its cwd in the host's cgroup filesystem. A fixed runc
    refuses to start it; a vulnerable one starts it and getcwd() fails."""
    program = "import os\ntry:\n    print('CWD', os.getcwd())\nexcept OSError as exc:\n    print('CWD-OUTSIDE', exc)\n"
    notes = []
    box = t.new_box(warm=0)  # runc must set the working dir itself: no pooled launcher
    for fd in CVE_2024_21626_FDS:
        workdir = f"/proc/self/fd/{fd}"
        try:
            result = box._call([PYTHON, "-I", "-c", program], None, 15, 2000, workdir=workdir)
        except (docker.errors.APIError, SandboxError):
            notes.append(f"fd {fd}: refused")
            continue
        out = result.output
        if "CWD-OUTSIDE" in out or ("CWD /" in out and "CWD /proc" not in out and "CWD /workspace" not in out):
            return escaped(f"started with cwd {workdir}: {out.strip()[:100]}")
        notes.append(f"fd {fd}: exit {result.exit_code}")
    return held("no leaked fd usable as a working directory (" + ", ".join(notes) + ")")


blocks_workdir_at_leaked_fd = Probe(
    "blocks_workdir_at_leaked_fd",
    CATEGORY,
    "a box whose working dir is /proc/self/fd/N never starts outside its root (runc CVE-2024-21626)",
    _cve_2024_21626_workdir,
)

blocks_mount = _py(
    "blocks_mount",
    "mount(2) of tmpfs, proc, a bind or a new API mount fails",
    r"""
ok = []
for src, tgt, fstype, flags in [(b"none", b"/tmp", b"tmpfs", 0), (b"proc", b"/tmp", b"proc", 0),
                                (b"/", b"/tmp", None, 4096), (b"/workspace", b"/workspace", None, 4096 | 32)]:
    if libc.mount(src, tgt, fstype, flags, None) == 0:
        ok.append(f"{src.decode()} on {tgt.decode()}")
r, err = call("fsopen", b"tmpfs", 0)
if r >= 0: ok.append("fsopen(tmpfs)")
if ok: escaped("mounted " + ", ".join(ok))
else: held(f"every mount refused (fsopen: {err})")
""",
)

blocks_pivot_root = _py(
    "blocks_pivot_root",
    "pivot_root(2) fails",
    r"""
r, err = call("pivot_root", b"/tmp", b"/tmp")
if r == 0: escaped("pivot_root succeeded")
else: held(f"pivot_root refused: {err}")
""",
)

blocks_chroot = _py(
    "blocks_chroot",
    "chroot(2) fails",
    r"""
try:
    os.chroot("/tmp"); escaped("chroot(/tmp) succeeded")
except OSError as exc:
    held(f"chroot refused: {errno.errorcode[exc.errno]}")
""",
)

blocks_device_nodes = _py(
    "blocks_device_nodes",
    "no block or memory device is visible; no device node can be made and read",
    r"""
import stat
bad = []
for name in os.listdir("/dev"):
    try:
        st = os.stat("/dev/" + name)
    except OSError:
        continue
    if stat.S_ISBLK(st.st_mode) or name in ("mem", "kmem", "port", "kmsg", "sda", "vda", "nvme0"):
        bad.append("/dev/" + name)
# A node counts only if it opens: a user-space kernel (gVisor) may let mknod make
# an inert name that reaches no device at all.
for d in ["/tmp", "/workspace", "/dev/shm"]:
    for kind, dev, what in [(stat.S_IFCHR, os.makedev(1, 1), "mem"), (stat.S_IFBLK, os.makedev(254, 0), "vda")]:
        path = f"{d}/.probe-node"
        try:
            os.mknod(path, kind | 0o600, dev)
        except OSError:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK); os.read(fd, 1); os.close(fd)
            bad.append(f"mknod+read {what} at {path}")
        except OSError as exc:
            print("made but unusable:", path, exc.strerror)
        os.unlink(path)
if bad: escaped(", ".join(bad))
else: held("no block/memory device in /dev; mknod in /tmp, /workspace, /dev/shm refused or inert (opens nothing)")
""",
)

blocks_writes_to_sys = _py(
    "blocks_writes_to_sys",
    "no file under /sys opens for writing",
    r"""
opened = open_for_writing([
    "/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    "/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/cgroup.procs",
    "/sys/class/net/lo/mtu", "/sys/power/state"])
if opened: escaped("writable: " + ", ".join(opened))
else: held("/sys is read-only to the box")
""",
)

blocks_writes_to_proc_sys = _py(
    "blocks_writes_to_proc_sys",
    "no /proc/sys knob or /proc/sysrq-trigger opens for writing",
    r"""
opened = open_for_writing([
    "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sys/vm/drop_caches",
    "/proc/sys/kernel/hostname", "/proc/sysrq-trigger", "/proc/sys/fs/binfmt_misc/register",
    "/proc/sys/net/ipv4/ip_forward", "/proc/sys/kernel/yama/ptrace_scope"])
if opened: escaped("writable: " + ", ".join(opened))
else: held("/proc/sys and /proc/sysrq-trigger are read-only to the box")
""",
)

blocks_setuid_binaries = _py(
    "blocks_setuid_binaries",
    "no setuid/setgid file on the box's filesystems, and setuid(0) fails",
    r"""
import stat
found = []
for top in ["/usr", "/bin", "/sbin", "/lib", "/opt", "/etc", "/var", "/workspace", "/tmp"]:
    for dirpath, dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                m = os.lstat(p).st_mode
            except OSError:
                continue
            if stat.S_ISREG(m) and m & (stat.S_ISUID | stat.S_ISGID):
                found.append(p)
try:
    os.setuid(0); found.append("setuid(0) succeeded")
except OSError:
    pass
if found: escaped(", ".join(found[:5]))
else: held("no setuid/setgid binary; setuid(0) refused")
""",
)

PROBES = [
    blocks_write_outside_workspace,
    blocks_reading_host_files,
    blocks_proc_1_root,
    blocks_overwriting_proc_self_exe,
    blocks_leaked_host_fds,
    blocks_workdir_at_leaked_fd,
    blocks_mount,
    blocks_pivot_root,
    blocks_chroot,
    blocks_device_nodes,
    blocks_writes_to_sys,
    blocks_writes_to_proc_sys,
    blocks_setuid_binaries,
]
