"""GPU energy, clocks, throttling and other processes, through NVML (nvidia-ml-py).

Energy comes from NVML's total-energy counter (mJ since driver load), read right before and right after
the timed loop; mean power is that energy over the loop's wall time. A sampler thread polls clocks,
throttle reasons and power every 100 ms during the loop, so a throttle anywhere in the loop is seen; it
runs only between ``begin`` and ``end`` (the harness's host canaries run outside), and off the pinned
timing thread's core (``measure.pinning``).
Without NVML (no GPU, no driver, CPU runs) every reading is None and the reason is kept.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

# Throttle ("clocks event") reason bits from nvml.h. Idle, application clocks, sync boost and display
# clock settings are not slowdowns; the rest mean the clocks were held down by power or heat.
THROTTLE_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


@dataclass
class MonitorReport:
    energy_j: float | None = None
    power_w: float | None = None
    sm_clock_mhz_end: int | None = None
    sm_clock_mhz_min: int | None = None
    sm_clock_mhz_max: int | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    other_processes: list[int] = field(default_factory=list)
    samples: int = 0
    unavailable: str | None = None  # why there are no readings
    expected: bool = False  # none were to be had (no power meter on this device): not a warning


class NullMonitor:
    """No NVML: says why, measures nothing."""

    def __init__(self, reason: str, expected: bool = False):
        self.reason = reason
        self.expected = expected

    def device_info(self) -> dict:
        return {}

    def begin(self) -> None:
        pass

    def end(self) -> MonitorReport:
        return MonitorReport(unavailable=self.reason, expected=self.expected)

    def energy_mj(self) -> None:
        return None


class NvmlMonitor:
    """NVML readings for the GPU torch uses (found by UUID, so CUDA_VISIBLE_DEVICES is respected)."""

    def __init__(self, torch_device_index: int = 0, period_s: float = 0.1):
        import pynvml
        import torch

        self.nvml = pynvml
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(torch_device_index).uuid)
        uuid = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
        try:
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except pynvml.NVMLError:
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(torch_device_index)
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def device_info(self) -> dict:
        nv = self.nvml
        info = {"driver": _str(nv.nvmlSystemGetDriverVersion()), "nvml_name": _str(nv.nvmlDeviceGetName(self.handle))}
        info["max_sm_clock_mhz"] = _try(lambda: nv.nvmlDeviceGetMaxClockInfo(self.handle, nv.NVML_CLOCK_SM))
        info["power_limit_w"] = _try(lambda: nv.nvmlDeviceGetPowerManagementLimit(self.handle) / 1000.0)
        return info

    def energy_mj(self) -> int | None:
        """NVML's total-energy counter now, mJ (None where it cannot be read); interleaved blocks read it at each end."""
        return _try(lambda: self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def _reasons(self) -> int | None:
        nv = self.nvml
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return _try(lambda: getter(self.handle))

    def _sm_clock(self) -> int | None:
        return _try(lambda: self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))

    def _sample(self) -> None:
        clock, reasons = self._sm_clock(), self._reasons()
        if clock is not None:
            self._clocks.append(clock)
        if reasons is not None:
            self._reason_bits |= reasons

    def _poll(self) -> None:
        from perflab.measure.pinning import keep_off_timing_core

        keep_off_timing_core()  # started by the pinned timing thread: off its core
        while not self._stop.wait(self.period_s):
            self._sample()

    def begin(self) -> None:
        self._clocks: list[int] = []
        self._reason_bits = 0
        self._energy0 = self.energy_mj()
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="perflab-nvml", daemon=True)
        self._thread.start()

    def end(self) -> MonitorReport:
        t1 = time.perf_counter()
        energy1 = self.energy_mj()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()  # one reading at the end, as the environment reports it
        report = MonitorReport(samples=len(self._clocks))
        if self._energy0 is not None and energy1 is not None and energy1 > self._energy0:
            report.energy_j = (energy1 - self._energy0) / 1000.0
            report.power_w = report.energy_j / (t1 - self._t0)
        elif self._energy0 is None:
            report.unavailable = "NVML has no total-energy counter for this GPU"
        else:
            report.unavailable = "the energy counter did not advance during the timed loop (too short to measure)"
        if self._clocks:
            report.sm_clock_mhz_end = self._clocks[-1]
            report.sm_clock_mhz_min = min(self._clocks)
            report.sm_clock_mhz_max = max(self._clocks)
        report.throttle_reasons = [name for bit, name in THROTTLE_REASONS.items() if self._reason_bits & bit]
        report.other_processes = self._other_processes()
        return report

    def _other_processes(self) -> list[int]:
        procs = _try(lambda: self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)) or []
        pids = [p.pid for p in procs]
        others = [pid for pid in pids if pid != os.getpid()]
        # In a PID namespace (containers) NVML reports host PIDs, so our own process shows up under
        # another number; a single process on the GPU while we hold memory there is us.
        if len(pids) == 1 and others:
            return []
        return others


def open_monitor(device: str, torch_device_index: int = 0):
    """An NvmlMonitor for CUDA runs where NVML works, else a NullMonitor that says why."""
    if device != "cuda":
        return NullMonitor("power and energy are measured on NVIDIA GPUs only (this run is on the CPU)", expected=True)
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return NullMonitor("nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        return NvmlMonitor(torch_device_index)
    except Exception as exc:  # NVMLError_LibraryNotFound, driver mismatch, ...
        return NullMonitor(f"NVML is not usable here ({type(exc).__name__}: {exc})")


def _try(fn):
    try:
        return fn()
    except Exception:
        return None


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
