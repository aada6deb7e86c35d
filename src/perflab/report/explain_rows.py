"""The rows of explain's tables, built once for the console (``explain_console``) and markdown (``explain_markdown``).
Torch-free. MFU is of counted FLOPs (``torch.utils.flop_counter`` on the real step) wherever a row has them; the
analytic count stands beside it with the ratio (``flops_line``)."""

from __future__ import annotations

from perflab.report.md import num, pct

MODES_TITLE = ("Modes: predicted vs measured (untraced harness); first step = seconds to the first step done (compile, capture; with "
               "--compile-budget, the cold compile in its child process in brackets); MFU of counted FLOPs")
FIXES_TITLE = ("Fixes on their base (the best mode measured, unless said): predicted (model below) vs measured (untraced harness); "
               "host and GPU ms per step predicted / measured (held timing); MFU of counted FLOPs")
MODE_HEADER = ["mode", "predicted ms", "measured ms", "error", "speedup vs eager", "first step s", "MFU"]
FIX_HEADER = ["#", "fix", "on", "predicted ms", "measured ms", "error", "vs base", "vs eager", "host ms pred / meas", "GPU ms pred / meas",
              "first step s", "peak GiB", "MFU"]
BATCH_HEADER = ["batch", "on", "ms per step", "tokens/s", "MBU", "latency cost ms"]
FLOORS_TITLE = "Floors (ms per step) and how far the eager step is from each"
FLOOR_HEADER = ["floor (whole step)", "ms", "measured ÷ floor"]
FLOOR_LABELS = {"compute": "compute (FLOPs ÷ peak matmul)", "memory": "memory (bytes ÷ copy bandwidth)",
                "launch": "launch (kernels × min interval)", "host": "host (CPU time to issue a step, untraced)"}
PASS_TITLE = "Floors per pass (ms per step); the step's floor = Σ the passes' binding floors; FLOPs counted (the formula's beside)"
PASS_HEADER = ["pass", "TFLOP (counted)", "TFLOP (formula)", "GB", "kernels", "compute ms", "memory ms", "launch ms", "host ms", "binding",
               "floor ms", "profiled GPU ms", "GPU ÷ floor"]


def profile_lines(ce) -> list[str]:
    """The traced step against the untraced one, and where its wall time went."""
    p = ce.profile
    idle = ", ".join(f"{k.replace('_', ' ')} {v / 1e6:.4f} ms" for k, v in p.idle_ns.items())
    return [f"Untraced eager median {ce.eager_ms:.4f} ms; traced step {ce.traced_step_ms:.4f} ms (profiler inflation ×{ce.inflation:.2f}); "
            f"{p.kernels:.0f} kernels per step, mean {p.mean_kernel_ns / 1e3:.2f} µs; GPU busy {p.busy_ns / p.wall_ns:.0%} of the traced step.",
            f"Per traced step: wall {p.wall_ns / 1e6:.4f} ms = GPU busy {p.busy_ns / 1e6:.4f} ms + idle ({idle}).",
            f"CPU time to issue one step: {ce.host_issue_ms:.4f} ms untraced, {ce.traced_host_issue_ms:.4f} ms under the profiler."]


def floor_rows(f) -> list[list[str]]:
    """The whole step's four floors, the binding one marked, and the measured step over each."""
    ratios = f.ratios()
    return [[FLOOR_LABELS[name] + (" ◀ binding" if name == f.binding else ""), f"{ms:.4f}", f"{ratios[name]:.2f}×"]
            for name, ms in f.by_limit.items()]


def floor_verdict(f) -> str:
    u = f.utilisation()
    line = (f"Whole step: **{f.verdict}** (binding floor: {f.binding}); MFU {pct(u['measured']['mfu'])}, MBU {pct(u['measured']['mbu'])} "
            f"(counted FLOPs, least bytes); at the binding floor MFU {pct(u['ceiling']['mfu'])}, MBU {pct(u['ceiling']['mbu'])}.")
    if f.kernels_set_the_step:
        worst = max(("memory", f.memory_ms), ("compute", f.compute_ms), key=lambda kv: kv[1])
        line += (f" But the kernels set this step, not the launches: the GPU is busy {f.gpu_busy_ms:.4f} ms a traced step, longer than "
                 f"the {f.host_ms:.4f} ms the host takes to issue it, and {f.gpu_busy_ms / worst[1]:.1f}× the {worst[0]} floor; removing "
                 f"launches (a CUDA graph) cannot take it below {f.gpu_busy_ms:.4f} ms: look at the top kernels.")
    return line


