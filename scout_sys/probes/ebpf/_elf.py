"""Just enough ELF64 reading for uprobes: function symbols by regex, and code bytes at an address.

libtorch_cpu.so has ~440k dynamic symbols; matching the regex over the string table first and then
picking symbols by name offset keeps this well under a second (bcc's per-symbol Python callback
takes several).
"""

from __future__ import annotations

import mmap
import re
import struct

SHT_SYMTAB, SHT_DYNSYM = 2, 11
STT_FUNC, STT_GNU_IFUNC = 2, 10


class ElfError(Exception):
    pass


def _header(m: mmap.mmap) -> tuple[int, int, int, int, int]:
    if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
        raise ElfError("not a little-endian ELF64 file")
    phoff, shoff = struct.unpack_from("<QQ", m, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", m, 0x36)
    return phoff, phnum * phentsize and phentsize, phnum, shoff, shnum if shentsize == 64 else 0


def function_symbols(path: str, pattern: bytes) -> dict[str, int]:
    """Defined function symbols whose whole name matches ``pattern``: name -> address (st_value).

    Both .dynsym and .symtab are read (NCCL linked into libtorch_cuda.so may be in either).
    """
    # No look-behind: linkers merge string tails, so "ncclAllReduce" may start inside "pncclAllReduce".
    name_re = re.compile(rb"(" + pattern + rb")(?=\x00)")
    out: dict[str, int] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        _phoff, _phentsize, _phnum, shoff, shnum = _header(m)
        sections = [struct.unpack_from("<IIQQQQIIQQ", m, shoff + i * 64) for i in range(shnum)]
        for _name, sh_type, _fl, _addr, off, size, link, _info, _align, entsize in sections:
            if sh_type not in (SHT_SYMTAB, SHT_DYNSYM) or entsize != 24 or link >= len(sections):
                continue
            str_off, str_size = sections[link][4], sections[link][5]
            strtab = m[str_off:str_off + str_size]
            # every match, overlapping ones too: a symbol's name may be the tail of another matching one
            # ("ncclAllReduce" inside "pncclAllReduce"), which a scan resuming after each match skips
            wanted: dict[int, bytes] = {}
            pos = 0
            while (mt := name_re.search(strtab, pos)) is not None:
                wanted[mt.start(1)] = mt.group(1)
                pos = mt.start(1) + 1
            if not wanted:
                continue
            for st_name, st_info, _other, shndx, value, _size in struct.iter_unpack("<IBBHQQ", m[off:off + size]):
                if st_name in wanted and shndx != 0 and value and (st_info & 0xF) in (STT_FUNC, STT_GNU_IFUNC):
                    out.setdefault(wanted[st_name].decode(), value)
    return out


def read_code(path: str, vaddr: int, n: int) -> bytes:
    """``n`` bytes of the file at virtual address ``vaddr`` (through its PT_LOAD program headers)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        phoff, phentsize, phnum, _shoff, _shnum = _header(m)
        for i in range(phnum):
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
                "<IIQQQQ", m, phoff + i * phentsize)
            if p_type == 1 and p_vaddr <= vaddr < p_vaddr + p_filesz:
                start = p_offset + vaddr - p_vaddr
                return m[start:start + n]
    return b""
