"""NVML's utilization samples and GPM's utilization counters against a GPU busy share known by construction.

Each window runs a loop of period P: one spin kernel of D ms (``torch.cuda._sleep``, calibrated against CUDA events),
a synchronisation, then the host sleeps P - D. The kernel's own time by CUDA events over the window's wall time is the
truth; beside it, NVML's utilization samples that fall inside the window (``nvmlDeviceGetSamples``), and GPM's
graphics and SM utilization between two GPM samples taken at the window's edges (Hopper and later). Also prints the
NVML samples' spacing and whether their timestamps are on the host's wall clock.

    python benchmarks/gpu_busy_truth.py --window 2 --out busy_truth.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def spin_cycles_per_ms() -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", type=float, default=2.0, help="seconds per duty cycle")
    parser.add_argument("--period-ms", type=float, default=10.0)
    parser.add_argument("--duties", default="0.1,0.3,0.5,0.7,0.9,1.0")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from perflab.measure.gpu_busy import BusyMeter

    torch.cuda.init()
    cycles = spin_cycles_per_ms()
    meter = BusyMeter(torch.cuda.current_device())
    print("meter:", meter.describe())
    kind, raw = meter.nvml.nvmlDeviceGetSamples(meter.handle, meter.nvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    stamps = [int(s.timeStamp) for s in raw]
    print(f"NVML holds {len(raw)} utilization samples; the newest {stamps[-1] if stamps else None} us, host wall clock now "
          f"{int(time.time() * 1e6)} us; spacing {[b - a for a, b in zip(stamps[-6:], stamps[-5:])]} us")
    rows = []
    for duty in [float(x) for x in args.duties.split(",")]:
        busy_ms_each = duty * args.period_ms
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        kernel_ms = 0.0
        torch.cuda.synchronize()
        meter.start()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.window:
            start_ev.record()
            torch.cuda._sleep(int(busy_ms_each * cycles))
            end_ev.record()
            end_ev.synchronize()
            kernel_ms += start_ev.elapsed_time(end_ev)
            rest = args.period_ms - busy_ms_each
            if rest > 0:
                time.sleep(rest / 1000)
        wall_ms = (time.perf_counter() - t0) * 1000
        reading = meter.stop()
        truth = kernel_ms / wall_ms
        row = {"duty": duty, "truth": truth, **reading}
        rows.append(row)
        print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "period_ms": args.period_ms, "window_s": args.window, "rows": rows}, f, indent=1)
    errors = [abs(r["busy_share"] - r["truth"]) for r in rows if r.get("busy_share") is not None]
    if errors:
        print(f"largest |busy share - truth|: {max(errors):.3f}; median {statistics.median(errors):.3f}")


if __name__ == "__main__":
    main()
