"""Fixes that explain predicts before it measures them: each is a change to the case, a predicted step time
and its model, stated in one line. Torch-free arithmetic over the profiled eager step (``passes.pass_timing``)
and the untraced eager median; explain measures each fix with the untraced harness and shows the error.

Models (ms per step; O = the optimizer pass's GPU time in the profile, B = the backward's):
- ``optimizer:fused|foreach|plain``: step − O + O × bytes(new) ÷ bytes(current): AdamW's memory-bound
  update moves 28 B per fp32 parameter fused (read p, g, m, v; write p, m, v) and 84 B in torch's foreach
  and for-loop implementations (8 tensor passes: weight decay, lerp, mul, addcmul, sqrt, div, add,
  addcdiv), at the bandwidth the profiled optimizer reached.
- ``optimizer:in_backward``: step − O + max(0, O' − B's GPU idle): each parameter's update is launched from
  its gradient's post-accumulate hook on the backward's stream, so it only hides in the backward's idle
  GPU time; O' = O rescaled to fused bytes.
- ``optimizer:in_backward_stream``: step − O + max(0, O' − (B − B's memory floor)): the updates run on a
  side stream beside the backward's GEMMs, hidden in the backward time that does not need DRAM (an upper
  bound on the overlap: GEMMs also read memory, and the two share SMs).
- ``checkpoint``: step + the forward's GPU time: every block's forward runs again inside the backward
  (the head and loss, not recomputed, are a small share and counted too).
- ``batch:N`` (decode): ms(b₀) × bytes(N) ÷ bytes(b₀): a decode step is bound by the bytes it moves
  (weights once, the KV cache per sequence), at the bandwidth batch b₀ reached.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Least DRAM bytes per fp32 parameter of one AdamW update, by implementation (see the module docstring).
ADAMW_BYTES_PER_PARAM = {"fused": 28, "foreach": 84, "plain": 84, "in_backward": 28, "in_backward_stream": 28}


@dataclass
class Fix:
    """One fix: ``changes`` (Case fields) applied to the eager case, its prediction and its model."""

    name: str
    changes: dict
    predicted_ms: float | None
    model: str
    measured: dict = field(default_factory=dict)  # the harness's row, once measured

    @property
    def measured_ms(self) -> float | None:
        return self.measured.get("median_ms") if self.measured.get("status") == "ok" else None

    @property
    def error(self) -> float | None:
        """predicted ÷ measured − 1."""
        if self.predicted_ms is None or not self.measured_ms:
            return None
        return self.predicted_ms / self.measured_ms - 1

    def to_dict(self) -> dict:
        d = asdict(self)
        row = d.pop("measured")
        d.update(measured_ms=self.measured_ms, error=self.error, status=row.get("status"), message=row.get("message"),
                 first_step_s=row.get("first_step_s"), peak_mem_alloc_mb=row.get("peak_mem_alloc_mb"), mfu=row.get("mfu"),
                 mbu=row.get("mbu"), tokens_per_s=row.get("tokens_per_s"), batch_size=row.get("batch_size"))
        return d


def _ms(timing: dict, name: str, key: str) -> float:
    return timing.get(name, {}).get(key, 0) / 1e6


def predict_optimizer(variant: str, current: str, step_ms: float, timing: dict, backward_memory_floor_ms: float) -> tuple[float | None, str]:
    """(predicted ms, model) for switching the step's AdamW from ``current`` to ``variant``; None when the
    profiled step has no optimizer pass to move (it already updates in the backward)."""
    if "optimizer" not in timing:
        return None, "no optimizer pass in the profile (the updates already run inside the backward): nothing to predict from"
    o = _ms(timing, "optimizer", "gpu_ns")
    b_cur, b_new = ADAMW_BYTES_PER_PARAM[current], ADAMW_BYTES_PER_PARAM[variant]
    o_new = o * b_new / b_cur
    if variant in ("fused", "foreach", "plain"):
        return step_ms - o + o_new, (f"step − O + O × {b_new}/{b_cur}: AdamW {variant} moves {b_new} B per parameter against {current}'s "
                                     f"{b_cur}, at the bandwidth the profiled optimizer reached (O = {o:.3f} ms)")
    if variant == "in_backward":
        slack = _ms(timing, "backward", "idle_ns")
        return step_ms - o + max(0.0, o_new - slack), (f"step − O + max(0, O' − backward GPU idle {slack:.3f} ms): per-parameter updates on the "
                                                        f"backward's stream hide only in its idle time (O = {o:.3f}, O' = {o_new:.3f} ms)")
    if variant == "in_backward_stream":
        slack = max(_ms(timing, "backward", "gpu_ns") - backward_memory_floor_ms, 0.0)
        return step_ms - o + max(0.0, o_new - slack), (f"step − O + max(0, O' − (B − B's memory floor) = {slack:.3f} ms): updates on a side stream "
                                                        f"hide under the backward's time that does not need DRAM (O = {o:.3f}, O' = {o_new:.3f} ms)")
    raise ValueError(f"unknown optimizer {variant!r}")


def predict_checkpoint(step_ms: float, timing: dict) -> tuple[float | None, str]:
    if "forward" not in timing:
        return None, "no forward pass in the profile: nothing to predict from"
    f = _ms(timing, "forward", "gpu_ns")
    return step_ms + f, f"step + the forward's GPU time {f:.3f} ms: every block's forward runs again inside the backward"


def predict_batch(base_ms: float, base_bytes: float, new_bytes: float, base_batch: int, new_batch: int) -> tuple[float, str]:
    return base_ms * new_bytes / base_bytes, (f"ms(bs{base_batch}) × bytes(bs{new_batch}) ÷ bytes(bs{base_batch}) = × {new_bytes / base_bytes:.3f}: "
                                              f"the step moves weights once and KV per sequence, at the bandwidth bs{base_batch} reached")


def with_host_term(predicted_ms: float | None, model: str, eager_row: dict) -> tuple[float | None, str]:
    """A GPU-time model's prediction, bounded by the host: the step takes about max(host time, GPU time) to issue and
    run, so a fix that changes the GPU's time moves an eager step only by what rises above the host's.

    Uses the eager row's host and GPU times measured apart (``host_held_ms``, ``device_ms``; the harness's held
    timing). The GPU model's change Δ lands on the GPU time; the prediction is eager × max(host, GPU + Δ) ÷
    max(host, GPU), anchored at the measured step. Without those times the prediction is as given."""
    host, gpu, eager = eager_row.get("host_held_ms"), eager_row.get("device_ms"), eager_row.get("median_ms")
    if predicted_ms is None or not host or not gpu or not eager:
        return predicted_ms, model
    new_gpu = gpu + (predicted_ms - eager)
    before, after = max(host, gpu), max(host, new_gpu)
    bounded = eager * after / before
    if host >= max(new_gpu, gpu):
        return bounded, f"{model}; host-bound: the host's {host:.3f} ms per step exceeds the GPU's {gpu:.3f} → {new_gpu:.3f} ms, so the step stays"
    return bounded, f"{model}; with the host term: eager × max(host {host:.3f}, GPU {new_gpu:.3f}) ÷ max(host, GPU {gpu:.3f}) ms"

