"""Issue 39: in an interleaved run, a row is flagged ``throttled`` only when its own blocks ran throttled; the run-wide
view stays in the row's environment. NVML is faked: its throttle reasons follow the batch size of the last step run."""

import time

import pytest

from perflab.measure import harness
from perflab.measure.energy import NvmlMonitor
from perflab.models import testing
from perflab.spec import Case

HOT_BATCH = 8  # the batch whose steps draw past the power limit, as the demo's bs64 cases did on an H100


class FakeNvml:
    """The pynvml calls NvmlMonitor makes. The GPU is power-capped (sw_power_cap, SM clock 1410 MHz) while the last step
    run was of the hot batch, else free (1980 MHz)."""

    NVML_CLOCK_SM = 1

    def __init__(self):
        self.last_batch = None

    @property
    def hot(self):
        return self.last_batch == HOT_BATCH

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 0x4 if self.hot else 0x0

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return 1410 if self.hot else 1980

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        raise RuntimeError("no energy counter on the fake")

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return []

    def nvmlSystemGetDriverVersion(self):
        return "fake"

    def nvmlDeviceGetName(self, handle):
        return "Fake GPU"

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1980

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return 700_000


def test_a_block_is_judged_by_the_readings_inside_it():
    nvml = FakeNvml()
    monitor = NvmlMonitor(nvml=nvml, handle=0, period_s=3600)  # the sampler never fires: its readings are made by hand
    monitor.begin()
    nvml.last_batch = HOT_BATCH
    monitor._sample()  # the sampler reads a throttle...
    since = time.perf_counter()  # ...before the block begins
    nvml.last_batch = 1
    reading = monitor.block_reading(since)
    assert (reading.reasons, reading.sm_clock_mhz_min, reading.readings) == ((), 1980, 1)
    since = time.perf_counter()
    nvml.last_batch = HOT_BATCH
    monitor._sample()  # the sampler reads a throttle inside this block, over by the block's end
    nvml.last_batch = 1
    reading = monitor.block_reading(since)
    assert (reading.reasons, reading.sm_clock_mhz_min, reading.sm_clock_mhz_max, reading.readings) == (("sw_power_cap",), 1410, 1980, 2)
    report = monitor.end()
    assert report.throttle_reasons == ["sw_power_cap"] and (report.sm_clock_mhz_min, report.sm_clock_mhz_max) == (1410, 1980)


def test_only_the_throttled_cases_rows_are_flagged_in_an_interleaved_run(monkeypatch):
    nvml = FakeNvml()
    forward = testing.Tiny.forward

    def recorded(self, x):
        nvml.last_batch = x.shape[0]
        return forward(self, x)

    monkeypatch.setattr(testing.Tiny, "forward", recorded)
    monkeypatch.setattr(harness, "open_monitor", lambda device: NvmlMonitor(nvml=nvml, handle=0, period_s=3600))
    fast = dict(device="cpu", input_size=32, warmup=1, iters=12, repeats=6)
    cool, hot = harness.run_cases([Case("test:tiny", batch_size=1, **fast), Case("test:tiny", batch_size=HOT_BATCH, **fast)])
    assert hot["interleaved"]["cases"] == 2 and hot["session"] == cool["session"]  # timed together, in one run
    assert "throttled" in hot["flags"] and "throttled" not in cool["flags"]
    assert "GPU clocks were throttled during 6 of this case's 6 timed blocks (sw_power_cap)" in hot["warnings"]
    assert (hot["throttled_blocks"], hot["read_blocks"], cool["throttled_blocks"], cool["read_blocks"]) == (6, 6, 0, 6)
    assert cool["sample_sm_clock_mhz"] == [1980] * 6 and hot["sample_sm_clock_mhz"] == [1410] * 6
    assert (cool["env"]["throttle_reasons"], cool["env"]["sm_clock_mhz_min"], cool["env"]["sm_clock_mhz_max"]) == ([], 1980, 1980)
    assert (hot["env"]["throttle_reasons"], hot["env"]["sm_clock_mhz_min"]) == (["sw_power_cap"], 1410)
    for row in (cool, hot):  # the run-wide view, as every row carried it before
        assert (row["env"]["run_throttle_reasons"], row["env"]["run_sm_clock_mhz_min"], row["env"]["run_sm_clock_mhz_max"]) == (
            ["sw_power_cap"], 1410, 1980)


def test_processes_merge_their_block_views():
    rows = [{"status": "ok", "samples_ms": [1.0, 1.0], "throttled_blocks": k, "reason_blocks": 2, "read_blocks": 2, "sample_sm_clock_mhz": clocks,
             "env": {"throttle_reasons": reasons, "sm_clock_mhz_min": min(clocks), "sm_clock_mhz_max": max(clocks),
                     "run_throttle_reasons": ["sw_power_cap"], "run_sm_clock_mhz_min": 1400, "run_sm_clock_mhz_max": 1980}}
            for k, clocks, reasons in ((0, [1980, 1980], []), (1, [1410, 1980], ["sw_power_cap"]))]
    row = dict(rows[0])
    harness._merge_gpu_views(row, rows)
    assert (row["throttled_blocks"], row["read_blocks"], row["sample_sm_clock_mhz"]) == (1, 4, [1980, 1980, 1410, 1980])
    assert row["reason_blocks"] == 4  # over both processes, as the blocks it counts among (it was the first process's 2)
    assert (row["env"]["throttle_reasons"], row["env"]["sm_clock_mhz_min"], row["env"]["run_sm_clock_mhz_min"]) == (["sw_power_cap"], 1410, 1400)
    assert rows[0]["env"]["throttle_reasons"] == []  # the process's own row is left as it was


def test_a_reason_set_at_full_clock_does_not_flag_a_block():
    """As the H100 read the demo's cases (2026-11-26): sw_power_cap set in every block, the bs1 cases' too, with the SM
    clock at 1890-1980 MHz of 1980: the power limiter engaged, the work not slowed. Only a fall past 5% marks a block,
    and a quarter of a case's blocks so marked flags the case."""
    from perflab.measure.energy import BlockReading, MonitorReport, case_view

    readings = [BlockReading(1965, 1980, ("sw_power_cap",), 2), BlockReading(1890, 1965, ("sw_power_cap",), 2),
                BlockReading(1980, 1980, (), 1), BlockReading(1410, 1980, ("sw_power_cap",), 2)]
    run = MonitorReport(throttle_reasons=["sw_power_cap"], sm_clock_mhz_min=1410, sm_clock_mhz_max=1980)
    own, blocks, run_view = case_view(run, readings[:3], max_sm_clock_mhz=1980)
    assert own.throttle_reasons == [] and (blocks["throttled_blocks"], blocks["reason_blocks"], blocks["read_blocks"]) == (0, 2, 3)
    own, blocks, _ = case_view(run, readings, max_sm_clock_mhz=1980)  # 1 of 4 blocks at 1410 MHz: a quarter
    assert own.throttle_reasons == ["sw_power_cap"] and blocks["throttled_blocks"] == 1
    own, blocks, _ = case_view(run, readings + readings[:1], max_sm_clock_mhz=1980)  # 1 of 5: not enough to move a median
    assert own.throttle_reasons == [] and blocks["throttled_blocks"] == 1
    own, blocks, _ = case_view(run, readings[:2])  # the maximum unknown: any reason counts
    assert blocks["throttled_blocks"] == 2 and run_view["run_throttle_reasons"] == ["sw_power_cap"]
