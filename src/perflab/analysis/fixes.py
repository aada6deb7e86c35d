"""Fixes that explain predicts before it measures them: each is a change to the case, applied on a base (eager, or the
best mode measured), a predicted step time and its model, stated in one line. Torch-free arithmetic over the profiled
eager step (``passes.pass_timing``), the untraced host issue time and the base's measured step; explain measures each
fix with the untraced harness and shows the error, and which term (host or GPU) missed.

**The step model, with a host term.** A step is its passes in order (forward, backward, optimizer; one pass ``step``
for a workload without passes, or a compiled base whose passes are not profiled). Each pass has the host's time to
issue it (h) and the GPU's time to run it (g); the step takes T = Σ over passes of max(h, g): inside a pass the slower
side sets the pace, and the GPU cannot run a pass's kernels before the host has issued them. A fix changes some h and
g (its Δ below); the prediction is the measured base step × T(after) ÷ T(before), anchored at the measurement, so a
host figure taken under other conditions (explain's untraced issue time, from an idle GPU) scales out.

Why Σ max per pass, not max(Σh, Σg) over the whole step: the launch queue lets the host run only so far ahead, so
GPU work added to a GPU-bound pass (the optimizer) is not hidden under another pass's host time. On the H100 the
gpt_large bf16 train_step (docs/performance.md: h = 42.9, 79.5, 1.5 ms, g = 18.2, 36.9, 10.3 ms, eager 101.8 ms)
measured 131.3 ms with the foreach AdamW (+20.5 ms of optimizer GPU time): Σ max predicts 117.5 ms (−10.5%); the
whole-step max predicts no change (101.8 ms, −22%). tests/test_pass_floors.py holds that step.

Host and GPU per pass come from the eager profile (``pass_timing``'s GPU time; the untraced issue time split over the
passes as ``floors.pass_floors`` splits it); for a compiled base, from its measured row (``host_held_ms`` or
``host_issue_ms``, and ``device_ms``: the harness's held timing) as one pass. Without them the model is the GPU's
alone: base + ΣΔg.

Fix models (Δ per pass; O = the optimizer pass's GPU time in the eager profile, B = the backward's, F = the forward's):
- ``optimizer:fused|foreach|plain``: Δg(optimizer) = O × bytes(new) ÷ bytes(current) − O: AdamW's memory-bound
  update moves 28 B per fp32 parameter fused (read p, g, m, v; write p, m, v) and 84 B in torch's foreach and
  for-loop implementations (8 tensor passes: weight decay, lerp, mul, addcmul, sqrt, div, add, addcdiv), at the
  bandwidth the profiled optimizer reached. Its host time is left as profiled (stated: the other implementations
  launch more kernels, which the measured host column shows).
- ``optimizer:in_backward``: the optimizer pass moves into the backward: its GPU time O' (rescaled to fused bytes)
  hides only in the backward's GPU idle time (none on a compiled base), its host time is issued from the
  backward's hooks.
- ``optimizer:in_backward_stream``: the same on a side stream, hidden under the backward's time that does not need
  DRAM (B − B's memory floor; an upper bound on the overlap).
- ``checkpoint``: the backward runs every block's forward again: Δg(backward) = F and Δh(backward) = the forward's
  host time (eager); on a compiled base Δg = the forward's time after fusion (the glue model of the modes), no
  added launches (the recomputation is inside the compiled backward).
- ``batch:N`` (decode): Δg = g × (bytes(N) ÷ bytes(b₀) − 1): a decode step is bound by the bytes it moves (weights
  once, the KV cache per sequence), at the bandwidth batch b₀ reached; the host issues the same kernels.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Least DRAM bytes per fp32 parameter of one AdamW update, by implementation (see the module docstring).
ADAMW_BYTES_PER_PARAM = {"fused": 28, "foreach": 84, "plain": 84, "in_backward": 28, "in_backward_stream": 28}
WHOLE_STEP = "step"  # the one pass of a step whose passes are not known


@dataclass(frozen=True)
class StepTimes:
    """A step as its passes in order, each with the host's time to issue it and the GPU's time to run it (ms per
    step); ``source`` says where the figures come from."""

    host: dict
    gpu: dict
    source: str = ""

    @property
    def passes(self) -> list[str]:
        return list(self.host) + [p for p in self.gpu if p not in self.host]

    @property
    def ms(self) -> float:
        """T = Σ over passes of max(host, GPU)."""
        return sum(max(self.host.get(p, 0.0), self.gpu.get(p, 0.0)) for p in self.passes)

    @property
    def host_ms(self) -> float:
        return sum(self.host.values())

    @property
    def gpu_ms(self) -> float:
        return sum(self.gpu.values())

    def plus(self, delta: "Delta") -> "StepTimes":
        """These times after the fix. A whole-step base takes every pass's Δ into its one pass."""
        host, gpu = dict(self.host), dict(self.gpu)
        for side, changes in ((host, delta.host), (gpu, delta.gpu)):
            for name, d in changes.items():
                key = WHOLE_STEP if self.passes == [WHOLE_STEP] else name
                side[key] = max(side.get(key, 0.0) + d, 0.0)
        return StepTimes(host, gpu, self.source)


