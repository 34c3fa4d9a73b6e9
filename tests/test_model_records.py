"""The probes' records (model_records.py): what a collective's fingerprint compares and says, how an
exit is told, and the JSON of the NVML and replay records, on records built by hand."""

from __future__ import annotations

import pytest

from scout_sys import model
from scout_sys.model_records import (
    CollectiveSample,
    DeviceRound,
    DeviceSample,
    ExitRecord,
    Fingerprint,
    KernelResult,
    OomRecord,
    ProcessGroupSample,
    SchedSample,
    SignalRecord,
    ThreadSched,
)


def test_the_model_re_exports_the_records() -> None:
    assert (model.Fingerprint, model.ExitRecord, model.DeviceRound) == (Fingerprint, ExitRecord, DeviceRound)


def test_a_fingerprint_key_is_what_every_rank_must_agree_on_at_one_position() -> None:
    f = Fingerprint(seq=3, op="allreduce", time=1.5, count=1024, dtype="float32", redop="sum", root=None, ntensors=1)
    assert f.key() == ("allreduce", 1024, "float32", "sum")
    # when and how many tensors do not count; the root of a broadcast is not part of the key either
    same = Fingerprint(seq=3, op="allreduce", time=9.0, count=1024, dtype="float32", redop="sum", root=2, ntensors=2)
    assert same.key() == f.key()
    assert Fingerprint(seq=3, op="allreduce", time=1.5, count=1023, dtype="float32", redop="sum").key() != f.key()


def test_a_fingerprint_describes_itself_with_what_could_be_read() -> None:
    assert Fingerprint(3, "allreduce", 1.5, 1024, "float32", "sum").describe() == "#3 allreduce 1024 x float32 sum"
    assert Fingerprint(1, "broadcast", 1.5, 8, None, None, root=0).describe() == "#1 broadcast 8 x ?"
    assert Fingerprint(7, "barrier", 1.5).describe() == "#7 barrier"
    assert Fingerprint(2, "allreduce", 1.5, None, "float32", "max").describe() == "#2 allreduce max"
    assert Fingerprint(4, "allgather", 1.5, 0, "int64").describe() == "#4 allgather 0 x int64"


def test_a_fingerprint_in_json_leaves_out_what_is_unknown_and_rounds_its_time() -> None:
    f = Fingerprint(3, "broadcast", 1700000000.12345678, 16, "float16", None, root=0, ntensors=1)
    assert f.to_json() == {"seq": 3, "op": "broadcast", "time": 1700000000.123457, "count": 16,
                           "dtype": "float16", "root": 0}
    assert Fingerprint(1, "barrier", 2.0).to_json() == {"seq": 1, "op": "barrier", "time": 2.0}


def test_a_sched_sample_finds_its_main_thread_by_the_process_pid() -> None:
    worker = ThreadSched(tid=101, comm="gloo", on_cpu_ns=5, off_cpu_ns=9, switches=3, involuntary=1, state="S",
                         last_switch=1.0)
    main = ThreadSched(tid=100, comm="python", on_cpu_ns=7, off_cpu_ns=1, switches=2, involuntary=0,
                       state="running", last_switch=None)
    s = SchedSample(time=1.0, rank=0, pid=100, threads=(worker, main))
    assert s.main() == main
    assert SchedSample(time=1.0, rank=0, pid=100, threads=(worker,)).main() is None
    assert (s.lost, s.source) == (0, "ebpf")


@pytest.mark.parametrize(("code", "sig", "core", "text"), [
    (None, 9, False, "killed by SIGKILL"),
    (None, 11, True, "killed by SIGSEGV (core dumped)"),
    (None, 200, False, "killed by signal 200"),
    (0, None, False, "exited with code 0"),
    (3, 0, False, "exited with code 3"),  # signal 0 is no signal
    (None, None, False, "exited (status unknown)"),
    (None, None, True, "exited (status unknown)"),
])
def test_an_exit_is_told_by_its_signal_then_its_code(code: int | None, sig: int | None, core: bool,
                                                     text: str) -> None:
    assert ExitRecord(time=1.0, rank=2, pid=100, exit_code=code, signal=sig, core_dumped=core).describe() == text


