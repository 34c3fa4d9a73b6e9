"""Reading a probe's BPF maps (BccProbe.entries): one batch syscall where the kernel has it, bcc's
per-key walk where it fails, and the same entries either way. A real map in the kernel (root, bcc,
kernel headers; skipped with the reason otherwise); no job is started."""

from __future__ import annotations

import pytest

from scout_sys.probes.ebpf._common import BccProbe, load_bcc
from tests._ebpf_jobs import ebpf_skip_reason

REASON = ebpf_skip_reason()
pytestmark = [pytest.mark.ebpf, pytest.mark.skipif(REASON is not None, reason=f"eBPF unavailable: {REASON}")]

PROGRAM = """
struct k { u32 tgid; u64 group; };
struct v { u64 seq; u64 ns; };
BPF_HASH(plain, u32, u64, 64);
BPF_HASH(structs, struct k, struct v, 64);
BPF_HASH(empty, u32, u64, 64);
BPF_ARRAY(lost, u64, 1);
"""


@pytest.fixture(scope="module")
def probe() -> BccProbe:
    bcc, _ = load_bcc()
    assert bcc is not None
    p = BccProbe()
    p._bpf = bcc.BPF(text=PROGRAM.encode())
    plain, structs = p._bpf[b"plain"], p._bpf[b"structs"]
    for i in range(40):
        plain[plain.Key(1000 + i)] = plain.Leaf(i * i)
        structs[structs.Key(tgid=1000 + i, group=7 * i)] = structs.Leaf(seq=i, ns=10 * i)
    p._bpf[b"lost"][0] = p._bpf[b"lost"].Leaf(3)
    yield p
    p.close()


def _as_values(items: list) -> tuple[dict, dict]:
    return ({k.value: v.value for k, v in items if hasattr(k, "value")},
            {(k.tgid, k.group): (v.seq, v.ns) for k, v in items if hasattr(k, "tgid")})


def test_batch_read_gives_what_the_walk_gives(probe: BccProbe) -> None:
    for name in ("plain", "structs"):
        walked = probe._bpf[name.encode()].items()
        assert len(walked) == 40
        assert probe._batch
        batched = probe.entries(name)
        assert probe._batch, "BPF_MAP_LOOKUP_BATCH failed on this kernel (>= 5.6 has it)"
        assert _as_values(batched) == _as_values(walked)
    assert probe.entries("empty") == [] and probe._batch
    assert probe.lost() == 3


def test_the_walk_when_batch_reads_fail(probe: BccProbe, monkeypatch: pytest.MonkeyPatch) -> None:
    table_type = type(probe._bpf[b"plain"])
    calls = []

    def refuse(self):  # what bcc raises on a kernel without the batch commands
        calls.append(self)
        raise Exception("BPF_MAP_LOOKUP_BATCH has failed: Invalid argument")
        yield

    monkeypatch.setattr(table_type, "items_lookup_batch", refuse)
    monkeypatch.setattr(probe, "_batch", True)
    expected = _as_values(probe._bpf[b"plain"].items())
    assert _as_values(probe.entries("plain")) == expected
    assert not probe._batch
    assert _as_values(probe.entries("plain")) == expected
    assert len(calls) == 1, "a failed batch read is not tried again every poll"
