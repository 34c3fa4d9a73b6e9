"""GPU telemetry. This machine has no NVIDIA driver: the real path must say so and stay out of the
way; the parsing and the hardware rules are tested through a stand-in for the driver's library
(the one boundary that cannot exist here), shaped like nvidia-ml-py's ``pynvml``."""

from __future__ import annotations

import types

from scout_sys.consensus import hardware
from scout_sys.model import HARDWARE, Job, Rank
from scout_sys.probes.nvml import NvmlProbe


def test_without_a_driver_the_probe_says_why():
    reason = NvmlProbe().check()
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        has_driver = True
    except Exception:
        has_driver = False
    if has_driver:
        assert reason is None
    else:
        assert reason and ("not present" in reason or "not installed" in reason)


def _fake_nvml(slow: set[int], ecc: dict[int, int]):
    nv = types.SimpleNamespace(NVML_TEMPERATURE_GPU=0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0)
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 4
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90 + h, memory=40)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2 << 30, total=80 << 30)
    nv.nvmlDeviceGetTemperature = lambda h, kind: 60 + h
    nv.nvmlDeviceGetPowerUsage = lambda h: 300_000
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x40 if h in slow else 0

    def _ecc(h, kind, counter):
        if h == 3:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return ecc.get(h, 0)

    nv.nvmlDeviceGetTotalEccErrors = _ecc
    return nv


def _gpu_job(n=4):
    return Job(ranks=tuple(Rank(rank=r, pid=100 + r, host="h", local_rank=r, device=f"cuda:{r}") for r in range(n)),
               world_size=n, launcher="torchrun", launcher_pid=1, host="h")


def test_samples_map_ranks_to_devices_and_unreadable_values_are_none():
    p = NvmlProbe(nvml=lambda: _fake_nvml(slow=set(), ecc={}))
    assert p.check() is None
    p.start(_gpu_job())
    samples = {s.rank: s for s in p.sample()}
    p.close()
    assert samples[2].index == 2 and samples[2].util_percent == 92 and samples[2].temperature_c == 62
    assert samples[2].power_w == 300.0 and samples[2].mem_total == 80 << 30
    assert samples[3].ecc_uncorrected is None and samples[0].ecc_uncorrected == 0


def test_cpu_only_jobs_have_nothing_to_sample():
    p = NvmlProbe(nvml=lambda: _fake_nvml(slow=set(), ecc={}))
    job = Job(ranks=(Rank(rank=0, pid=1, host="h"),), world_size=1, launcher="x", launcher_pid=None, host="h")
    try:
        p.start(job)
        raise AssertionError("expected ProbeUnavailable")
    except Exception as e:
        assert "no rank" in str(e)


def test_a_thermally_throttled_gpu_among_healthy_peers_is_named():
    p = NvmlProbe(nvml=lambda: _fake_nvml(slow={1}, ecc={}))
    job = _gpu_job()
    p.start(job)
    incidents = hardware.analyze(job, p.sample())
    assert [(i.kind, i.ranks) for i in incidents] == [(HARDWARE, (1,))]
    assert "hw-thermal" in incidents[0].summary


def test_uncorrected_ecc_errors_are_decisive():
    p = NvmlProbe(nvml=lambda: _fake_nvml(slow=set(), ecc={2: 3}))
    job = _gpu_job()
    p.start(job)
    incidents = hardware.analyze(job, p.sample())
    assert [(i.kind, i.ranks) for i in incidents] == [(HARDWARE, (2,))]


def test_every_gpu_throttled_is_common_mode_not_a_culprit():
    p = NvmlProbe(nvml=lambda: _fake_nvml(slow={0, 1, 2, 3}, ecc={}))
    job = _gpu_job()
    p.start(job)
    assert hardware.analyze(job, p.sample()) == []