@dataclass(frozen=True)
class Delta:
    """What a fix changes, per pass: ms of GPU time and of host issue time, and the model in words."""

    gpu: dict
    host: dict
    text: str


def step_times_of_passes(passes) -> StepTimes | None:
    """Host and GPU per pass from ``floors.StepFloors.passes`` (the untraced host time split over the passes, the
    profiled GPU time); None when no pass has a profiled GPU time."""
    if not passes or all(p.gpu_ms is None for p in passes):
        return None
    return StepTimes({p.name: p.host_ms for p in passes}, {p.name: p.gpu_ms or 0.0 for p in passes},
                     "per pass: the untraced host issue time split as the profile issued it, the profiled GPU time")


def step_times_of_row(row: dict, source: str) -> StepTimes | None:
    """One whole-step pass from a measured row: the host's time to issue a step (``host_held_ms``, else the harness's
    ``host_issue_ms``) and the GPU's (``device_ms``); None without the GPU's."""
    host = measured_host_ms(row)
    gpu = row.get("device_ms")
    if not gpu or host is None:
        return None
    return StepTimes({WHOLE_STEP: float(host)}, {WHOLE_STEP: float(gpu)}, source)


@dataclass(frozen=True)
class StepPrediction:
    """A fix's predicted step, ms (None: measured only), and the model that gave it, in words; each kind of fix adds
    the terms its model splits the step into (``Prediction``: host and GPU; ``comm_fixes.CommPrediction``: compute and
    exposed communication)."""

    ms: float | None
    model: str


def prediction_error(predicted_ms: float | None, measured_ms: float | None) -> float | None:
    """predicted ÷ measured − 1; None without either."""
    if predicted_ms is None or not measured_ms:
        return None
    return predicted_ms / measured_ms - 1


@dataclass(frozen=True)
class Prediction(StepPrediction):
    """The host and GPU times per step a fix's prediction holds (None: GPU-only model), and the base's."""

    host_ms: float | None = None
    gpu_ms: float | None = None
    base_host_ms: float | None = None
    base_gpu_ms: float | None = None


