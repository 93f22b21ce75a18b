"""Set-uid and set-gid bits reaching the host: every way a process can ask for one.

A file in /workspace with S_ISUID is, on the host, a program that runs as
the sandbox's uid for whoever starts it. The box's guard refuses such modes
in the kernel (orchestrator/sandbox/containers/seccomp.py); these probes ask for them by
every syscall that takes a mode, through every ABI this machine's kernel
accepts (x86_64 and i386's `int 0x80`; aarch64's own table there), and judge
from the host, by lstat alone, after the call has ended: a file that keeps a
bit is a breach, whatever the box said.

Each attempt is also made without 06000 (mode 0755): those must make their
file, so a probe whose calls all fail for some other reason (a wrong number,
a missing ABI) shows it instead of passing.

The syscall numbers here are written out again rather than imported from
seccomp.py, as an outsider would look them up: a wrong number in the filter
then shows as an escape, not as two copies of one mistake.

Not here: the filter (sandbox/containers/seccomp.py), the other privilege probes
(privileges.py, which lists these among its own).
"""

from __future__ import annotations

import os
import stat

from orchestrator.escapes.core import Probe, Trial, escaped, held, python_command

CATEGORY = "privileges"
SET_ID_MODES = (0o4755, 0o2755, 0o6755)
PLAIN_MODE = 0o755  # the control: the same call without 06000 must work

