"""The communication fixes of a data-parallel training step, predicted before they are measured (``perflab explain
--parallel``). No torch: arithmetic over the base step as explain measured and profiled it (``CommStep``).

**The step model.** The slowest rank's step T (untraced median) is its compute C and its exposed communication E
(the transfer no compute hides, without the time spent waiting for a later rank, from its profile: ``analysis.ranks``,
as its share of the traced step applied to T): T = C + E. A fix changes C and E
(Δ below), and the prediction is T' = T + ΔC + ΔE, with E' = max(0, E + ΔE). Explain times the base again beside each
fix (in the fix's launch) and anchors the prediction there: T that paired step, the profiled times scaled with it
(``CommStep.anchored``). Where it misses by more than 15%,
the term (compute or exposed communication) further from the fix's own profile says where.

A collective's time is per-call latency α plus its bus bytes at the bus bandwidth B (``comm.comm_ms``: α from the
all-reduce sweep's smallest sizes, B the sweep's at the message size). f = 2(N−1)/N, G the gradient bytes
(in the dtype the gradients have), O the optimizer pass per step.

- ``ddp:bucket_cap_mb=X``: the same bytes in other buckets (``comm.ddp_buckets`` over the gradients in the order
  DDP saw them ready). Every call costs α, and the last bucket (the first layers' gradients, ready when the
  backward ends) cannot overlap: ΔE = (n' − n) × α + (last' ÷ B(last') − last ÷ B(last)) × f.
- ``ddp:grad_view=true``: gradients are views into the buckets, so DDP no longer copies each gradient into its
  bucket nor the reduced bucket back: ΔC = −2 × 2G ÷ the copy bandwidth (each copy reads and writes G).
- ``ddp:no_sync=k``: k micro-batches per step, all but the last without the all-reduce and without the
  optimizer: T' = E + O + k × (T − E − O) ÷ k₀ (k₀ the base's micro-batches); the exposed communication per
  micro-batch falls k-fold.
- ``fsdp``, ``fsdp:reshard=…``, ``ddp`` from FSDP: the other collectives' modelled time M (``comm.fsdp_bytes``,
  ``ddp_bytes``; bus bytes ÷ B + calls × α), the same share of it exposed: E' = E × M' ÷ M; FSDP's optimizer
  updates a 1/N shard: ΔC = −O × (N−1)/N (and back: +O × (N − 1) from FSDP to DDP).
- ``compile``: Inductor fuses the memory-bound glue kernels two into one (explain's one-GPU model): ΔC = −glue
  time ÷ 2; the collectives and their buckets as before (ΔE = 0). No GPU kernels on the CPU: measured only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from perflab.analysis.comm import MIB, busbw_at, comm_ms, ddp_buckets, ddp_bytes, fsdp_bytes
from perflab.analysis.fixes import MISS, StepPrediction, prediction_error, worst_term

NO_SWEEP = "measured only: no all-reduce sweep (bus bandwidth and per-call latency) to predict from"


@dataclass(frozen=True)
class CommStep:
    """The base step as the models read it: ms per step of the slowest rank, the bytes and buckets, the sweep."""

    mode: str  # ddp or fsdp
    options: dict
    world_size: int
    step_ms: float  # untraced, the slowest rank's median
    exposed_ms: float | None  # profiled: communication no compute hides, per step
    optimizer_ms: float | None  # profiled: the optimizer pass per step (None: not profiled)
    grad_bytes: int
    param_bytes: int
    sweep: dict | None  # the all-reduce sweep: {"sizes": [{bytes, time_us, busbw_gbps}]}
    latency_us: float = 0.0  # α
    ready_sizes: tuple = ()  # gradient bytes in the order DDP saw them ready
    buckets: tuple = ()  # DDP's own buckets (bytes)
    units: int = 1  # FSDP units: the blocks and the root
    copy_gbps: float | None = None
    glue_ms: float | None = None  # GPU: the memory-bound glue kernels per step (None on the CPU)

    @property
    def micro_batches(self) -> int:
        return int(self.options.get("no_sync", 1)) if self.mode == "ddp" else 1

    @property
    def compute_ms(self) -> float | None:
        return self.step_ms - self.exposed_ms if self.exposed_ms is not None else None

    def anchored(self, step_ms: float) -> "CommStep":
        """The step timed again at ``step_ms`` (the base beside a fix, in the fix's launch): the profiled times (E, O, the
        glue) scaled by ``step_ms`` ÷ the step they were profiled beside, so compute and exposed communication keep
        their shares of it."""
        r = step_ms / self.step_ms
        scale = lambda v: v * r if v is not None else None  # noqa: E731
        return replace(self, step_ms=step_ms, exposed_ms=scale(self.exposed_ms), optimizer_ms=scale(self.optimizer_ms), glue_ms=scale(self.glue_ms))


@dataclass(frozen=True)
class CommPrediction(StepPrediction):
    """The compute and exposed communication a communication fix's prediction holds (T' = C' + E')."""

    compute_ms: float | None = None
    exposed_ms: float | None = None


def collectives_ms(step: CommStep, mode: str, options: dict) -> tuple[float, str]:
    """M: the modelled time of the step's collectives under ``mode``/``options`` (bus bytes ÷ B at the mean message, plus
    calls × α), and the figures in words."""
    n, alpha = step.world_size, step.latency_us
    if mode == "ddp":
        buckets = _buckets(step, options["bucket_cap_mb"])
        comm = ddp_bytes(step.grad_bytes, n, options["bucket_cap_mb"], buckets=buckets)
        message = step.grad_bytes / max(comm.calls, 1)
    else:
        comm = fsdp_bytes(step.param_bytes, step.grad_bytes, n, reshard_after_forward=options["reshard"], units=step.units)
        message = step.param_bytes / max(step.units, 1)
    busbw = busbw_at(step.sweep, message)
    ms = comm_ms(comm.bus_bytes, comm.calls, busbw, alpha)
    return ms, f"{mode} {comm.bus_bytes / MIB:.2f} MiB in {comm.calls} calls at {busbw:.2f} GB/s + {alpha:.1f} µs each = {ms:.3f} ms"


def _buckets(step: CommStep, cap_mb: float) -> list[int]:
    """The buckets at ``cap_mb``: DDP's own where that is the base's cap, else ``ddp_buckets`` over the ready order."""
    if step.mode == "ddp" and cap_mb == step.options.get("bucket_cap_mb") and step.buckets:
        return list(step.buckets)
    sizes = list(step.ready_sizes) or [step.grad_bytes]
    return ddp_buckets(sizes, int(cap_mb * MIB))


def predict_comm_fix(step: CommStep, new_mode: str | None, new_options: dict | None, compile_mode: bool = False) -> CommPrediction:
    """The prediction of one fix on ``step``: the data-parallel mode and options after it (``new_mode``/``new_options``,
    the base's own where the fix keeps them), or ``compile_mode`` (compile the wrapped model)."""
    if step.exposed_ms is None:
        return CommPrediction(None, "measured only: the base's profile accounts no communication (no exposed time to start from)")
    T, E, O = step.step_ms, step.exposed_ms, step.optimizer_ms
    if compile_mode:
        if step.glue_ms is None:
            return CommPrediction(None, "measured only: no GPU kernels to fuse (a CPU run)")
        return _after(step, -step.glue_ms / 2, 0.0, f"ΔC = −glue {step.glue_ms:.3f} ms ÷ 2: Inductor fuses the memory-bound glue "
                                                    "kernels two into one; the buckets and their collectives as before (ΔE = 0)")
    mode, options = new_mode or step.mode, new_options if new_options is not None else step.options
    if mode != step.mode or (mode == "fsdp" and options["reshard"] != step.options["reshard"]):
        return _switch(step, mode, options)
    changed = [k for k in options if options[k] != step.options.get(k)]
    if not changed:
        return _after(step, 0.0, 0.0, "no change from the base")
    if len(changed) > 1:
        return CommPrediction(None, f"a combination ({', '.join(changed)}): measured only")
    (key,) = changed
    value = options[key]
    if key == "bucket_cap_mb":
        if step.sweep is None:
            return CommPrediction(None, NO_SWEEP)
        old, new = _buckets(step, step.options["bucket_cap_mb"]), _buckets(step, value)
        f = 2 * (step.world_size - 1) / step.world_size
        b_old, b_new = busbw_at(step.sweep, old[-1]), busbw_at(step.sweep, new[-1])
        latency = (len(new) - len(old)) * step.latency_us / 1e3
        tail = (new[-1] * f / b_new - old[-1] * f / b_old) / 1e9 * 1e3
        return _after(step, 0.0, latency + tail,
                      f"ΔE = (n' − n) × α + (last' ÷ B' − last ÷ B) × 2(N−1)/N = ({len(new)} − {len(old)}) × {step.latency_us:.1f} µs + "
                      f"({new[-1] / MIB:.3f} MiB ÷ {b_new:.2f} − {old[-1] / MIB:.3f} MiB ÷ {b_old:.2f} GB/s) × {f:g}: every all-reduce costs "
                      "its latency, and the last bucket (the first layers' gradients, ready as the backward ends) cannot overlap")
    if key == "grad_view":
        if not step.copy_gbps:
            return CommPrediction(None, "measured only: no copy bandwidth measured")
        sign = -1.0 if value else 1.0
        delta = sign * 4 * step.grad_bytes / (step.copy_gbps * 1e9) * 1e3
        return _after(step, delta, 0.0, f"ΔC = {'−' if value else '+'}2 copies × 2G ÷ copy bandwidth = {4 * step.grad_bytes / MIB:.2f} MiB at "
                                        f"{step.copy_gbps:.1f} GB/s: {'no' if value else 'a'} copy of each gradient into its bucket and of "
                                        "the reduced bucket back")
    if key == "no_sync":
        k0, k = step.micro_batches, int(value)
        o = O or 0.0
        micro = (T - E - o) / k0
        after = E + o + k * micro
        why = "" if O is not None else " (no optimizer pass profiled: O taken as 0)"
        return _after(step, after - T, 0.0, f"T' = E + O + k × (T − E − O) ÷ k₀ = {E:.3f} + {o:.3f} + {k} × ({T:.3f} − {E:.3f} − {o:.3f}) ÷ "
                                            f"{k0}: {k} micro-batches, all but the last without the all-reduce or the optimizer; exposed "
                                            f"communication per micro-batch {E / k0:.3f} → {E / k:.3f} ms{why}")
    return CommPrediction(None, "measured only")


def _switch(step: CommStep, mode: str, options: dict) -> CommPrediction:
    """DDP ↔ FSDP, or FSDP's resharding: the other collectives' modelled time, the same share of it exposed."""
    if step.sweep is None:
        return CommPrediction(None, NO_SWEEP)
    m_old, old_text = collectives_ms(step, step.mode, step.options)
    m_new, new_text = collectives_ms(step, mode, options)
    E = step.exposed_ms
    exposed = E * m_new / m_old if m_old > 0 else 0.0
    n, o = step.world_size, step.optimizer_ms or 0.0
    optimizer = {("ddp", "fsdp"): -o * (n - 1) / n, ("fsdp", "ddp"): o * (n - 1)}.get((step.mode, mode), 0.0)
    why = "" if step.optimizer_ms is not None else " (no optimizer pass profiled: O taken as 0)"
    shard = f"; ΔC = {optimizer:+.3f} ms: the optimizer updates {'a 1/N shard' if mode == 'fsdp' else 'every parameter'}{why}" if optimizer or step.mode != mode else ""
    return _after(step, optimizer, exposed - E, f"E' = E × M' ÷ M = {E:.3f} × {m_new:.3f} ÷ {m_old:.3f} (M: {old_text}; M': {new_text}): the "
                                                f"same share of the collectives' time exposed{shard}")


def _after(step: CommStep, delta_compute: float, delta_exposed: float, text: str) -> CommPrediction:
    compute = step.compute_ms + delta_compute
    exposed = max(0.0, step.exposed_ms + delta_exposed)
    return CommPrediction(compute + exposed, f"{text}; T' = C {compute:.3f} + E {exposed:.3f} ms (base C {step.compute_ms:.3f}, "
                                             f"E {step.exposed_ms:.3f})", compute, exposed)


def fix_step_ms(row: dict) -> float | None:
    """A fix's measured step: its blocks timed interleaved with the base's (``together``), else its own timing; None
    where it failed."""
    if row.get("status") != "ok":
        return None
    return (row.get("together") or {}).get("median_ms") or row.get("median_ms")


@dataclass
class ParallelFix:
    """One communication fix: its spec, the case's data-parallel mode (and mode) after it, its prediction, and its
    measured row with the exposed communication its own profile gives (the slowest rank's, per step)."""

    name: str
    parallel: str  # the case's --parallel after the fix
    mode: str  # eager or compile
    prediction: CommPrediction
    measured: dict = field(default_factory=dict)
    measured_exposed_ms: float | None = None
    base_row: dict = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.prediction.model

    @property
    def measured_ms(self) -> float | None:
        return fix_step_ms(self.measured)

    @property
    def measured_compute_ms(self) -> float | None:
        """The fix's step less its exposed communication (its own profile's), ms; None where either is missing."""
        if self.measured_ms is None or self.measured_exposed_ms is None:
            return None
        return self.measured_ms - self.measured_exposed_ms

    @property
    def error(self) -> float | None:
        return prediction_error(self.prediction.ms, self.measured_ms)

    @property
    def throughput_gain(self) -> float | None:
        """items/s after the fix ÷ the base's (a no_sync step holds k micro-batches): the base's blocks ÷ the fix's
        of the same rounds where the two were interleaved (``base_row["ratio"]``), times items per step after ÷ before."""
        if not self.measured_ms:
            return None
        items = self._items_ratio()
        if self.base_row.get("ratio") is not None and items is not None:
            return self.base_row["ratio"] * items
        after, before = self.measured.get("items_per_s"), self.base_row.get("items_per_s")
        return after / before if after and before else None

    @property
    def throughput_gain_ci95(self) -> list[float] | None:
        """The 95% CI of ``throughput_gain`` over the interleaved rounds; None where the two were not interleaved."""
        ci, items = self.base_row.get("ratio_ci95"), self._items_ratio()
        return [ci[0] * items, ci[1] * items] if ci and items is not None and self.measured_ms else None

    def _items_ratio(self) -> float | None:
        after = (self.measured.get("together") or {}).get("items_per_step") or self.measured.get("items_per_step")
        before = self.base_row.get("items_per_step")
        return after / before if after and before else None

    @property
    def missed_term(self) -> str | None:
        """Past 15%: compute or exposed communication, whichever is further from the fix's own profile."""
        if self.error is None or abs(self.error) <= MISS or self.measured_compute_ms is None or self.prediction.exposed_ms is None:
            return None
        return worst_term({"exposed communication": (self.prediction.exposed_ms, self.measured_exposed_ms),
                           "compute": (self.prediction.compute_ms, self.measured_compute_ms)})

    def to_dict(self) -> dict:
        row = self.measured
        return {"fix": self.name, "parallel": self.parallel, "mode": self.mode, **{f"predicted_{k}": v for k, v in asdict(self.prediction).items()
                                                                                    if k != "model"},
                "model": self.prediction.model, "measured_ms": self.measured_ms, "error": self.error, "status": row.get("status"),
                "message": row.get("message"), "measured_exposed_ms": self.measured_exposed_ms,
                "measured_compute_ms": self.measured_compute_ms,
                "items_per_step": row.get("items_per_step"), "items_per_s": row.get("items_per_s"), "throughput_gain": self.throughput_gain,
                "throughput_gain_ci95": self.throughput_gain_ci95, "interleaved": bool(row.get("together")),
                "alone_ms": row.get("median_ms") if row.get("status") == "ok" else None, "missed_term": self.missed_term, "comm_bus_bytes": row.get("comm_bus_bytes"), "comm_calls": row.get("comm_calls"),
                "peak_mem_alloc_mb": row.get("peak_mem_alloc_mb"), "base_ms": self.base_row.get("median_ms"), "row": row}

