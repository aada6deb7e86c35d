"""Floors: the least time one step could take if it were limited by one thing only.

- compute floor = FLOPs per step ÷ the measured peak matmul rate for the dtype;
- memory floor  = (weight bytes + minimal activation traffic) ÷ the measured copy bandwidth;
- launch floor  = kernels per step × the measured minimal kernel interval (tiny kernels replayed from
  a CUDA graph: launch overhead removed, so this is what each kernel costs the GPU at the least);
- host floor    = the CPU time to issue one step (from the trace: step start to the last launch call's end).

The binding floor is the largest. The verdict names what limits the step:
  host floor largest    → launch-bound: the GPU waits for the CPU to issue kernels;
  launch floor largest  → latency-bound small kernels: many kernels, each too short to fill the GPU;
  compute floor largest → compute-bound;  memory floor largest → memory-bound.
measured ÷ floor says how far the step is from each bound (1.0 = at the floor).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

VERDICTS = {
    "host": "launch-bound",
    "launch": "latency-bound small kernels",
    "compute": "compute-bound",
    "memory": "memory-bound",
}


@dataclass(frozen=True)
class Floors:
    measured_ms: float
    compute_ms: float
    memory_ms: float
    launch_ms: float
    host_ms: float

    @property
    def by_name(self) -> dict[str, float]:
        return {"compute": self.compute_ms, "memory": self.memory_ms, "launch": self.launch_ms, "host": self.host_ms}

    @property
    def binding(self) -> str:
        floors = self.by_name
        return max(floors, key=floors.get)

    @property
    def verdict(self) -> str:
        return VERDICTS[self.binding]

    def ratios(self) -> dict[str, float]:
        return {name: (self.measured_ms / ms if ms > 0 else float("inf")) for name, ms in self.by_name.items()}

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(binding=self.binding, verdict=self.verdict, measured_over_floor=self.ratios())
        return d


def compute_floors(
    *,
    measured_ms: float,
    flops_per_step: float,
    matmul_tflops: float,
    bytes_per_step: float,
    copy_gbps: float,
    kernels_per_step: float,
    kernel_interval_us: float,
    host_issue_ms: float,
) -> Floors:
    return Floors(
        measured_ms=measured_ms,
        compute_ms=flops_per_step / (matmul_tflops * 1e12) * 1e3,
        memory_ms=bytes_per_step / (copy_gbps * 1e9) * 1e3,
        launch_ms=kernels_per_step * kernel_interval_us / 1e3,
        host_ms=host_issue_ms,
    )


def vit_min_bytes(*, params: int, weight_bytes: int, batch: int, tokens_per_block: list[int], dim: int, act_bytes: int,
                  input_elems: int, output_elems: int) -> int:
    """Weights read once, each block's residual stream read once and written once, input and logits.

    ``tokens_per_block`` holds the sequence length each block's output has. This is a floor, not an
    estimate: real kernels re-read activations (norms, attention, MLP hidden states).
    """
    activations = sum(2 * batch * n * dim * act_bytes for n in tokens_per_block)
    return params * weight_bytes + activations + 4 * (input_elems + output_elems)


def roofline(*, flops_per_step: float, bytes_per_step: float, achieved_tflops: float, matmul_tflops: float, copy_gbps: float) -> dict:
    """Where a step sits on the roofline of the measured ceilings.

    arithmetic intensity I = FLOPs ÷ bytes a step must move (FLOP/B); the ridge point = peak FLOP/s ÷
    bandwidth: below it the roof is I × bandwidth (memory-bound), above it the peak (compute-bound).
    ``roofline_fraction`` = achieved FLOP/s ÷ that roof (1.0 = on the roof)."""
    intensity = flops_per_step / bytes_per_step
    ridge = matmul_tflops * 1e12 / (copy_gbps * 1e9)
    roof_tflops = min(matmul_tflops, intensity * copy_gbps * 1e9 / 1e12)
    return {
        "arithmetic_intensity": intensity,
        "ridge_intensity": ridge,
        "roofline_bound": "memory" if intensity < ridge else "compute",
        "roof_tflops": roof_tflops,
        "roofline_fraction": achieved_tflops / roof_tflops if roof_tflops > 0 else None,
    }