def predict_step_ms(base_ms: float, times: StepTimes | None, delta: Delta | None, why_not: str = "") -> Prediction:
    """The base step × T(after) ÷ T(before) (the module docstring), or base + ΣΔGPU without host and GPU times."""
    if delta is None:
        return Prediction(None, why_not or "measured only")
    if times is None or times.ms <= 0:
        ms = base_ms + sum(delta.gpu.values())
        return Prediction(ms, f"{delta.text}; GPU only (no host and GPU times of the base): base {base_ms:.3f} + ΔGPU")
    after = times.plus(delta)
    ms = base_ms * after.ms / times.ms
    binding = "host" if after.host_ms >= after.gpu_ms else "GPU"
    text = (f"{delta.text}; with the host term: base {base_ms:.3f} × Σmax(host, GPU) {after.ms:.3f} ÷ {times.ms:.3f} ms "
            f"(host {times.host_ms:.3f} → {after.host_ms:.3f}, GPU {times.gpu_ms:.3f} → {after.gpu_ms:.3f} ms; {binding} the larger)")
    return Prediction(ms, text, after.host_ms, after.gpu_ms, times.host_ms, times.gpu_ms)


def _ms(timing: dict, name: str, key: str) -> float:
    return timing.get(name, {}).get(key, 0) / 1e6


def optimizer_delta(variant: str, current: str, timing: dict, backward_memory_floor_ms: float, times: StepTimes | None,
                    compiled_base: bool = False) -> tuple[Delta | None, str]:
    """(Δ, why not) for switching the step's AdamW from ``current`` to ``variant``; None when the profiled step has no
    optimizer pass to move (it already updates in the backward)."""
    if "optimizer" not in timing:
        return None, "no optimizer pass in the profile (the updates already run inside the backward): nothing to predict from"
    o = _ms(timing, "optimizer", "gpu_ns")
    b_cur, b_new = ADAMW_BYTES_PER_PARAM[current], ADAMW_BYTES_PER_PARAM[variant]
    o_new = o * b_new / b_cur
    if variant in ("fused", "foreach", "plain"):
        return Delta({"optimizer": o_new - o}, {}, f"O × {b_new}/{b_cur} − O: AdamW {variant} moves {b_new} B per parameter against "
                                                   f"{current}'s {b_cur}, at the bandwidth the profiled optimizer reached (O = {o:.3f} ms); "
                                                   "its host time as profiled"), ""
    host_moved = times.host.get("optimizer", 0.0) if times is not None else 0.0
    moved_host = {"optimizer": -host_moved, "backward": host_moved}
    if variant == "in_backward":
        slack = 0.0 if compiled_base else _ms(timing, "backward", "idle_ns")
        return Delta({"optimizer": -o, "backward": max(0.0, o_new - slack)}, moved_host,
                     f"−O + max(0, O' − backward GPU idle {slack:.3f} ms): per-parameter updates on the backward's stream hide only in its "
                     f"idle time{' (none in a compiled backward)' if compiled_base else ''} (O = {o:.3f}, O' = {o_new:.3f} ms), issued "
                     "from the backward's hooks"), ""
    if variant == "in_backward_stream":
        slack = max(_ms(timing, "backward", "gpu_ns") - backward_memory_floor_ms, 0.0)
        return Delta({"optimizer": -o, "backward": max(0.0, o_new - slack)}, moved_host,
                     f"−O + max(0, O' − (B − B's memory floor) = {slack:.3f} ms): updates on a side stream hide under the backward's time "
                     f"that does not need DRAM (O = {o:.3f}, O' = {o_new:.3f} ms)"), ""
    raise ValueError(f"unknown optimizer {variant!r}")


def checkpoint_delta(timing: dict, times: StepTimes | None, compiled_forward_ms: float | None = None) -> tuple[Delta | None, str]:
    """(Δ, why not) of activation checkpointing: the backward runs the forward again. ``compiled_forward_ms``: on a
    compiled base, the forward's GPU time after fusion (recomputed inside the compiled backward, no added launches)."""
    if "forward" not in timing:
        return None, "no forward pass in the profile: nothing to predict from"
    if compiled_forward_ms is not None:
        return Delta({"backward": compiled_forward_ms}, {}, f"+ the forward's GPU time after fusion {compiled_forward_ms:.3f} ms, recomputed "
                                                            "inside the compiled backward"), ""
    f = _ms(timing, "forward", "gpu_ns")
    f_host = times.host.get("forward", 0.0) if times is not None else 0.0
    return Delta({"backward": f}, {"backward": f_host}, f"+ the forward's GPU time {f:.3f} ms and host time {f_host:.3f} ms in the backward: "
                                                        "every block's forward runs again there"), ""