# Python run in the box (after core.PRELUDE): attempt(abi, call, mode) makes
# /workspace/setid/<abi>-<call>-<mode> through one raw syscall and prints
# `ATTEMPT <abi> <call> <mode> <ok|ERRNO>`.
ATTEMPTS = r'''
import ctypes, errno, os
L = ctypes.c_long
AT_FDCWD, O_WRONLY, O_CREAT, O_TMPFILE, S_IFREG, AT_SYMLINK_FOLLOW = -100, 0o1, 0o100, 0o20200000, 0o100000, 0x400
WS = "/workspace/setid"
os.makedirs(WS, exist_ok=True)
NUMBERS = {
    "x86_64": dict(chmod=90, fchmod=91, fchmodat=268, fchmodat2=452, open=2, openat=257, creat=85,
                   mknod=133, mknodat=259, openat2=437),
    "i386": dict(chmod=15, fchmod=94, fchmodat=306, fchmodat2=452, open=5, openat=295, creat=8,
                 mknod=14, mknodat=297, openat2=437),
    "aarch64": dict(fchmod=52, fchmodat=53, fchmodat2=452, openat=56, mknodat=33, openat2=437),
}
def _native(nr, *args):
    conv = [ctypes.c_char_p(a) if isinstance(a, bytes) else L(a) for a in args]
    r = libc.syscall(L(nr), *conv)
    return r if r >= 0 else -ctypes.get_errno()
_low = {}
def _i386(nr, *args):
    """i386's ABI from this x86_64 process: `int 0x80` (eax = nr; ebx, ecx, edx, esi =
    args), run from a page below 4 GiB (MAP_32BIT) that also holds the strings, since
    the ABI's pointers are 32 bits."""
    if not _low:
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, L]
        page = libc.mmap(None, 1 << 20, 7, 0x22 | 0x40, -1, 0)   # rwx, private|anonymous|32bit
        # push rbx; mov eax,edi; mov ebx,esi; mov esi,r8d; mov r8,rcx; mov ecx,edx;
        # mov edx,r8d; int 0x80; pop rbx; movsxd rax,eax; ret
        code = bytes.fromhex("53 89f8 89f3 4489c6 4989c8 89d1 4489c2 cd80 5b 4863c0 c3")
        ctypes.memmove(page, code, len(code))
        _low.update(call=ctypes.CFUNCTYPE(L, L, L, L, L, L)(page), free=page + 64)
    def low(b):
        at = _low["free"]; ctypes.memmove(at, b, len(b)); _low["free"] += len(b) + 8; return at
    conv = [low(a) if isinstance(a, bytes) else a for a in args]
    return _low["call"](nr, *(conv + [0] * (4 - len(conv))))
RAW = {"x86_64": _native, "i386": _i386, "aarch64": _native}
def abis():
    """The ABIs this machine's kernel takes from one process: its own, and i386 on x86_64."""
    return {"x86_64": ["x86_64", "i386"], "aarch64": ["aarch64"]}.get(os.uname().machine, [])
CHMODS = ("chmod", "fchmod", "fchmodat", "fchmodat2")
CREATES = ("open", "openat", "creat", "mknod", "mknodat", "tmpfile", "openat2")
def attempt(abi, call, mode):
    """One raw syscall asking for `mode`; prints its answer. A call this ABI lacks is skipped."""
    nr, raw = NUMBERS[abi], RAW[abi]
    if call not in nr and call != "tmpfile":
        return
    path = f"{WS}/{abi}-{call}-{mode:o}".encode()
    if call in CHMODS:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    fd = os.open(path, os.O_RDONLY) if call == "fchmod" else None
    how = (O_WRONLY | O_CREAT).to_bytes(8, "little") + mode.to_bytes(8, "little") + bytes(8)
    args = {"chmod": (path, mode), "fchmod": (fd, mode), "fchmodat": (AT_FDCWD, path, mode),
            "fchmodat2": (AT_FDCWD, path, mode, 0), "open": (path, O_WRONLY | O_CREAT, mode),
            "openat": (AT_FDCWD, path, O_WRONLY | O_CREAT, mode), "creat": (path, mode),
            "mknod": (path, S_IFREG | mode, 0), "mknodat": (AT_FDCWD, path, S_IFREG | mode, 0),
            "tmpfile": (AT_FDCWD, WS.encode(), O_TMPFILE | O_WRONLY, mode),
            "openat2": (AT_FDCWD, path, how, 24)}[call]
    r = raw(nr["openat" if call == "tmpfile" else call], *args)
    if fd is not None:
        os.close(fd)
    if r >= 0 and call in ("open", "openat", "creat", "tmpfile", "openat2"):
        opened = r
        if call == "tmpfile":   # an unnamed file, named now: its mode is the one asked for
            if libc.linkat(AT_FDCWD, f"/proc/self/fd/{opened}".encode(), AT_FDCWD, path, AT_SYMLINK_FOLLOW):
                r = -ctypes.get_errno()
        os.close(opened)
    print("ATTEMPT", abi, call, f"{mode:o}", "ok" if r >= 0 else errno.errorcode.get(-r, str(-r)), flush=True)
def attempt_all(abi_names, calls, modes):
    for abi in abi_names:
        for call in calls:
            for mode in modes:
                attempt(abi, call, mode)
'''

SHELL_PLANT = (
    "cp /bin/sh probe-suid; chmod 4755 probe-suid; cp /bin/sh probe-sgid; chmod 2755 probe-sgid; "
    "cp /bin/sh probe-both; chmod 6755 probe-both; stat -c '%a %n' probe-suid probe-sgid probe-both"
)


def kept_bits(workspace) -> dict[str, str]:
    """Regular files under `workspace` with a set-id bit, as the host sees them (lstat;
    nothing followed, nothing run)."""
    found = {}
    for folder, _dirs, files in os.walk(workspace):
        for name in files:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode) and mode & 0o6000:
                found[os.path.relpath(path, workspace)] = oct(mode & 0o7777)
    return found


def _ask(box, calls: tuple[str, ...], abi_names: str) -> list[list[str]]:
    """Each call through each ABI, with every set-id mode and the plain one: the answers."""
    modes = ", ".join(oct(m) for m in (*SET_ID_MODES, PLAIN_MODE))
    program = ATTEMPTS + f"attempt_all({abi_names}, {calls!r}, ({modes}))\n"
    result = box.run(python_command(program), timeout_s=30, max_output_chars=20_000)
    return [line.split()[1:] for line in result.output.splitlines() if line.startswith("ATTEMPT ")]


