"""GPU energy, clocks, throttling and other processes, through NVML (nvidia-ml-py).

Energy comes from NVML's total-energy counter (mJ since driver load), read right before and right after
the timed loop; mean power is that energy over the loop's wall time. A sampler thread polls clocks,
throttle reasons and power every 100 ms during the loop, so a throttle anywhere in the loop is seen; it
runs only between ``begin`` and ``end`` (the harness's host canaries run outside), and off the pinned
timing thread's core (``measure.pinning``).

Cases timed together in interleaved blocks share one loop, so the loop's readings are every case's. Each block
is also read on its own (``block_reading``: one read as it ends, a few µs, plus the sampler's readings that fell
inside it), and ``case_view`` gives a case the throttle reasons and clock range of its own blocks; the loop's view
stays beside it in the row's environment (``run_throttle_reasons``, ``run_sm_clock_mhz_min``/``max``).
Without NVML (no GPU, no driver, CPU runs) every reading is None and the reason is kept.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace

from perflab.measure.checks import slowed

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


@dataclass(frozen=True)
class BlockReading:
    """NVML's view of one timed block: the SM clock's range and the throttle reasons read while it ran."""

    sm_clock_mhz_min: int | None
    sm_clock_mhz_max: int | None
    reasons: tuple[str, ...]  # THROTTLE_REASONS' names, in their order
    readings: int  # how many NVML readings fell inside the block (its end's included)


def reason_names(bits: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if bits & bit]


THROTTLED_BLOCK_SHARE = 0.25  # a case is throttled when at least this share of its blocks were: enough to move its median


def case_view(run: MonitorReport, readings: list[BlockReading | None], max_sm_clock_mhz: int | None = None) -> tuple[MonitorReport, dict, dict]:
    """A case's own view of an interleaved run: ``run`` (the whole loop's readings, every case's blocks) with the throttle
    reasons and SM clock range read during this case's blocks instead; the row's fields of its blocks (how many ran
    throttled, of how many read, each block's lowest SM clock); and the run's view as environment fields (``run_*``).
    A block ran throttled where a reason was set and its clock fell (``slowed``); the case is, where a quarter of its
    blocks or more did (fewer cannot move its median); ``reason_blocks`` counts the blocks with any reason set.
    Without per-block readings (no NVML), the run's view unchanged and no fields."""
    have = [r for r in readings if r is not None and r.readings]
    if not have:
        return run, {}, {}
    lows = [r.sm_clock_mhz_min for r in have if r.sm_clock_mhz_min is not None]
    highs = [r.sm_clock_mhz_max for r in have if r.sm_clock_mhz_max is not None]
    throttled = [r for r in have if slowed(r.reasons, r.sm_clock_mhz_min, max_sm_clock_mhz)]
    names = {name for r in throttled for name in r.reasons} if len(throttled) >= THROTTLED_BLOCK_SHARE * len(have) else set()
    own = replace(run, throttle_reasons=[name for name in THROTTLE_REASONS.values() if name in names],
                  sm_clock_mhz_min=min(lows) if lows else None, sm_clock_mhz_max=max(highs) if highs else None)
    blocks = {"throttled_blocks": len(throttled), "read_blocks": len(have),
              "reason_blocks": sum(bool(r.reasons) for r in have),
              "sample_sm_clock_mhz": [r.sm_clock_mhz_min if r is not None else None for r in readings]}
    run_view = {"run_throttle_reasons": list(run.throttle_reasons), "run_sm_clock_mhz_min": run.sm_clock_mhz_min,
                "run_sm_clock_mhz_max": run.sm_clock_mhz_max}
    return own, blocks, run_view


class NullMonitor:
    """No NVML: says why, measures nothing."""

    def __init__(self, reason: str, expected: bool = False):
        self.reason = reason
        self.expected = expected

    def block_reading(self, since: float) -> None:
        return None

    def device_info(self) -> dict:
        return {}

    def begin(self) -> None:
        pass

    def end(self) -> MonitorReport:
        return MonitorReport(unavailable=self.reason, expected=self.expected)

    def energy_mj(self) -> None:
        return None


def nvml_handle(torch_device_index: int = 0):
    """(pynvml, the NVML handle of torch's device ``torch_device_index``), found by UUID so that CUDA_VISIBLE_DEVICES
    is respected; NVML initialised."""
    import pynvml

    from perflab.runtime.device import gpu_identity

    pynvml.nvmlInit()
    uuid = gpu_identity(torch_device_index).uuid
    try:
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError:
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch_device_index)


class NvmlMonitor:
    """NVML readings for the GPU torch uses (found by UUID, so CUDA_VISIBLE_DEVICES is respected)."""

    def __init__(self, torch_device_index: int = 0, period_s: float = 0.1, nvml=None, handle=None):
        """``nvml`` and ``handle``: an NVML module and a device handle to read instead of pynvml's for torch's device
        (tests give a fake one)."""
        if nvml is None:
            nvml, handle = nvml_handle(torch_device_index)
        self.nvml, self.handle = nvml, handle
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the sampler thread and the timing thread both read
        self._timeline: list[tuple[float, int | None, int | None]] = []  # (perf_counter, SM clock, reason bits)

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
        with self._lock:
            self._timeline.append((time.perf_counter(), clock, reasons))
            if clock is not None:
                self._clocks.append(clock)
            if reasons is not None:
                self._reason_bits |= reasons

    def block_reading(self, since: float) -> BlockReading:
        """The block that began at ``since`` (perf_counter) and has just ended: one reading now, and the sampler's
        readings since it began."""
        self._sample()
        clocks, bits, n = [], 0, 0
        with self._lock:
            for t, clock, reasons in reversed(self._timeline):
                if t < since:
                    break
                n += 1
                if clock is not None:
                    clocks.append(clock)
                bits |= reasons or 0
        return BlockReading(min(clocks) if clocks else None, max(clocks) if clocks else None, tuple(reason_names(bits)), n)

    def _poll(self) -> None:
        from perflab.measure.pinning import keep_off_timing_core

        keep_off_timing_core()  # started by the pinned timing thread: off its core
        while not self._stop.wait(self.period_s):
            self._sample()

    def begin(self) -> None:
        self._clocks: list[int] = []
        self._reason_bits = 0
        self._timeline = []
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
        report.throttle_reasons = reason_names(self._reason_bits)
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