def batch_delta(gpu_ms: float, base_bytes: float, new_bytes: float, base_batch: int, new_batch: int) -> Delta:
    ratio = new_bytes / base_bytes
    return Delta({WHOLE_STEP: gpu_ms * (ratio - 1.0)}, {},
                 f"GPU × bytes(bs{new_batch}) ÷ bytes(bs{base_batch}) = × {ratio:.3f} (GPU {gpu_ms:.3f} ms): the step moves weights once and "
                 f"KV per sequence, at the bandwidth bs{base_batch} reached; the host issues the same kernels")


def measured_host_ms(row: dict) -> float | None:
    """A measured row's host time to issue a step: the held timing's, else the harness's issue time."""
    return row.get("host_held_ms") or row.get("host_issue_ms")


@dataclass
class Fix:
    """One fix: ``changes`` (Case fields) applied on ``base`` (a mode: eager or the best mode measured), its prediction
    and its model; ``eager_only`` says why it was measured on eager instead of the base."""

    name: str
    changes: dict
    predicted_ms: float | None
    model: str
    measured: dict = field(default_factory=dict)  # the harness's row, once measured
    base: str = "eager"
    base_row: dict = field(default_factory=dict)  # the base's row, timed with the fix
    eager_only: str | None = None
    predicted_host_ms: float | None = None
    predicted_gpu_ms: float | None = None

    @property
    def measured_ms(self) -> float | None:
        return self.measured.get("median_ms") if self.measured.get("status") == "ok" else None

    @property
    def base_ms(self) -> float | None:
        return self.base_row.get("median_ms") if self.base_row.get("status") == "ok" else None

    @property
    def error(self) -> float | None:
        return prediction_error(self.predicted_ms, self.measured_ms)

    @property
    def missed_term(self) -> str | None:
        """Where a prediction more than 15% off missed: the term (host or GPU) whose prediction is further from the fix's
        measured host and GPU times, with both; None within 15%, or without measured times."""
        if self.error is None or abs(self.error) <= MISS or self.predicted_host_ms is None:
            return None
        host, gpu = measured_host_ms(self.measured), self.measured.get("device_ms")
        misses = {}
        if host is not None:
            misses["host"] = (self.predicted_host_ms, host)
        if gpu is not None and self.predicted_gpu_ms is not None:
            misses["GPU"] = (self.predicted_gpu_ms, gpu)
        return worst_term(misses)

    def to_dict(self) -> dict:
        d = asdict(self)
        row = d.pop("measured")
        d.pop("base_row")
        d.update(measured_ms=self.measured_ms, error=self.error, status=row.get("status"), message=row.get("message"),
                 first_step_s=row.get("first_step_s"), peak_mem_alloc_mb=row.get("peak_mem_alloc_mb"), mfu=row.get("mfu"),
                 mbu=row.get("mbu"), tokens_per_s=row.get("tokens_per_s"), batch_size=row.get("batch_size"), base_ms=self.base_ms,
                 speedup_vs_base=(self.base_ms / self.measured_ms) if self.base_ms and self.measured_ms else None,
                 measured_host_ms=measured_host_ms(row), measured_gpu_ms=row.get("device_ms"), missed_term=self.missed_term)
        return d


MISS = 0.15  # a prediction further than this from its measurement says which term missed


def worst_term(misses: dict) -> str | None:
    """Of the terms a prediction has (name -> (predicted ms, measured ms)), the one furthest from its measurement, in
    words; None without any."""
    if not misses:
        return None
    term = max(misses, key=lambda k: abs(misses[k][1] - misses[k][0]))
    pred, meas = misses[term]
    return f"{term}: predicted {pred:.3f}, measured {meas:.3f} ms"