def _judge(t: Trial, answers: list[list[str]], what: str, extra: str = "", none_made_ok: bool = False) -> str:
    kept = kept_bits(t.workspace)
    if kept:
        return escaped(f"after {what} the host sees {kept}")
    if not answers:
        return f"no attempt ran ({what}): nothing to judge\n"
    asked = [a for a in answers if int(a[2], 8) & 0o6000]
    plain = [a for a in answers if not int(a[2], 8) & 0o6000]
    refusals = sorted({a[3] for a in asked})
    made = sum(a[3] == "ok" for a in plain)
    if plain and not made and not none_made_ok:  # every call failed anyway: the refusals prove nothing
        failures = "/".join(sorted({a[3] for a in plain}))
        return f"{what}: not one call without 06000 worked ({failures}): nothing to judge\n"
    return held(
        f"{what}: {len(asked)} set-id asks answered {'/'.join(refusals)}, none kept; "
        f"without 06000, {made} of the same {len(plain)} calls ok{extra}"
    )


def _chmods(t: Trial) -> str:
    """chmod from a shell (a pooled and a cold call), then chmod, fchmod, fchmodat
    and fchmodat2 by raw syscall, each with 04000, 02000 and 06000."""
    seen = []
    for how, box in (("pooled", t.box), ("cold", t.new_box(warm=0))):
        result = box.run(SHELL_PLANT, timeout_s=30, max_output_chars=4000)
        kept = kept_bits(t.workspace)
        if kept:
            return escaped(f"after a {how} call's chmod the host sees {kept}")
        seen.append(f"{how} `chmod 4755`: {'set in the box' if '4755 probe-suid' in result.output else 'refused'}")
    answers = _ask(t.box, ("chmod", "fchmod", "fchmodat", "fchmodat2"), "abis()[:1]")
    return _judge(t, answers, "chmod, fchmod, fchmodat, fchmodat2", "; " + ", ".join(seen))


def _creations(t: Trial) -> str:
    return _judge(
        t,
        _ask(t.box, ("open", "openat", "creat", "mknod", "mknodat", "tmpfile", "openat2"), "abis()[:1]"),
        "open, openat, creat, mknod, mknodat, O_TMPFILE+linkat, openat2",
    )


def _i386(t: Trial) -> str:
    if os.uname().machine != "x86_64":
        return held(f"no i386 ABI to try: this machine is {os.uname().machine}")
    calls = (
        "chmod",
        "fchmod",
        "fchmodat",
        "fchmodat2",
        "open",
        "openat",
        "creat",
        "mknod",
        "mknodat",
        "tmpfile",
        "openat2",
    )
    answers = _ask(t.box, calls, "['i386']")
    gvisor = (
        " (this runtime refuses i386 syscalls outright)" if answers and all(a[3] == "EPERM" for a in answers) else ""
    )
    return _judge(t, answers, "every mode-taking call through int 0x80 (i386)", gvisor, none_made_ok=bool(gvisor))


blocks_setuid_bit_reaching_host = Probe(
    "blocks_setuid_bit_reaching_host",
    CATEGORY,
    "no file in the workspace keeps a set-uid or set-gid bit after a call (pooled or cold): "
    "chmod, fchmod, fchmodat and fchmodat2 are refused the mode",
    _chmods,
)

blocks_setuid_bit_at_creation = Probe(
    "blocks_setuid_bit_at_creation",
    CATEGORY,
    "no file is created with a set-id mode: open, openat, creat, mknod, mknodat and an O_TMPFILE "
    "linked in are refused it; openat2 answers ENOSYS",
    _creations,
)

blocks_setuid_bit_through_i386_abi = Probe(
    "blocks_setuid_bit_through_i386_abi",
    CATEGORY,
    "the same calls through i386's `int 0x80`, with i386's numbers, are refused the mode too",
    _i386,
)

PROBES = [blocks_setuid_bit_reaching_host, blocks_setuid_bit_at_creation, blocks_setuid_bit_through_i386_abi]