def step_floor_lines(sf) -> list[str]:
    """The step's floor (Σ the passes' binding floors) against the eager step, and the MFU and MBU it allows."""
    d = sf.to_dict()
    by_limit = ", ".join(f"{name} {ms:.3f}" for name, ms in sf.by_limit.items() if ms > 0)
    return [f"Step floor (Σ the passes' binding floors) **{sf.floor_ms:.3f} ms** ({by_limit}): **{sf.verdict}** (binding: {sf.binding}); "
            f"the untraced eager step {sf.measured_ms:.3f} ms is {d['measured_over_floor']:.2f}× its floor.",
            f"MFU {pct(d['mfu'])} (counted FLOPs; {pct(d['mfu_analytic'])} by the formula) and MBU {pct(d['mbu'])} of the measured peak "
            f"and copy bandwidth (this step's least bytes); the floors allow at best MFU {pct(d['ceiling_mfu'])}, MBU {pct(d['ceiling_mbu'])}."]


def pass_rows(sf) -> list[list[str]]:
    """Per-pass floors: the counted FLOPs (the formula's split scaled to the step's count) and the formula's beside them."""
    return [[p.name, f"{p.flops / 1e12:.3f}", num(p.flops_analytic / 1e12 if p.flops_analytic is not None else None, ".3f"),
             f"{p.bytes / 1e9:.3f}", f"{p.kernels:.0f}", f"{p.compute_ms:.3f}", f"{p.memory_ms:.3f}", f"{p.launch_ms:.3f}", f"{p.host_ms:.3f}",
             p.binding, f"{p.floor_ms:.3f}", num(p.gpu_ms, ".3f"), num(p.gpu_over_floor, ".2f")] for p in sf.passes]


def _gib(mb) -> str:
    return num(mb / 1024 if mb else None, ".2f")


def first_step(row: dict) -> str:
    """Seconds to the first step done (compile, capture), and, where the compile ran first in a child process within
    --compile-budget, that cold compile beside it (the measuring process's compile then read inductor's caches)."""
    cold = row.get("compile_cold_s")
    return num(row.get("first_step_s"), ".1f") + (f" (cold {cold:.1f})" if cold is not None else "")


def _pair(predicted, measured) -> str:
    return f"{num(predicted, '.2f')} / {num(measured, '.2f')}"


def mode_rows(ce) -> list[list[str]]:
    """eager, then each measured mode: its prediction, measured median and the error ``mode_miss`` holds to 15%."""
    from perflab.analysis.fixes import prediction_error

    row = ce.eager_row
    rows = [["eager", "–", f"{ce.eager_ms:.3f}", "–", "1.00×", first_step(row), pct(row.get("mfu"))]]
    for mode, r in ce.measured.items():
        pred = ce.predictions_ms.get(mode)
        if r.get("status") != "ok":
            rows.append([mode, num(pred, ".3f"), f"{r.get('status')}: {r.get('message')}", "–", "–", first_step(r), "–"])
            continue
        rows.append([mode, num(pred, ".3f"), f"{r['median_ms']:.3f}", num(prediction_error(pred, r["median_ms"]) if pred else None, "+.1%"),
                     f"{ce.eager_ms / r['median_ms']:.2f}×", first_step(r), pct(r.get("mfu"))])
    return rows


def mode_miss_lines(ce) -> list[str]:
    """Each mode whose prediction missed by more than 15%, with why (``CaseExplanation.mode_misses``)."""
    return [f"{mode}: {reason}" for mode, reason in ce.mode_misses().items()]


def fix_rows(ce) -> list[list[str]]:
    """One row per base (eager, and each mode a fix was applied on, as timed with its fixes), then one per fix."""
    from perflab.analysis.fixes import measured_host_ms

    eager = ce.eager_row
    rows = [["", "eager (as profiled)", "", "–", f"{ce.eager_ms:.3f}", "–", "–", "1.00×", _pair(None, measured_host_ms(eager)),
             _pair(None, eager.get("device_ms")), num(eager.get("first_step_s"), ".1f"), _gib(eager.get("peak_mem_alloc_mb")), pct(eager.get("mfu"))]]
    seen = set()
    for fx in ce.fix_results:
        b = fx.base_row
        if fx.base == "eager" or fx.base in seen or b.get("status") != "ok" or fx.eager_only or "mode" in fx.changes:
            continue
        seen.add(fx.base)
        rows.append(["", f"{fx.base} (base, timed with its fixes)", "", "–", f"{b['median_ms']:.3f}", "–", "1.00×",
                     f"{ce.eager_ms / b['median_ms']:.2f}×", _pair(None, measured_host_ms(b)), _pair(None, b.get("device_ms")),
                     first_step(b), _gib(b.get("peak_mem_alloc_mb")), pct(b.get("mfu"))])
    for i, fx in enumerate(ce.fix_results, 1):
        r = fx.measured
        on = "as given" if "mode" in fx.changes else (f"eager only ({fx.eager_only})" if fx.eager_only else fx.base)
        if r.get("status") != "ok":
            rows.append([str(i), f"`{fx.name}`", on, num(fx.predicted_ms, ".3f"), f"{r.get('status')}: {r.get('message')}"] + ["–"] * 8)
            continue
        vs_base = fx.base_ms / fx.measured_ms if fx.base_ms and "mode" not in fx.changes else None
        rows.append([str(i), f"`{fx.name}`", on, num(fx.predicted_ms, ".3f"), f"{fx.measured_ms:.3f}", num(fx.error, "+.1%"),
                     num(vs_base, ".2f") + ("×" if vs_base else ""), f"{ce.eager_ms / fx.measured_ms:.2f}×",
                     _pair(fx.predicted_host_ms, measured_host_ms(r)), _pair(fx.predicted_gpu_ms, r.get("device_ms")),
                     first_step(r), _gib(r.get("peak_mem_alloc_mb")), pct(r.get("mfu"))])
    return rows


