"""probes/ebpf/_btf.py and _elf.py, the two readers the probes place their uprobes and one kernel field
with, on real files of this machine: the running kernel's BTF, this process's libc (its code bytes
compared with the bytes loaded in memory) and the NCCL wheel's libnccl.so.2; and on small blobs
built here for what no real file shows (a bitfield's offset, a kind the walk cannot pass)."""

from __future__ import annotations

import ctypes
import struct
import subprocess
from pathlib import Path

import pytest

from scout_sys.probes.ebpf import _btf, _elf
from tests._host import libnccl

VMLINUX = Path("/sys/kernel/btf/vmlinux")
needs_btf = pytest.mark.skipif(not VMLINUX.exists(), reason="no /sys/kernel/btf/vmlinux on this kernel")


# ------------------------------------------------------------------ BTF


@needs_btf
def test_member_offsets_of_the_running_kernel():
    # layouts that are the kernel's ABI: list_head {next, prev}, callback_head {next, func}
    assert (_btf.member_offset("list_head", "next"), _btf.member_offset("list_head", "prev")) == (0, 8)
    assert _btf.member_offset("callback_head", "func") == 8
    assert _btf.member_offset("timespec64", "tv_nsec") == 8
    # task_struct, walked past every kind before it: pid and tgid are adjacent pid_t members
    pid, tgid = _btf.member_offset("task_struct", "pid"), _btf.member_offset("task_struct", "tgid")
    assert pid is not None and pid > 0 and tgid == pid + 4
    exit_code = _btf.member_offset("task_struct", "exit_code")  # what the sched probe reads
    assert exit_code is not None and 0 < exit_code < pid
    assert _btf.member_offset("task_struct", "no_such_member") is None
    assert _btf.member_offset("no_such_struct_here", "pid") is None


def _btf_blob(types: bytes, strings: bytes) -> bytes:
    return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings)) + types + strings


def _type(name_off: int, kind: int, vlen: int, size: int, kflag: int = 0) -> bytes:
    return struct.pack("<III", name_off, kflag << 31 | kind << 24 | vlen, size)


def test_a_bitfield_member_at_a_byte_boundary_and_one_inside_a_byte(tmp_path):
    strings = b"\0int\0s\0a\0b\0c\0"
    off = {n: strings.index(b"\0" + n + b"\0") + 1 for n in (b"int", b"s", b"a", b"b", b"c")}
    types = (_type(off[b"int"], 1, 0, 4) + struct.pack("<I", 32)  # INT: 4 bytes of its own after the type
             + _type(0, 2, 0, 1)  # PTR: none
             + _type(off[b"s"], 4, 3, 8, kflag=1)  # STRUCT with bitfields: offsets are bits | size << 24
             + struct.pack("<III", off[b"a"], 1, 3 << 24 | 0)
             + struct.pack("<III", off[b"b"], 1, 5 << 24 | 32)
             + struct.pack("<III", off[b"c"], 1, 1 << 24 | 37))
    path = tmp_path / "btf"
    path.write_bytes(_btf_blob(types, strings))
    assert [_btf.member_offset("s", m, path) for m in ("a", "b", "c")] == [0, 4, None]
    assert _btf.member_offset("int", "a", path) is None  # not a struct


def test_a_kind_it_cannot_walk_past_and_files_that_are_not_btf(tmp_path):
    strings = b"\0s\0a\0"
    types = _type(0, 30, 0, 0) + _type(1, 4, 1, 4) + struct.pack("<III", 3, 0, 0)  # kind 30: unknown
    path = tmp_path / "btf"
    path.write_bytes(_btf_blob(types, strings))
    assert _btf.member_offset("s", "a", path) is None
    path.write_bytes(_btf_blob(_type(1, 4, 1, 4) + struct.pack("<III", 3, 0, 64), strings))
    assert _btf.member_offset("s", "a", path) == 8  # the same struct, with nothing unknown before it
    (tmp_path / "junk").write_bytes(b"\0" * 64)
    assert _btf.member_offset("s", "a", tmp_path / "junk") is None
    assert _btf.member_offset("s", "a", tmp_path / "missing") is None


# ------------------------------------------------------------------ ELF


def _libc() -> tuple[str, int]:
    """(path, load base) of the libc this process runs."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and "/libc.so" in fields[5] and fields[2] == "00000000":
            return fields[5], int(fields[0].split("-")[0], 16)
    pytest.skip("no libc.so mapped in this process")


def test_libc_symbols_and_code_are_what_the_loader_mapped():
    path, base = _libc()
    syms = _elf.function_symbols(path, rb"getpid|clock_gettime|getpi")
    assert set(syms) >= {"getpid", "clock_gettime"} and "getpi" not in syms  # whole names only
    libc = ctypes.CDLL(path)
    for name in ("getpid", "clock_gettime"):
        loaded = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
        assert loaded == base + syms[name], name  # st_value is the offset from the load base
        # the bytes read from the file at that address are the code the process runs
        assert _elf.read_code(path, syms[name], 16) == ctypes.string_at(loaded, 16), name
    assert _elf.read_code(path, 1 << 46, 16) == b""  # in no PT_LOAD segment


def test_libc_symbols_match_nm():
    path, _ = _libc()
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, timeout=60, check=True)
    nm = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in ("T", "i", "W"):
            nm.setdefault(parts[2].split("@")[0], int(parts[0], 16))
    syms = _elf.function_symbols(path, rb"mem[a-z]+")
    assert syms and set(syms) <= set(nm)
    assert {k: nm[k] for k in syms} == syms
    assert {k for k in nm if k.startswith("mem") and k[3:].isalpha() and k[3:].islower()} == set(syms)


@pytest.mark.torch  # the NCCL wheel comes with the test requirements of the dev venv, never .venv-oldest
@pytest.mark.skipif(libnccl() is None, reason="nvidia-nccl-cu12 wheel not installed (pip install -r requirements-test.txt)")
def test_nccls_entry_points_and_their_profiling_twins():
    # linkers merge string tails: "ncclAllReduce" is the tail of "pncclAllReduce" in the string table,
    # and both names are found (the public one an alias of the p-prefixed one NCCL defines)
    syms = _elf.function_symbols(str(libnccl()), rb"p?ncclAllReduce|p?ncclCommInitRank")
    assert set(syms) == {"ncclAllReduce", "pncclAllReduce", "ncclCommInitRank", "pncclCommInitRank"}, syms
    assert syms["ncclAllReduce"] == syms["pncclAllReduce"] and syms["ncclCommInitRank"] == syms["pncclCommInitRank"]
    assert len(_elf.read_code(str(libnccl()), syms["ncclAllReduce"], 32)) == 32


def test_a_file_that_is_not_elf64(tmp_path):
    (tmp_path / "x.so").write_bytes(b"#!/bin/sh\n" + b"\0" * 100)
    with pytest.raises(_elf.ElfError):
        _elf.function_symbols(str(tmp_path / "x.so"), rb"main")
    elf32 = b"\x7fELF\x01\x01\x01" + b"\0" * 100
    (tmp_path / "y.so").write_bytes(elf32)
    with pytest.raises(_elf.ElfError):
        _elf.read_code(str(tmp_path / "y.so"), 0, 4)
