"""A Gloo group's members read from the rank's memory (probes/ebpf/glooranks.py): the offsets decoded
from torch's code, and what is read checked before it is believed."""

from __future__ import annotations

import struct

from scout_sys.probes.ebpf import glooranks

# torch 2.13's ProcessGroupGloo::groupRanks() const: mov rax,[rdi+0x98]; mov rsi,[rax+0x80]; cmp [rax+0x78],rsi
GROUP_RANKS = bytes.fromhex("488b8798000000" "488bb080000000" "48397078" "740c")
# Backend::Backend(int, int): ... movq [rdi+8],0; mov [rdi+0x10],esi; add rax,0x10; mov [rdi+0x14],edx
CTOR = bytes.fromhex("4155415455534889fb4883ec28488b0564931f0e" "48c7470800000000" "897710" "4883c010" "895714")
OFF = glooranks.GlooOffsets(options=0x98, begin=0x78, rank=0x10, size=0x14)


def test_offsets_from_torchs_code():
    assert glooranks.offsets(GROUP_RANKS, CTOR) == OFF
    assert glooranks.group_ranks_offsets(b"\x90" * 16) is None
    assert glooranks.rank_size_offsets(bytes.fromhex("897710" "895720")) is None  # size_ not right after rank_


def _memory(grank: int, size: int, ranks: list[int]) -> glooranks.Reader:
    pg, opts, vec = 0x1000, 0x2000, 0x3000
    mem = {pg + OFF.rank: struct.pack("<ii", grank, size), pg + OFF.options: struct.pack("<Q", opts),
           opts + OFF.begin: struct.pack("<Q", vec), opts + OFF.begin + 8: struct.pack("<Q", vec + 8 * len(ranks)),
           vec: struct.pack(f"<{len(ranks)}Q", *ranks)}
    return lambda addr, n: mem.get(addr, b"")[:n]


def test_members_of_a_sub_group_and_of_the_default_group():
    assert glooranks.members(_memory(1, 2, [1, 3]), 0x1000, OFF, rank=3, world_size=4) == (1, 3)
    # the default group lists no ranks: the whole job, when its size is the job's
    assert glooranks.members(_memory(2, 4, []), 0x1000, OFF, rank=2, world_size=4) == (0, 1, 2, 3)
    assert glooranks.members(_memory(0, 2, []), 0x1000, OFF, rank=0, world_size=4) == ()


def test_what_does_not_hold_together_is_not_believed():
    assert glooranks.members(_memory(0, 2, [1, 3]), 0x1000, OFF, rank=3, world_size=4) == ()  # not at its rank
    assert glooranks.members(_memory(0, 3, [3, 1]), 0x1000, OFF, rank=3, world_size=4) == ()  # size != count
    assert glooranks.members(_memory(5, 2, [3, 1]), 0x1000, OFF, rank=3, world_size=4) == ()  # rank >= size
    assert glooranks.members(lambda a, n: b"", 0x1000, OFF, rank=3, world_size=4) == ()  # unreadable
