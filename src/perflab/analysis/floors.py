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

The floors are lower bounds; the profiled step's GPU busy time is a measurement. Where the kernels keep the GPU
busy longer than the host takes to issue them (``gpu_busy_ms`` ≥ the host floor) while the host floor binds, the
floors' verdict says launch-bound but the GPU does not wait for the CPU: the step is set by its kernels' own
slowness (``kernels_set_the_step``), and removing launches (a CUDA graph) cannot take it below the busy time.
(Found on an H100: one llama3_8b layer decoding at batch 64 and context 4096 over a cache of 4097 positions read
"launch-bound" with the host floor at 1.15 ms while its kernels were busy 1.98 ms of a 2.06 ms step, in cuBLAS's
fallback kernels.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

VERDICTS = {
    "host": "launch-bound",
    "launch": "latency-bound small kernels",
    "compute": "compute-bound",
    "memory": "memory-bound",
}


LIMITS = ("compute", "memory", "launch", "host")


class Bound:
    """ms per limit (``by_limit``), the limit that binds (the one with the most ms) and its verdict: a step's floors, a
    pass's, and a step of passes (where a limit holds the binding floors of the passes it binds)."""

    @property
    def by_limit(self) -> dict[str, float]:
        raise NotImplementedError

    @property
    def binding(self) -> str:
        ms = self.by_limit
        return max(ms, key=ms.get)

    @property
    def verdict(self) -> str:
        return VERDICTS[self.binding]


class FloorSet(Bound):
    """The four floors by limit: shared by a step's and a pass's floors."""

    compute_ms: float
    memory_ms: float
    launch_ms: float
    host_ms: float

    @property
    def by_limit(self) -> dict[str, float]:
        return {"compute": self.compute_ms, "memory": self.memory_ms, "launch": self.launch_ms, "host": self.host_ms}


@dataclass(frozen=True)
class Floors(FloorSet):
    measured_ms: float
    compute_ms: float
    memory_ms: float
    launch_ms: float
    host_ms: float
    gpu_busy_ms: float | None = None  # the profiled step's GPU busy time (kernels and copies, overlaps once), if profiled

    @property
    def kernels_set_the_step(self) -> bool:
        """The host floor binds (the floors say launch-bound), yet the GPU is busy at least as long as the host takes
        to issue the step: the kernels, not the launches, set its time. (Where the launch floor binds, the verdict
        already names the kernels: latency-bound small kernels.)"""
        return self.binding == "host" and self.gpu_busy_ms is not None and self.gpu_busy_ms >= self.host_ms

    def ratios(self) -> dict[str, float]:
        return {name: (self.measured_ms / ms if ms > 0 else float("inf")) for name, ms in self.by_limit.items()}

    def utilisation(self) -> dict[str, dict[str, float | None]]:
        """MFU and MBU of the measured step (compute floor ÷ measured = FLOPs ÷ time ÷ peak; memory likewise) and
        the ceiling: the same at the binding floor, the best these floors allow."""
        top = self.by_limit[self.binding]
        measured = {"mfu": self.compute_ms / self.measured_ms, "mbu": self.memory_ms / self.measured_ms} if self.measured_ms > 0 else {"mfu": None, "mbu": None}
        ceiling = {"mfu": self.compute_ms / top, "mbu": self.memory_ms / top} if top > 0 else {"mfu": None, "mbu": None}
        return {"measured": measured, "ceiling": ceiling}

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(binding=self.binding, verdict=self.verdict, measured_over_floor=self.ratios(), utilisation=self.utilisation(),
                 kernels_set_the_step=self.kernels_set_the_step)
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
    gpu_busy_ms: float | None = None,
) -> Floors:
    return Floors(
        measured_ms=measured_ms,
        compute_ms=flops_per_step / (matmul_tflops * 1e12) * 1e3,
        memory_ms=bytes_per_step / (copy_gbps * 1e9) * 1e3,
        launch_ms=kernels_per_step * kernel_interval_us / 1e3,
        host_ms=host_issue_ms,
        gpu_busy_ms=gpu_busy_ms,
    )


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


def counted_pass_costs(costs: dict[str, dict], counted_flops: float | None) -> dict[str, dict]:
    """One FLOP count per row: the family's per-pass split (its formula) scaled so the passes add up to the step's
    counted FLOPs (torch's counter on the real step), each pass keeping its formula's figure as ``flops_analytic``.
    The difference is shared in proportion to the formula's split (for an lm train step it is the fused attention's
    backward recomputing the scores, ½ × the forward's attention FLOPs, which a per-pass count would put in the
    backward). Without counted FLOPs the costs are as given."""
    analytic = sum(float(c.get("flops", 0)) for c in costs.values())
    if not counted_flops or analytic <= 0:
        return costs
    scale = counted_flops / analytic
    return {name: dict(c, flops=float(c.get("flops", 0)) * scale, flops_analytic=float(c.get("flops", 0))) for name, c in costs.items()}


# ---- per-pass floors (a training step's forward, backward and optimizer; generate's prefill and decode) ----


@dataclass(frozen=True)
class PassFloor(FloorSet):
    """The four floors of one pass of a step, from the pass's own FLOPs, least bytes, kernels and CPU issue
    time; ``gpu_ms`` is the profiled pass's GPU time per step (Σ kernel durations), None if not profiled."""

    name: str
    flops: float
    bytes: float
    kernels: float
    compute_ms: float
    memory_ms: float
    launch_ms: float
    host_ms: float
    gpu_ms: float | None = None
    flops_analytic: float | None = None  # the family's formula, where ``flops`` were scaled to the counted step

    @property
    def floor_ms(self) -> float:
        return self.by_limit[self.binding]


    @property
    def gpu_over_floor(self) -> float | None:
        """The profiled pass's GPU time ÷ its binding floor (1.0 = at the floor)."""
        if self.gpu_ms is None or self.floor_ms <= 0:
            return None
        return self.gpu_ms / self.floor_ms

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(binding=self.binding, verdict=self.verdict, floor_ms=self.floor_ms, gpu_over_floor=self.gpu_over_floor)
        return d


