"""The GPU's busy share over a window of steps, with no profiler attached: what a host-bound program's verdict rests on
(a profiler slows exactly the host such a program is limited by, so its traced steps always run inflated).

Two independent readings of the same window, each read at its edges only (nothing runs inside the program's steps):

- **GPM** (GPU Performance Monitoring, Hopper and later): two GPM samples, one at each edge of the window, and the
  graphics engine's activity between them (``NVML_GPM_METRIC_GRAPHICS_UTIL``: the share of time any compute work was
  active on the GPU) and the SMs' (``NVML_GPM_METRIC_SM_UTIL``: the share of SMs busy). Exactly the window.
- **NVML's utilization samples** (``nvmlDeviceGetSamples``): the driver's own sampler, each sample the share of its
  period in which a kernel ran; those whose timestamps fall inside the window are averaged. Its period is the
  driver's (tens to hundreds of ms), so a short window holds few samples: fewer than ``MIN_NVML_SAMPLES`` give no figure.

``busy_share`` is GPM's graphics activity where GPM works, else NVML's samples' mean; ``busy_source`` says which, and
``why`` says why a reading is missing. Every reading is a fraction (0..1).
"""

from __future__ import annotations

import time

MIN_NVML_SAMPLES = 3  # fewer samples inside the window: their periods reach outside it too far to be its figure
# GPM over a shorter window reads low: against a known duty cycle on an H200, 2 s windows were within 2.5 points,
# 0.4 s windows 4-6 points low, and a 0.075 s window of a launch-bound loop read 0% (docs/performance/run.md)
MIN_GPM_WINDOW_S = 1.0
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class BusyMeter:
    """``start()`` at the window's first edge, ``stop()`` at its last: the GPU's busy share in between."""

    def __init__(self, torch_device_index: int = 0, nvml=None, handle=None):
        """``nvml`` and ``handle``: an NVML module and device handle to read instead of pynvml's (tests give fakes)."""
        if nvml is None:
            from perflab.measure.energy import nvml_handle

            nvml, handle = nvml_handle(torch_device_index)
        self.nvml, self.handle = nvml, handle
        self.gpm_why = self._gpm_support()
        self.nvml_why = None if hasattr(nvml, "nvmlDeviceGetSamples") else "this NVML has no nvmlDeviceGetSamples"
        self._gpm_first = None
        self._t0_us = None
        self._t0 = None

    def _gpm_support(self) -> str | None:
        nv = self.nvml
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            return "this NVML has no GPM (nvidia-ml-py >= 12.520 and a Hopper or later GPU)"
        try:
            if not nv.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
                return "GPM is not supported on this GPU (Hopper or later)"
        except Exception as exc:
            return f"GPM could not be queried ({type(exc).__name__}: {exc})"
        return None

    def describe(self) -> dict:
        return {"gpm": self.gpm_why or "supported", "nvml_samples": self.nvml_why or "supported"}

    def start(self) -> None:
        # the GPM sample first, then the window's clocks: a sample takes a while to return, and the host's window (the
        # step stamp taken just after) should begin as close to the counters' snapshot as it can
        t = time.perf_counter()
        self._gpm_first = self._gpm_sample() if self.gpm_why is None else None
        self.sample_ms = [(time.perf_counter() - t) * 1e3]
        self._t0 = time.perf_counter()
        self._t0_us = int(time.time() * 1e6)

    def _gpm_sample(self):
        nv = self.nvml
        try:
            sample = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(self.handle, sample)
            return sample
        except Exception as exc:
            self.gpm_why = f"a GPM sample could not be taken ({type(exc).__name__}: {exc})"
            return None

    def stop(self) -> dict:
        """The readings over the window since ``start()``."""
        if self._t0 is None:
            raise RuntimeError("BusyMeter.stop() before start()")
        window_s = time.perf_counter() - self._t0
        t1_us = int(time.time() * 1e6)
        out = {"window_s": window_s, "gpm_graphics_util": None, "gpm_sm_util": None, "nvml_util": None, "nvml_samples": 0,
               "nvml_sample_period_ms": None}
        if self._gpm_first is not None:
            t = time.perf_counter()
            second = self._gpm_sample()
            self.sample_ms.append((time.perf_counter() - t) * 1e3)
            out["gpm_sample_ms"] = list(self.sample_ms)
            if second is not None:
                metrics = self._gpm_metrics(self._gpm_first, second)
                if window_s >= MIN_GPM_WINDOW_S:
                    out.update(metrics)
                elif metrics:
                    out["gpm_short_window"] = metrics  # kept, not used
                    self.gpm_why = (f"the timed steps took {window_s:.2f} s, and GPM's figure needs {MIN_GPM_WINDOW_S:g} s or more "
                                    "(raise --steps)")
            self._free(self._gpm_first, second)
        out.update(self._nvml_samples(self._t0_us, t1_us))
        why = {}
        if out["gpm_graphics_util"] is None:
            why["gpm"] = self.gpm_why or "no GPM reading"
        if out["nvml_util"] is None:
            why["nvml"] = self.nvml_why or (f"{out['nvml_samples']} of NVML's utilization samples fell inside the {window_s:.2f} s window "
                                            f"(at least {MIN_NVML_SAMPLES}: its sampling period is the driver's)")
        if out["gpm_graphics_util"] is not None:
            out.update(busy_share=out["gpm_graphics_util"], busy_source="GPM (graphics engine activity between two samples at the window's edges)")
        elif out["nvml_util"] is not None:
            out.update(busy_share=out["nvml_util"], busy_source=f"NVML's utilization samples inside the window ({out['nvml_samples']})")
        else:
            out.update(busy_share=None, busy_source=None)
        out["why"] = why or None
        self._t0 = None
        return out

    def _gpm_metrics(self, first, second) -> dict:
        nv = self.nvml
        try:
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version = nv.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = 2
            get.sample1, get.sample2 = first, second
            get.metrics[0].metricId = nv.NVML_GPM_METRIC_GRAPHICS_UTIL
            get.metrics[1].metricId = nv.NVML_GPM_METRIC_SM_UTIL
            nv.nvmlGpmMetricsGet(get)
            values = [get.metrics[i].value / 100.0 if get.metrics[i].nvmlReturn == 0 else None for i in range(2)]
        except Exception as exc:
            self.gpm_why = f"GPM's metrics could not be read ({type(exc).__name__}: {exc})"
            return {}
        return {"gpm_graphics_util": values[0], "gpm_sm_util": values[1]}

    def _free(self, *samples) -> None:
        for sample in samples:
            if sample is not None:
                try:
                    self.nvml.nvmlGpmSampleFree(sample)
                except Exception:
                    pass

    def _nvml_samples(self, t0_us: int, t1_us: int) -> dict:
        if self.nvml_why is not None:
            return {}
        nv = self.nvml
        try:
            kind, samples = nv.nvmlDeviceGetSamples(self.handle, nv.NVML_GPU_UTILIZATION_SAMPLES, t0_us)
        except Exception as exc:  # NVML_ERROR_NOT_FOUND: no sample newer than t0 yet
            if "Not Found" not in str(exc):
                self.nvml_why = f"NVML's utilization samples could not be read ({type(exc).__name__}: {exc})"
            return {}
        field = _VALUE_FIELDS.get(int(kind), "uiVal")
        inside = sorted((int(s.timeStamp), float(getattr(s.sampleValue, field))) for s in samples if t0_us < int(s.timeStamp) <= t1_us)
        out = {"nvml_samples": len(inside)}
        if len(inside) >= 2:
            gaps = [b[0] - a[0] for a, b in zip(inside, inside[1:])]
            out["nvml_sample_period_ms"] = sorted(gaps)[len(gaps) // 2] / 1000.0
        if len(inside) >= MIN_NVML_SAMPLES:
            out["nvml_util"] = sum(v for _, v in inside) / len(inside) / 100.0
        return out


def open_busy_meter(device: str, torch_device_index: int = 0) -> tuple[BusyMeter | None, str | None]:
    """(a BusyMeter for torch's CUDA device, None) where NVML works, else (None, why not)."""
    if device != "cuda":
        return None, "the GPU's busy share is read on NVIDIA GPUs only (this run is on the CPU)"
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py): no GPU busy share without a trace"
    try:
        return BusyMeter(torch_device_index), None
    except Exception as exc:
        return None, f"NVML is not usable here ({type(exc).__name__}: {exc}): no GPU busy share without a trace"
