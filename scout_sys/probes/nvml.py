"""GPU telemetry per rank through NVML (nvidia-ml-py, module ``pynvml``).

One query function over the library with lazy init and shutdown at close (as nvitop's
``libnvml.py``); a value that cannot be read is ``None``, never an exception. On a machine without
the NVIDIA driver ``available()`` says so and the other probes go on ("GPU signals off").

Each rank's device comes from the job (``Rank.device``, ``cuda:N`` with CUDA_VISIBLE_DEVICES
applied, for ranks that mapped ``libcuda.so``); NVML indices are physical, like ``nvidia-smi``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from scout_sys.errors import ProbeUnavailable
from scout_sys.model import DeviceSample, Job
from scout_sys.probes import NO_CUDA_RANK, NO_NVIDIA_DRIVER, Health

# Clock-event reasons that mean the hardware slowed itself down (nvmlClocksEventReason*).
_HW_SLOWDOWN = 0x8  # HwSlowdown
_SW_THERMAL = 0x20  # SwThermalSlowdown
_HW_THERMAL = 0x40  # HwThermalSlowdown
_HW_POWER_BRAKE = 0x80  # HwPowerBrakeSlowdown


def _load() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


class NvmlProbe:
    name = "nvml"

    def __init__(self, nvml: Callable[[], Any] = _load) -> None:
        self._loader = nvml  # injectable at the driver boundary (tests have no NVIDIA driver)
        self._nv: Any = None
        self._handles: dict[int, tuple[int, int, Any]] = {}  # rank -> (pid, index, handle)

    def _init(self) -> Any:
        if self._nv is None:
            nv = self._loader()
            nv.nvmlInit()
            self._nv = nv
        return self._nv

    def check(self) -> str | None:
        """Whether the driver answers (init, count, shutdown: nothing stays open)."""
        try:
            nv = self._loader()
            nv.nvmlInit()
            try:
                nv.nvmlDeviceGetCount()
            finally:
                nv.nvmlShutdown()
        except ImportError:
            return "nvidia-ml-py is not installed"
        except Exception as e:  # noqa: BLE001 - NVMLError_* subclasses; their text is the reason
            return f"{NO_NVIDIA_DRIVER}{e}; no NVIDIA driver?)"
        return None

    def start(self, job: Job) -> None:
        nv = self._init()
        for r in job.ranks:
            if not r.device.startswith("cuda:"):
                continue
            try:
                idx = int(r.device.split(":", 1)[1])
                self._handles[r.rank] = (r.pid, idx, nv.nvmlDeviceGetHandleByIndex(idx))
            except Exception:  # noqa: BLE001 - a device we cannot open is simply not sampled
                continue
        if not self._handles:
            raise ProbeUnavailable(NO_CUDA_RANK)

    def _q(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nv, fn)(*args)
        except Exception:  # noqa: BLE001 - NA is a value
            return None

    def health(self) -> Health:
        return Health()

    def sample(self, now: float | None = None) -> list[DeviceSample]:
        out = []
        nv = self._nv
        for rank, (pid, idx, h) in self._handles.items():
            util = self._q("nvmlDeviceGetUtilizationRates", h)
            mem = self._q("nvmlDeviceGetMemoryInfo", h)
            temp = self._q("nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            power = self._q("nvmlDeviceGetPowerUsage", h)
            reasons = self._q("nvmlDeviceGetCurrentClocksEventReasons", h)
            if reasons is None:
                reasons = self._q("nvmlDeviceGetCurrentClocksThrottleReasons", h)
            ecc = self._q("nvmlDeviceGetTotalEccErrors", h, getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                          getattr(nv, "NVML_VOLATILE_ECC", 0))
            out.append(DeviceSample(
                time=time.time(), rank=rank, pid=pid, index=idx,
                util_percent=getattr(util, "gpu", None), mem_used=getattr(mem, "used", None),
                mem_total=getattr(mem, "total", None), temperature_c=temp,
                power_w=None if power is None else power / 1000.0,
                slowdown=_slowdown(reasons), ecc_uncorrected=ecc,
            ))
        return out

    def close(self) -> None:
        self._handles.clear()
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._nv = None


def _slowdown(reasons: int | None) -> str | None:
    if not reasons:
        return None
    names = [n for bit, n in ((_HW_SLOWDOWN, "hw-slowdown"), (_HW_THERMAL, "hw-thermal"),
                              (_SW_THERMAL, "sw-thermal"), (_HW_POWER_BRAKE, "power-brake")) if reasons & bit]
    return ",".join(names) or None
