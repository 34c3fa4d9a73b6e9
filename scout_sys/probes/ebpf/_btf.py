"""Member offsets of kernel structs from the running kernel's BTF (/sys/kernel/btf/vmlinux).

bcc compiles against kernel headers, which may be of another kernel (see scripts/setup-ebpf.sh), so
the one task_struct field we read is located through BTF instead and passed in as a constant.
"""

from __future__ import annotations

import struct
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")

# Bytes that follow struct btf_type (12 bytes) per kind; vlen-dependent kinds are per member.
_FIXED = {1: 4, 2: 0, 3: 12, 7: 0, 8: 0, 9: 0, 10: 0, 11: 0, 12: 0, 14: 4, 16: 0, 17: 4, 18: 0}
_PER_MEMBER = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}
STRUCT = 4


def member_offset(struct_name: str, member: str, path: Path = VMLINUX) -> int | None:
    """Byte offset of ``struct_name.member`` (a direct member), or None when it cannot be found."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < 24 or struct.unpack_from("<H", data, 0)[0] != 0xEB9F:
        return None
    hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<IIIII", data, 4)
    types = hdr_len + type_off
    strings = data[hdr_len + str_off:hdr_len + str_off + str_len]

    def name(off: int) -> bytes:
        end = strings.find(b"\0", off)
        return strings[off:end]

    want_struct, want_member = struct_name.encode(), member.encode()
    pos, end = types, types + type_len
    while pos + 12 <= end:
        name_off, info, _size = struct.unpack_from("<III", data, pos)
        kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        pos += 12
        if kind in _PER_MEMBER:
            if kind == STRUCT and name(name_off) == want_struct:
                for i in range(vlen):
                    m_name, _m_type, m_off = struct.unpack_from("<III", data, pos + 12 * i)
                    if name(m_name) == want_member:
                        bits = m_off & 0xFFFFFF if kflag else m_off
                        return bits // 8 if bits % 8 == 0 else None
            pos += _PER_MEMBER[kind] * vlen
        elif kind in _FIXED:
            pos += _FIXED[kind]
        else:
            return None  # an unknown kind: we cannot walk past it
    return None
