"""The guard's seccomp filter, decision by decision, with no engine: the BPF that
seccomp.py assembles is run here by a small interpreter over every syscall it
names x every ABI x modes and flags with and without 06000, and over numbers it
does not name. The same questions asked of a real kernel, and of gVisor, in a
box: tests/test_sandbox.py (set-id bits)."""

from __future__ import annotations

import struct

import pytest

from orchestrator.sandbox.containers import seccomp
from orchestrator.sandbox.containers.seccomp import (
    ABIS,
    ALLOW,
    ENOSYS,
    EPERM,
    ERRNO,
    X32_BIT,
    assemble,
    goto,
    jeq,
    jset,
    label,
    ld,
    program,
    ret,
)

DENIED_EPERM, DENIED_ENOSYS = ERRNO | EPERM, ERRNO | ENOSYS


def run_bpf(prog: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel's seccomp would return for this call: the classic BPF subset we emit."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    ops = [struct.unpack("<HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    pc, a = 0, 0
    for _ in range(len(ops) + 1):  # forward jumps only: at most one pass
        code, jt, jf, k = ops[pc]
        pc += 1
        if code == seccomp.LD_ABS:
            a = struct.unpack_from("<I", data, k)[0]
        elif code == seccomp.AND_K:
            a &= k
        elif code == seccomp.JEQ_K:
            pc += jt if a == k else jf
        elif code == seccomp.JSET_K:
            pc += jt if a & k else jf
        elif code == seccomp.JA:
            pc += k
        elif code == seccomp.RET_K:
            return k
        else:
            raise AssertionError(f"op {code:#x} not in the interpreter")
    raise AssertionError("ran past the end")


# Written out again, from the kernel's tables, not read from seccomp.py.
CHMODS = {
    "x86_64": {
        "chmod": (90, 1),
        "fchmod": (91, 1),
        "fchmodat": (268, 2),
        "fchmodat2": (452, 2),
        "mknod": (133, 1),
        "mknodat": (259, 2),
        "creat": (85, 1),
    },
    "i386": {
        "chmod": (15, 1),
        "fchmod": (94, 1),
        "fchmodat": (306, 2),
        "fchmodat2": (452, 2),
        "mknod": (14, 1),
        "mknodat": (297, 2),
        "creat": (8, 1),
    },
    "aarch64": {"fchmod": (52, 1), "fchmodat": (53, 2), "fchmodat2": (452, 2), "mknodat": (33, 2)},
    "arm": {
        "chmod": (15, 1),
        "fchmod": (94, 1),
        "fchmodat": (333, 2),
        "fchmodat2": (452, 2),
        "mknod": (14, 1),
        "mknodat": (324, 2),
        "creat": (8, 1),
    },
}
OPENS = {
    "x86_64": {"open": (2, 1), "openat": (257, 2)},
    "i386": {"open": (5, 1), "openat": (295, 2)},
    "aarch64": {"openat": (56, 2)},
    "arm": {"open": (5, 1), "openat": (322, 2)},
}
ARCH = {"x86_64": 0xC000003E, "i386": 0x40000003, "aarch64": 0xC00000B7, "arm": 0x40000028}
MODES = [
    0o755,
    0o644,
    0o4755,
    0o2755,
    0o6755,
    0o4000,
    0o2000,
    0o7777,
    0o1777,
    0o100755,
    0o104755,
    0xFFFF0000 | 0o755,
    0xFFFFFFFF,
]
FLAGS = [0, 0o1, 0o2, 0o100, 0o101, 0o20200000, 0o20200002, 0o200000, 0o1000 | 0o2, 0o100 | 0o1000 | 0o2]
CREATES = 0o100 | 0o20000000
ARG_HIGH = [0, 0xFFFFFFFF00000000]  # junk in an arg's high half changes nothing


def test_the_tables_name_every_abi_and_call():
    assert {a.name for a in ABIS} == set(ARCH)
    for abi in ABIS:
        assert abi.arch == ARCH[abi.name]
        assert abi.mode_at == {nr: i for nr, i in CHMODS[abi.name].values()}
        assert abi.open_at == {nr: i for nr, i in OPENS[abi.name].values()}


@pytest.mark.parametrize("abi", sorted(ARCH))
def test_a_set_id_mode_is_refused_on_every_mode_taking_call(abi):
    for call, (nr, at) in CHMODS[abi].items():
        for mode in MODES:
            for high in ARG_HIGH:
                args = [0x1234, 0x5678, 0x9ABC]
                args[at] = high | mode
                want = DENIED_EPERM if mode & 0o6000 else ALLOW
                assert run_bpf(seccomp.FILTER, nr, ARCH[abi], tuple(args)) == want, (abi, call, oct(mode))


@pytest.mark.parametrize("abi", sorted(ARCH))
def test_open_is_refused_a_set_id_mode_only_when_it_creates(abi):
    for call, (nr, at) in OPENS[abi].items():
        for flags in FLAGS:
            for mode in MODES:
                args = [0, 0, 0, 0]
                args[at], args[at + 1] = flags, mode
                want = DENIED_EPERM if flags & CREATES and mode & 0o6000 else ALLOW
                assert run_bpf(seccomp.FILTER, nr, ARCH[abi], tuple(args)) == want, (abi, call, oct(flags), oct(mode))


@pytest.mark.parametrize("abi", sorted(ARCH))
def test_io_uring_and_openat2_answer_enosys(abi):
    for nr in (425, 426, 427, 437):
        assert run_bpf(seccomp.FILTER, nr, ARCH[abi], (0, 0, 0o100, 0o4755)) == DENIED_ENOSYS


@pytest.mark.parametrize("abi", sorted(ARCH))
def test_every_other_number_is_left_to_the_engine(abi):
    named = {nr for nr, _ in [*CHMODS[abi].values(), *OPENS[abi].values()]} | {425, 426, 427, 437}
    for nr in range(0, 1024):
        if nr not in named:
            assert run_bpf(seccomp.FILTER, nr, ARCH[abi], (0o6777,) * 6) == ALLOW, (abi, nr)


def test_x32_calls_are_x86_64_numbers_with_bit_30():
    for nr, at in CHMODS["x86_64"].values():
        args = [0, 0, 0]
        args[at] = 0o4755
        assert run_bpf(seccomp.FILTER, nr | X32_BIT, ARCH["x86_64"], tuple(args)) == DENIED_EPERM
    assert run_bpf(seccomp.FILTER, 425 | X32_BIT, ARCH["x86_64"]) == DENIED_ENOSYS


def test_an_unknown_abi_keeps_the_io_uring_rule_alone():
    for arch in (0, 0x80000016, 0xC0000028):  # none, s390x, a made-up one
        assert run_bpf(seccomp.FILTER, 425, arch) == DENIED_ENOSYS
        assert run_bpf(seccomp.FILTER, 90, arch, (0, 0o4755)) == ALLOW


def test_the_assembler_resolves_labels_and_refuses_what_cannot_jump():
    prog = assemble([ld(0), jeq(7, "yes", "no"), label("no"), ret(1), label("yes"), ret(2)])
    assert run_bpf(prog, 7, 0) == 2 and run_bpf(prog, 8, 0) == 1
    assert run_bpf(assemble([goto("end"), ret(1), label("end"), ret(3)]), 0, 0) == 3
    with pytest.raises(ValueError, match="no label"):
        assemble([jset(1, "nowhere"), ret(0)])
    with pytest.raises(ValueError, match="out of reach"):
        assemble([label("back"), ld(0), jeq(1, "back"), ret(0)])
    with pytest.raises(ValueError, match="out of reach"):
        assemble([jeq(1, "far"), *[ld(0)] * 300, label("far"), ret(0)])
    with pytest.raises(ValueError, match="twice"):
        assemble([label("a"), label("a"), ret(0)])


def test_the_filter_fits_the_kernel():
    assert len(seccomp.FILTER) % 8 == 0 and len(seccomp.FILTER) // 8 <= 4096  # BPF_MAXINSNS
    assert program() and assemble(program()) == seccomp.FILTER