@dataclass(frozen=True)
class StepFloors(Bound):
    """A step as a sequence of passes: its floor is the sum of the passes' binding floors (a pass cannot start
    before the one it depends on is done, and each is held up by its own worst limit)."""

    passes: tuple[PassFloor, ...]
    measured_ms: float  # the untraced step
    matmul_tflops: float
    copy_gbps: float

    @property
    def floor_ms(self) -> float:
        return sum(p.floor_ms for p in self.passes)

    @property
    def flops(self) -> float:
        return sum(p.flops for p in self.passes)

    @property
    def bytes(self) -> float:
        return sum(p.bytes for p in self.passes)

    @property
    def flops_analytic(self) -> float | None:
        values = [p.flops_analytic for p in self.passes]
        return None if any(v is None for v in values) else sum(values)

    @property
    def by_limit(self) -> dict[str, float]:
        """ms of the step floor per limit: the binding floors of the passes that limit binds."""
        out = {name: 0.0 for name in LIMITS}
        for p in self.passes:
            out[p.binding] += p.floor_ms
        return out

    def utilisation(self, ms: float) -> dict[str, float | None]:
        """MFU (FLOPs ÷ ms ÷ the measured peak) and MBU (least bytes ÷ ms ÷ the copy bandwidth) of a step of ``ms``."""
        if not ms or ms <= 0:
            return {"mfu": None, "mbu": None}
        seconds = ms / 1e3
        return {"mfu": self.flops / seconds / (self.matmul_tflops * 1e12), "mbu": self.bytes / seconds / (self.copy_gbps * 1e9)}

    @property
    def ceiling(self) -> dict[str, float | None]:
        """The best MFU and MBU the floors allow: the step's utilisation if it ran at its floor."""
        return self.utilisation(self.floor_ms)

    def to_dict(self) -> dict:
        measured = self.utilisation(self.measured_ms)
        ceiling = self.ceiling
        return {
            "passes": [p.to_dict() for p in self.passes],
            "measured_ms": self.measured_ms,
            "floor_ms": self.floor_ms,
            "measured_over_floor": self.measured_ms / self.floor_ms if self.floor_ms > 0 else None,
            "floor_by_limit_ms": self.by_limit,
            "binding": self.binding,
            "verdict": self.verdict,
            "flops": self.flops,
            "flops_analytic": self.flops_analytic,
            "bytes": self.bytes,
            "mfu": measured["mfu"],
            "mfu_analytic": measured["mfu"] * self.flops_analytic / self.flops if measured["mfu"] and self.flops_analytic and self.flops else None,
            "mbu": measured["mbu"],
            "ceiling_mfu": ceiling["mfu"],
            "ceiling_mbu": ceiling["mbu"],
        }


def pass_floors(
    *,
    costs: dict[str, dict],
    timing: dict[str, dict],
    measured_ms: float,
    matmul_tflops: float,
    copy_gbps: float,
    kernel_interval_us: float,
    host_issue_ms: float,
) -> StepFloors:
    """Per-pass floors of a step.

    ``costs``: per pass, in step order, its ``flops`` and least ``bytes`` (the family's analytic split);
    ``timing``: per pass, from the profiled step (``analysis.passes.pass_timing``): ``kernels``, ``gpu_ns``
    and the traced ``issue_ns``. A pass in the trace but not in ``costs`` gets no FLOPs and no bytes; a pass
    in ``costs`` but not in the trace gets no kernels.
    ``host_issue_ms``: the untraced CPU time to issue the whole step, split over the passes in proportion to
    their traced issue times (the profiler inflates the host about 2×; the split keeps its shape), so the
    passes' host floors add up to it exactly (split by kernels where no launch is linked).
    """
    names = list(costs) + [n for n in timing if n not in costs]
    issue = {n: float(timing.get(n, {}).get("issue_ns", 0)) for n in names}
    if sum(issue.values()) <= 0:  # no linked launches: split the host time by kernels, else evenly
        issue = {n: float(timing.get(n, {}).get("kernels", 0)) for n in names}
        if sum(issue.values()) <= 0:
            issue = {n: 1.0 for n in names}
    total_issue = sum(issue.values())
    passes = []
    for name in names:
        cost = costs.get(name, {})
        t = timing.get(name, {})
        flops, moved, kernels = float(cost.get("flops", 0)), float(cost.get("bytes", 0)), float(t.get("kernels", 0))
        host = host_issue_ms * issue[name] / total_issue if total_issue > 0 else 0.0
        passes.append(PassFloor(
            name=name, flops=flops, bytes=moved, kernels=kernels, flops_analytic=cost.get("flops_analytic"),
            compute_ms=flops / (matmul_tflops * 1e12) * 1e3,
            memory_ms=moved / (copy_gbps * 1e9) * 1e3,
            launch_ms=kernels * kernel_interval_us / 1e3,
            host_ms=host,
            gpu_ms=t["gpu_ns"] / 1e6 if "gpu_ns" in t else None,
        ))
    return StepFloors(tuple(passes), measured_ms=measured_ms, matmul_tflops=matmul_tflops, copy_gbps=copy_gbps)