def fix_model_lines(ce) -> list[str]:
    """Each fix's model in one line, and where a prediction missed by more than 15%, the term that missed."""
    out = []
    for i, fx in enumerate(ce.fix_results, 1):
        missed = fx.missed_term
        out.append(f"{i}. `{fx.name}`: {fx.model}" + (f". **Missed by {fx.error:+.1%}, most in the {missed}**" if missed else ""))
    return out


def batch_rows(ce) -> list[list[str]]:
    """decode's batch fixes as throughput against latency, each against its base's batch."""
    batches = [fx for fx in ce.fix_results if set(fx.changes) == {"batch_size"}]
    if not batches:
        return []
    rows, seen = [], set()
    for fx in batches:
        base = fx.base_row if fx.base_row.get("status") == "ok" else ce.eager_row
        if fx.base not in seen:
            seen.add(fx.base)
            rows.append([str(base.get("batch_size")), fx.base, num(base.get("median_ms"), ".3f"), num(base.get("tokens_per_s"), ".1f"),
                         pct(base.get("mbu")), "0"])
        if fx.measured_ms is None:
            rows.append([str(fx.changes["batch_size"]), fx.base, str(fx.measured.get("status")), "–", "–", "–"])
            continue
        rows.append([str(fx.changes["batch_size"]), fx.base, f"{fx.measured_ms:.3f}", num(fx.measured.get("tokens_per_s"), ".1f"),
                     pct(fx.measured.get("mbu")), num(fx.measured_ms - base["median_ms"] if base.get("median_ms") else None, "+.3f")])
    return rows


def ranked_line(ce) -> str | None:
    ranked = [fx for fx in ce.fixes() if fx.get("speedup")]
    if not ranked:
        return None
    return "; ".join(f"{i + 1}. `{fx['fix']}`{' on ' + fx['on'] if fx.get('on') not in (None, 'eager') else ''} {fx['speedup']:.2f}× "
                     f"({fx['measured_ms']:.3f} ms)" for i, fx in enumerate(ranked))


def flops_line(row: dict) -> str:
    """Which FLOP count a row's MFU uses, and the other count beside it: counted (the step's real ops under torch's flop
    counter) where the row has them; the family's formula's count and counted ÷ formula."""
    counted = row.get("gflops_per_batch")
    analytic = row.get("flops_analytic")
    if not counted:
        return "MFU: no FLOPs counted for this row"
    text = f"MFU of counted FLOPs ({counted / 1e3:.3f} TFLOP per step)"
    if analytic:
        text += f"; the formula's {analytic / 1e12:.3f} TFLOP, counted ÷ formula {counted * 1e9 / analytic:.4f}"
        if row.get("mfu") is not None:
            text += f", MFU by the formula's count {row['mfu'] * analytic / (counted * 1e9):.1%}"
    return text


def compile_line(name: str, c: dict, backend_note: str = "") -> str:
    """What compiling did for one compiled row (``row["compile"]``, ``runtime.modes.compile_stats``): frames, dynamo
    graphs, the graphs its backend compiled, graph breaks with their commonest reasons, and frames compiled again
    during the timed steps (a recompile there times compilation)."""
    from perflab.measure.checks import break_reasons_text

    reasons = break_reasons_text(c)
    return (f"Compile, {name}: {c['frames']} frame(s) compiled, {c['graphs']} dynamo graph(s), {c['backend_graphs']} compiled by the "
            f"backend{backend_note}, {c['graph_breaks']} graph break(s){': ' + reasons if reasons else ''}; "
            f"{c['frames_compiled_while_timed']} frame(s) compiled again while timed"
            + (" (the timed steps include compilation)" if c["frames_compiled_while_timed"] else "") + ".")


def compile_lines(ce) -> list[str]:
    """One GPU: what compiling did in each compiled mode measured and each compiled fix."""
    named = [(f"`{mode}`", r) for mode, r in ce.measured.items()] + [(f"fix `{fx.name}`", fx.measured) for fx in ce.fix_results]
    return [compile_line(name, r["compile"]) for name, r in named if r and r.get("compile")]
