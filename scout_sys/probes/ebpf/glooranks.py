"""The global ranks of a Gloo process group, read from the rank's memory at the group's address.

The collective probe knows each Gloo group of a rank by its address (``ProcessGroupGloo* this``), and
numbers them by first use: that number says nothing about which ranks are in it, so two tensor-parallel
groups of a dp x tp job get the same number on their members. The members are in the object itself:
torch sets ``options_->global_ranks_in_group`` on every group it makes (distributed_c10d's
``_new_process_group_helper``; empty for the default group, which is the whole job), and
``c10d::Backend`` keeps the rank's own group rank and the group's size (``rank_``, ``size_``).

Offsets differ between torch builds, so they are read from the library's code, as the tag counter's
is (collectives.py ``tag_offset``):

- ``ProcessGroupGloo::groupRanks() const`` starts ``mov rax, [rdi+options_]``, then reads the vector's
  end and compares it with its begin (``[rax+end]``, ``[rax+begin]``, 8 bytes apart);
- ``Backend::Backend(int rank, int size)`` stores ``esi`` at ``rank_`` and ``edx`` at ``size_``.

What is read is checked before it is believed: a size between 1 and 2^20, the group rank below it, as
many members as the size, distinct, and the rank's own global rank at its group rank (new groups list
their ranks sorted; a split keeps the parent's order). Anything else: members unknown (``()``), and
the probe's numbering stands. The memory is read through ``/proc/PID/mem`` (the probe runs as root).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

GROUP_RANKS = "_ZNK4c10d16ProcessGroupGloo10groupRanksEv"
BACKEND_CTORS = ("_ZN4c10d7BackendC2Eii", "_ZN4c10d7BackendC1Eii")
MAX_SIZE = 1 << 20

Reader = Callable[[int, int], bytes]  # (address, length) -> bytes (short or empty: unreadable)


@dataclass(frozen=True)
class GlooOffsets:
    options: int  # ProcessGroupGloo::options_ (an intrusive_ptr: the Options* itself)
    begin: int  # Options::global_ranks_in_group (std::vector<uint64_t>: begin, end, capacity)
    rank: int  # Backend::rank_ (int)
    size: int  # Backend::size_ (int)


def _mem_operand(code: bytes, at: int) -> tuple[int, int, int, int] | None:
    """A REX.W ``mov r64, [base+disp]`` (8b) or ``cmp [base+disp], r64`` (39) at ``at``:
    (opcode, reg, base, disp); None otherwise."""
    if len(code) < at + 4 or code[at] not in (0x48, 0x4C) or code[at + 1] not in (0x8B, 0x39):
        return None
    modrm = code[at + 2]
    mod, reg, rm = modrm >> 6, (modrm >> 3) & 7, modrm & 7
    if rm == 4 or mod not in (1, 2):
        return None  # a SIB byte, or no displacement: not the shape these accessors have
    reg |= 8 if code[at] & 0x04 else 0
    if mod == 1:
        (disp,) = struct.unpack_from("<b", code, at + 3)
        return code[at + 1], reg, rm, disp
    if len(code) < at + 7:
        return None
    (disp,) = struct.unpack_from("<i", code, at + 3)
    return code[at + 1], reg, rm, disp


def _length(code: bytes, at: int) -> int:
    return 4 if code[at + 2] >> 6 == 1 else 7


def group_ranks_offsets(code: bytes) -> tuple[int, int] | None:
    """(options_, global_ranks_in_group's begin) from the first instructions of ``groupRanks()``."""
    first = _mem_operand(code, 0)
    if first is None or first[0] != 0x8B or first[2] != 7:  # mov r, [rdi+options_]
        return None
    _op, holder, _base, options = first
    at = _length(code, 0)
    disps = []
    for _ in range(2):
        x = _mem_operand(code, at)
        if x is None or x[2] != holder:
            return None
        disps.append(x[3])
        at += _length(code, at)
    lo, hi = sorted(disps)
    if hi - lo != 8 or not 0 <= options < 4096 or not 0 <= lo < 4096:
        return None
    return options, lo


def rank_size_offsets(code: bytes) -> tuple[int, int] | None:
    """(rank_, size_) from ``Backend::Backend(int rank, int size)``: ``mov [rdi|rbx+d8], esi`` and
    ``mov [rdi|rbx+d8], edx`` among its first instructions, ``size_`` right after ``rank_``."""
    rank = size = None
    for i in range(min(len(code), 64) - 2):
        if code[i] != 0x89 or (i and code[i - 1] in range(0x40, 0x50)):
            continue
        modrm = code[i + 1]
        if modrm >> 6 != 1 or modrm & 7 not in (7, 3):
            continue
        reg, disp = (modrm >> 3) & 7, code[i + 2]
        if reg == 6 and rank is None:
            rank = disp
        elif reg == 2 and size is None:
            size = disp
    if rank is None or size != rank + 4:
        return None
    return rank, size


def offsets(group_ranks_code: bytes, ctor_code: bytes) -> GlooOffsets | None:
    g = group_ranks_offsets(group_ranks_code)
    r = rank_size_offsets(ctor_code)
    return GlooOffsets(g[0], g[1], r[0], r[1]) if g and r else None


def members(read: Reader, group: int, off: GlooOffsets, rank: int, world_size: int) -> tuple[int, ...]:
    """The global ranks of the Gloo group at address ``group`` of the process of global ``rank``,
    sorted; ``()`` when what is read does not hold together (see the module's docstring)."""
    def u64(addr: int) -> int | None:
        raw = read(addr, 8)
        return struct.unpack("<Q", raw)[0] if len(raw) == 8 else None

    raw = read(group + off.rank, 8) if off.size == off.rank + 4 else b""
    if len(raw) != 8:
        return ()
    grank, size = struct.unpack("<ii", raw)
    if not 0 < size <= MAX_SIZE or not 0 <= grank < size:
        return ()
    opts = u64(group + off.options)
    if not opts:
        return ()
    begin, end = u64(opts + off.begin), u64(opts + off.begin + 8)
    if begin is None or end is None or end < begin:
        return ()
    if begin == end:
        # the default group (distributed_c10d sets no ranks on it): the whole job, when its size says so
        return tuple(range(size)) if size == world_size and grank == rank else ()
    if end - begin != 8 * size:
        return ()
    data = read(begin, end - begin)
    if len(data) != end - begin:
        return ()
    ranks = struct.unpack(f"<{size}Q", data)
    if ranks[grank] != rank or len(set(ranks)) != size or max(ranks) >= MAX_SIZE:
        return ()
    return tuple(sorted(ranks))


def proc_reader(pid: int, proc: str = "/proc") -> Reader:
    """Reads ``pid``'s memory (``/proc/PID/mem``); a read that fails gives ``b""``."""
    def read(addr: int, n: int) -> bytes:
        try:
            fd = os.open(f"{proc}/{pid}/mem", os.O_RDONLY)
        except OSError:
            return b""
        try:
            return os.pread(fd, n, addr)
        except (OSError, OverflowError, ValueError):
            return b""
        finally:
            os.close(fd)
    return read
