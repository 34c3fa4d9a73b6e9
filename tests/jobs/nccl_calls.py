"""Calls the real libnccl.so.2 entry points through ctypes, without a GPU (each returns an error).

Prints "ready" once the library is loaded, waits for a line on stdin, then makes the calls listed in
CALLS (the test checks the probe saw exactly these arguments) and prints one return code per call.
The communicator is a zeroed buffer: NCCL rejects it (bad magic) before touching a device.
"""

from __future__ import annotations

import ctypes
import sys

COMM_BYTES = 16 << 20
# (function, args after the buffers) - see tests/test_ebpf_nccl.py for what the probe must report.
CALLS = [
    ("ncclAllReduce", "count=1234 datatype=7 op=2"),  # float32, max
    ("ncclBroadcast", "count=77 datatype=9 root=3"),  # bfloat16
    ("ncclAllGather", "count=4096 datatype=4"),  # int64
    ("ncclReduceScatter", "count=999 datatype=6 op=0"),  # float16, sum
    ("ncclReduce", "count=31 datatype=8 op=3 root=2"),  # float64, min
    ("ncclSend", "count=5 datatype=7 peer=1"),
]


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1])
    comm = ctypes.create_string_buffer(COMM_BYTES)
    c = ctypes.c_void_p(ctypes.addressof(comm))
    buf = ctypes.create_string_buffer(1 << 16)
    sb, rb = ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_void_p(ctypes.addressof(buf) + 32768)
    stream = ctypes.c_void_p(0)
    i64, i32 = ctypes.c_size_t, ctypes.c_int
    print("ready", ctypes.addressof(comm), flush=True)
    sys.stdin.readline()
    rcs = [
        lib.ncclAllReduce(sb, rb, i64(1234), i32(7), i32(2), c, stream),
        lib.ncclBroadcast(sb, rb, i64(77), i32(9), i32(3), c, stream),
        lib.ncclAllGather(sb, rb, i64(4096), i32(4), c, stream),
        lib.ncclReduceScatter(sb, rb, i64(999), i32(6), i32(0), c, stream),
        lib.ncclReduce(sb, rb, i64(31), i32(8), i32(3), i32(2), c, stream),
        lib.ncclSend(sb, i64(5), i32(7), i32(1), c, stream),
    ]
    lib.ncclGroupStart()
    lib.ncclGroupEnd()
    print(" ".join(map(str, rcs)), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
