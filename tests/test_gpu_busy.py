"""measure.gpu_busy: the GPU's busy share over a window, from GPM's two samples and NVML's utilization samples, read
through a fake NVML (the CPU has none): the window's figures, the samples that fall inside it, and why a reading is
missing."""

from __future__ import annotations

import time
import types

import pytest

from perflab.measure import gpu_busy
from perflab.measure.gpu_busy import BusyMeter


class FakeNvml(types.SimpleNamespace):
    """GPM's graphics and SM activity as given; NVML's utilization samples at ``period_us`` apart, each ``percent``,
    timestamped on the host's wall clock (as the driver's are)."""

    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_GRAPHICS_UTIL = 1
    NVML_GPM_METRIC_SM_UTIL = 2

    def __init__(self, graphics=61.0, sm=40.0, percent=60, period_us=100_000, gpm=True):
        super().__init__()
        self.graphics, self.sm, self.percent, self.period_us = graphics, sm, percent, period_us
        self.freed = []
        if gpm:
            self.nvmlGpmQueryDeviceSupport = lambda handle: types.SimpleNamespace(isSupportedDevice=1)
            self.nvmlGpmSampleAlloc = lambda: object()
            self.nvmlGpmSampleGet = lambda handle, sample: sample
            self.nvmlGpmSampleFree = self.freed.append

    def c_nvmlGpmMetricsGet_t(self):
        return types.SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                                     metrics=[types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(2)])

    def nvmlGpmMetricsGet(self, get):
        values = {self.NVML_GPM_METRIC_GRAPHICS_UTIL: self.graphics, self.NVML_GPM_METRIC_SM_UTIL: self.sm}
        for metric in get.metrics:
            metric.value = values[metric.metricId]
        return get

    def nvmlDeviceGetSamples(self, handle, kind, since_us):
        now = int(time.time() * 1e6)
        stamps = range(now - 20 * self.period_us, now + 1, self.period_us)
        return 1, [types.SimpleNamespace(timeStamp=t, sampleValue=types.SimpleNamespace(uiVal=self.percent)) for t in stamps if t > since_us]


def test_gpm_over_a_long_enough_window_is_the_busy_share_and_nvml_samples_inside_it_are_its_check(monkeypatch):
    monkeypatch.setattr(gpu_busy, "MIN_GPM_WINDOW_S", 0.3)
    meter = BusyMeter(nvml=FakeNvml(graphics=61.0, sm=40.0, percent=58, period_us=50_000), handle="gpu0")
    meter.start()
    time.sleep(0.35)
    reading = meter.stop()
    assert reading["busy_share"] == pytest.approx(0.61) and reading["gpm_sm_util"] == pytest.approx(0.40)
    assert reading["busy_source"].startswith("GPM")
    # the samples taken inside the 0.35 s window, 50 ms apart: 6 or 7 of them, each 58%
    assert 5 <= reading["nvml_samples"] <= 8 and reading["nvml_util"] == pytest.approx(0.58)
    assert reading["nvml_sample_period_ms"] == pytest.approx(50.0)
    assert reading["why"] is None and len(meter.nvml.freed) == 2  # both GPM samples given back


def test_a_window_too_short_for_gpm_or_nvml_gives_no_share_and_says_why(monkeypatch):
    monkeypatch.setattr(gpu_busy, "MIN_GPM_WINDOW_S", 1.0)
    meter = BusyMeter(nvml=FakeNvml(period_us=200_000), handle="gpu0")
    meter.start()
    time.sleep(0.05)
    reading = meter.stop()
    assert reading["busy_share"] is None and reading["gpm_graphics_util"] is None
    assert "needs 1 s or more (raise --steps)" in reading["why"]["gpm"]
    assert "of NVML's utilization samples fell inside the" in reading["why"]["nvml"]
    assert reading["gpm_short_window"]["gpm_graphics_util"] == pytest.approx(0.61)  # kept, not used


def test_without_gpm_nvml_samples_are_the_share():
    meter = BusyMeter(nvml=FakeNvml(gpm=False, percent=30, period_us=20_000), handle="gpu0")
    assert "no GPM" in meter.describe()["gpm"]
    meter.start()
    time.sleep(0.12)
    reading = meter.stop()
    assert reading["busy_share"] == pytest.approx(0.30) and reading["busy_source"].startswith("NVML's utilization samples")
    assert "no GPM" in reading["why"]["gpm"]


def test_on_the_cpu_there_is_no_meter_and_one_line_says_why():
    meter, why = gpu_busy.open_busy_meter("cpu")
    assert meter is None and "NVIDIA GPUs only" in why
