"""Tables in the seeds' shapes, built from result rows (plain dicts; no torch)."""

from __future__ import annotations

from typing import Iterable

from perflab.analysis.regressions import bound_by

# Fields that identify a measurement point apart from the model/method being compared.
POINT_KEYS = ("input_size", "batch_size", "dtype", "mode", "attn", "device")


def point_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in POINT_KEYS)


def speedup_rows(rows: Iterable[dict], baseline: str | None = None) -> list[dict]:
    """Pair each token-reduction row with the baseline row at the same point.

    The baseline of ``topk_deit_base_patch16_224`` is ``deit_base_patch16_224`` unless ``baseline`` names
    another model. Unpaired, speedup = variant throughput / baseline throughput (>1: the variant is faster);
    latency Δ = 1 / speedup − 1. Rows that failed (oom, error) pair as such.
    """
    rows = list(rows)
    by_point = {}
    for row in rows:
        by_point.setdefault((row["model"], point_key(row)), row)
    out = []
    for row in rows:
        if row.get("method", "baseline") == "baseline":
            continue
        base_model = baseline or row["model"].split("_", 1)[1]
        base = by_point.get((base_model, point_key(row)))
        if base is None:
            continue
        out.append(pair(base, row))
    return out


def pair(base: dict, variant: dict) -> dict:
    ok = base.get("status") == "ok" and variant.get("status") == "ok"
    entry = {
        "input_size": variant["input_size"],
        "batch_size": variant["batch_size"],
        "dtype": variant["dtype"],
        "mode": variant["mode"],
        "baseline": base["model"],
        "variant": variant["model"],
        "baseline_status": base.get("status"),
        "variant_status": variant.get("status"),
        "baseline_tp": base.get("throughput_per_s"),
        "variant_tp": variant.get("throughput_per_s"),
        "baseline_ms": base.get("median_ms"),
        "variant_ms": variant.get("median_ms"),
        "baseline_ci95_ms": base.get("ci95_ms"),
        "variant_ci95_ms": variant.get("ci95_ms"),
        "baseline_gflops": base.get("gflops"),
        "variant_gflops": variant.get("gflops"),
        "tokens_pre": (variant.get("tokens") or [None])[0],
        "tokens_post": (variant.get("tokens") or [None])[-1],
        "flags": sorted(set(base.get("flags") or []) | set(variant.get("flags") or [])),
        "speedup": None,
        "latency_delta": None,
        "faster": None,
        "significant": None,
    }
    if ok:
        from perflab.measure.stats import paired_ratio

        unpaired = variant["throughput_per_s"] / base["throughput_per_s"]
        entry["speedup_unpaired"] = unpaired
        paired = paired_ratio(base, variant)  # baseline ms ÷ variant ms over blocks timed next to each other
        if paired is not None:
            # Timed together: the speedup and its CI come from the pairs, where a slow stretch of the host cancels.
            entry.update(speedup=paired["ratio"], speedup_ci95=paired["ci95"], paired=True, pairs=paired["pairs"])
            entry["significant"] = not (paired["ci95"][0] <= 1.0 <= paired["ci95"][1])
        else:
            entry.update(speedup=unpaired, paired=False)
            # Non-overlapping 95% CIs of the medians: the difference is not noise.
            b_lo, b_hi = base.get("ci95_ms") or (None, None)
            v_lo, v_hi = variant.get("ci95_ms") or (None, None)
            if None not in (b_lo, b_hi, v_lo, v_hi):
                entry["significant"] = v_hi < b_lo or v_lo > b_hi
        entry["latency_delta"] = 1.0 / entry["speedup"] - 1.0
        entry["faster"] = entry["speedup"] > 1.0
        entry["host_dependent"] = host_dependent(base, variant)
    return entry


def host_dependent(base: dict, variant: dict) -> str | None:
    """Why the pair's speedup depends on the host's speed (None when it does not, or is unknown): one side's step is
    limited by the host and the other's by the GPU, or one sits at the boundary. Pairing in time cancels a host
    slowdown only where it lengthens both steps alike; here it lengthens one."""
    bounds = (bound_by(base), bound_by(variant))
    if None in bounds or bounds[0] == bounds[1] != "both":
        return None
    names = {"host": "launch-bound", "gpu": "GPU-bound", "both": "at the host/GPU boundary"}
    return f"baseline {names[bounds[0]]}, variant {names[bounds[1]]}: the speedup moves with the host's speed"
