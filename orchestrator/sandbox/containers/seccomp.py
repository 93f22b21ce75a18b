"""The guard's seccomp filter: what it refuses, per syscall ABI, and the BPF it becomes.

Two things no engine profile does for us are refused by the kernel itself,
before any agent code runs (programs.py's guard installs this filter first in
every call, and seccomp filters are inherited and can never be removed):

- io_uring_setup/enter/register answer ENOSYS, as on a kernel without
  io_uring, so programs fall back (engines before 25 let io_uring through).
- A file mode with S_ISUID or S_ISGID (06000) answers EPERM: on chmod,
  fchmod, fchmodat and fchmodat2; on open, openat and creat when they create
  (O_CREAT or O_TMPFILE in the flags; creat always); on mknod and mknodat.
  So a set-uid copy of a shell is never made in /workspace, which is, on the
  host, a program that would run as the sandbox's uid for whoever starts it.
  openat2 answers ENOSYS: its mode sits in a struct the filter cannot read,
  and glibc falls back to openat, which the filter checks.

Every ABI the kernel accepts on the machines we run on is checked, each with
its own syscall numbers: x86_64 (and x32, the same numbers with bit 30 set),
i386 (`int 0x80` from any x86_64 process), aarch64 and 32-bit arm. A process
may switch ABI for one syscall, so the filter reads the ABI of every call
(seccomp_data.arch), never assumes the native one. An ABI not in the table
(none on those machines) keeps only the io_uring rule, by number.

The program is written with named ops and jump labels, resolved to offsets
here at import (`assemble`); tests/test_seccomp.py runs it through a BPF
interpreter for every syscall x ABI x mode, and tests/test_sandbox.py asks a
real kernel (and gVisor's) the same questions in a box.

Not here: how the filter is installed and what runs after it (programs.py),
the engine's own seccomp profile (the first filter; the engine's default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# seccomp_data, as the kernel lays it out: nr at 0, arch at 4, instruction
# pointer at 8, six 64-bit args from 16. Each arg's low 32 bits come first on
# a little-endian machine (all four ABIs below); modes and open flags fit in them.
NR_AT, ARCH_AT = 0, 4


def arg_low(i: int) -> int:
    """Offset of the low 32 bits of syscall argument i."""
    return 16 + 8 * i


# Return values (SECCOMP_RET_*) and errnos (the same numbers on all four ABIs).
ALLOW = 0x7FFF0000
ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38

SET_ID = 0o6000  # S_ISUID | S_ISGID
CREATES = 0o100 | 0o20000000  # O_CREAT | __O_TMPFILE: the flags under which open* reads its mode
X32_BIT = 0x40000000  # __X32_SYSCALL_BIT: x32 calls are x86_64's numbers with it set
IO_URING = (425, 426, 427)  # io_uring_setup, _enter, _register: one number on every ABI
OPENAT2 = 437  # likewise
FCHMODAT2 = 452  # likewise

# -- the rules, per ABI ----------------------------------------------------------


@dataclass(frozen=True)
class Abi:
    name: str
    arch: int  # AUDIT_ARCH_*, as seccomp_data.arch carries it
    nr_mask: int  # what of seccomp_data.nr is the syscall's number
    mode_at: dict[int, int]  # syscall nr -> index of its mode argument
    open_at: dict[int, int]  # syscall nr -> index of its flags argument (the mode follows)
    enosys: tuple[int, ...] = field(default=IO_URING + (OPENAT2,))


X86_64 = Abi(
    "x86_64",
    0xC000003E,
    ~X32_BIT & 0xFFFFFFFF,
    mode_at={
        90: 1,
        91: 1,
        268: 2,
        FCHMODAT2: 2,  # chmod, fchmod, fchmodat, fchmodat2
        133: 1,
        259: 2,
        85: 1,
    },  # mknod, mknodat, creat
    open_at={2: 1, 257: 2},
)  # open, openat
I386 = Abi(
    "i386",
    0x40000003,
    0xFFFFFFFF,
    mode_at={
        15: 1,
        94: 1,
        306: 2,
        FCHMODAT2: 2,  # chmod, fchmod, fchmodat, fchmodat2
        14: 1,
        297: 2,
        8: 1,
    },  # mknod, mknodat, creat
    open_at={5: 1, 295: 2},
)  # open, openat
AARCH64 = Abi(
    "aarch64",
    0xC00000B7,
    0xFFFFFFFF,  # the generic table: only the *at calls
    mode_at={
        52: 1,
        53: 2,
        FCHMODAT2: 2,  # fchmod, fchmodat, fchmodat2
        33: 2,
    },  # mknodat
    open_at={56: 2},
)  # openat
ARM = Abi(
    "arm",
    0x40000028,
    0xFFFFFFFF,  # aarch64's 32-bit compat ABI (EABI)
    mode_at={
        15: 1,
        94: 1,
        333: 2,
        FCHMODAT2: 2,  # chmod, fchmod, fchmodat, fchmodat2
        14: 1,
        324: 2,
        8: 1,
    },  # mknod, mknodat, creat
    open_at={5: 1, 322: 2},
)  # open, openat
ABIS = (X86_64, I386, AARCH64, ARM)


# -- a small BPF assembler ---------------------------------------------------------

LD_ABS, AND_K, JEQ_K, JSET_K, JA, RET_K = 0x20, 0x54, 0x15, 0x45, 0x05, 0x06
JUMP_MAX = 255  # a conditional jump's offset is one byte


@dataclass(frozen=True)
class Op:
    code: int
    k: int = 0
    jt: str | None = None  # label to go to if the test holds; None: the next op
    jf: str | None = None  # label if not
    label: str | None = None  # set only on a Label pseudo-op, which emits nothing


def label(name: str) -> Op:
    return Op(-1, label=name)


def ld(offset: int) -> Op:
    return Op(LD_ABS, offset)


def and_(k: int) -> Op:
    return Op(AND_K, k)


def jeq(k: int, then: str | None = None, other: str | None = None) -> Op:
    return Op(JEQ_K, k, then, other)


def jset(k: int, then: str | None = None, other: str | None = None) -> Op:
    return Op(JSET_K, k, then, other)


def goto(where: str) -> Op:
    return Op(JA, jt=where)


def ret(k: int) -> Op:
    return Op(RET_K, k)


def assemble(ops: list[Op]) -> bytes:
    """struct sock_filter[] for `ops`, every label resolved to a forward offset."""
    at, n = {}, 0
    for op in ops:
        if op.label is not None:
            if op.label in at:
                raise ValueError(f"label {op.label} twice")
            at[op.label] = n
        else:
            n += 1
    out, pc = [], 0
    for op in ops:
        if op.label is not None:
            continue
        pc += 1  # offsets count from the op after this one

        def off(name: str | None, limit: int, pc: int = pc) -> int:  # this op's pc, bound now
            if name is None:
                return 0
            if name not in at:
                raise ValueError(f"no label {name}")
            if not 0 <= at[name] - pc <= limit:
                raise ValueError(f"jump to {name} out of reach ({at[name] - pc})")
            return at[name] - pc

        if op.code == JA:
            out.append((JA, 0, 0, off(op.jt, 0xFFFFFFFF)))
        else:
            out.append((op.code, off(op.jt, JUMP_MAX), off(op.jf, JUMP_MAX), op.k))
    return b"".join(code.to_bytes(2, "little") + bytes([jt, jf]) + k.to_bytes(4, "little") for code, jt, jf, k in out)


# -- the filter ----------------------------------------------------------------------


def program(abis: tuple[Abi, ...] = ABIS) -> list[Op]:
    """The guard's filter: dispatch on the ABI, then on the number, then check the mode."""
    ops = [ld(ARCH_AT)]
    ops += [jeq(abi.arch, abi.name) for abi in abis]
    # An ABI we do not know: today's io_uring rule by number, nothing else.
    ops += [ld(NR_AT), and_(~X32_BIT & 0xFFFFFFFF)]
    ops += [jeq(nr, "enosys") for nr in IO_URING]
    ops += [goto("allow")]
    for abi in abis:
        ops += [label(abi.name), ld(NR_AT)]
        if abi.nr_mask != 0xFFFFFFFF:
            ops += [and_(abi.nr_mask)]
        ops += [jeq(nr, "enosys") for nr in abi.enosys]
        ops += [jeq(nr, f"mode{i}") for nr, i in sorted(abi.mode_at.items())]
        ops += [jeq(nr, f"flags{i}") for nr, i in sorted(abi.open_at.items())]
        ops += [goto("allow")]
    # Shared by every ABI: the args sit at the same offsets whatever the ABI.
    for i in sorted({i for abi in abis for i in abi.open_at.values()}):
        ops += [label(f"flags{i}"), ld(arg_low(i)), jset(CREATES, f"mode{i + 1}", "allow")]
    for i in sorted(
        {i for abi in abis for i in abi.mode_at.values()} | {i + 1 for abi in abis for i in abi.open_at.values()}
    ):
        ops += [label(f"mode{i}"), ld(arg_low(i)), jset(SET_ID, "eperm", "allow")]
    ops += [label("eperm"), ret(ERRNO | EPERM), label("enosys"), ret(ERRNO | ENOSYS), label("allow"), ret(ALLOW)]
    return ops


FILTER = assemble(program())  # what the guard installs (programs.py's INSTALL)