def test_a_device_sample_in_json_keeps_zero_readings_and_leaves_out_unreadable_ones() -> None:
    d = DeviceSample(time=1.0, rank=0, pid=100, index=3, util_percent=0, mem_used=0, mem_total=80 << 30,
                     temperature_c=None, power_w=71.5, slowdown=None, ecc_uncorrected=0)
    assert d.to_json() == {"index": 3, "util_percent": 0, "mem_used": 0, "mem_total": 80 << 30, "power_w": 71.5,
                           "ecc_uncorrected": 0}
    assert DeviceSample(time=1.0, rank=0, pid=100, index=0).to_json() == {"index": 0}
    full = DeviceSample(1.0, 0, 100, 1, 97, 1, 2, 64, 610.5, "hw-slowdown,hw-thermal", 2)
    assert list(full.to_json()) == ["index", "util_percent", "mem_used", "mem_total", "temperature_c", "power_w",
                                    "slowdown", "ecc_uncorrected"]
    assert full.source == "nvml"


def test_a_kernel_result_in_json_rounds_its_seconds() -> None:
    assert KernelResult("ab12", 0.12345678).to_json() == {"digest": "ab12", "seconds": 0.123457, "stable": True}
    assert KernelResult("ab12", 2.0, stable=False).to_json() == {"digest": "ab12", "seconds": 2.0, "stable": False}


def test_a_device_round_in_json_sorts_its_kernels_and_adds_error_and_context_only_when_set() -> None:
    r = DeviceRound("cuda:3", (6, 7), "NVIDIA H100 torch 2.5",
                    kernels={"softmax": KernelResult("s", 0.5), "gemm": KernelResult("g", 1.25, False)},
                    info={"torch": "2.5.1", "capability": "9.0"})
    out = r.to_json()
    assert out == {"device": "cuda:3", "ranks": [6, 7], "peer_kind": "NVIDIA H100 torch 2.5",
                   "kernels": {"gemm": {"digest": "g", "seconds": 1.25, "stable": False},
                               "softmax": {"digest": "s", "seconds": 0.5, "stable": True}},
                   "context": {"torch": "2.5.1", "capability": "9.0"}}
    assert list(out["kernels"]) == ["gemm", "softmax"]
    assert out["context"] is not r.info  # a copy: the record stays as it was
    failed = DeviceRound("cpu/rank0", (0,), "cpu:x", error="worker died: exit 1")
    assert failed.to_json() == {"device": "cpu/rank0", "ranks": [0], "peer_kind": "cpu:x", "kernels": {},
                                "error": "worker died: exit 1"}


def test_two_rounds_of_one_device_are_equal_whatever_their_kernels_and_context() -> None:
    a = DeviceRound("cuda:0", (0,), "k", kernels={"gemm": KernelResult("x", 1.0)}, info={"torch": "2.5"})
    b = DeviceRound("cuda:0", (0,), "k", kernels={"gemm": KernelResult("y", 9.0)})
    assert a == b and hash(a) == hash(b)
    assert a != DeviceRound("cuda:0", (0,), "k", error="boom")
    assert a != DeviceRound("cuda:1", (0,), "k")


def test_the_records_name_their_probe_by_default() -> None:
    sig = SignalRecord(time=2.0, rank=1, pid=100, signal=15, signal_name="SIGTERM", sender_pid=1, sender_comm="bash",
                       code=0, result=0)
    assert (sig.count, sig.first_time, sig.source) == (1, 0.0, "ebpf")
    oom = OomRecord(time=1.0, rank=1, pid=100)
    assert (oom.total_vm_kb, oom.anon_rss_kb, oom.source) == (None, None, "ebpf")
    cs = CollectiveSample(time=1.0, rank=0, pid=100, backend="gloo", group="gloo:0", seq=4, completed=3,
                          inside=True, last_enter=0.5, last_exit=0.4, last=None)
    assert (cs.recent, cs.p2p, cs.waiting_peer, cs.members, cs.source) == ((), 0, None, (), "ebpf")
    pg = ProcessGroupSample(time=1.0, groups=((0, 1), (2, 3)))
    assert (pg.rank, pg.source, pg.partial, pg.handles, pg.seqs, pg.latest) == (-1, "procfs", (), (), (), ())
