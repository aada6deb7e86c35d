"""explain's result as markdown (``perflab explain --markdown FILE``, benchmarks/explain_training.py): the same
tables as the console, for docs/performance.md. Torch-free."""

from __future__ import annotations


from perflab.report.md import md_table
from perflab.report.md import num as _num
from perflab.report.md import pct as _pct


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return md_table(header, rows).splitlines()


def case_markdown(ce, device: str = "") -> str:
    row = ce.eager_row
    out = [f"### {ce.case.label()}" + (f" ({device})" if device else ""), ""]
    out.append(f"Untraced eager step {ce.eager_ms:.3f} ms (MFU {_pct(row.get('mfu'))}, MBU {_pct(row.get('mbu'))}); traced "
               f"{ce.traced_step_ms:.3f} ms (profiler ×{ce.inflation:.2f}); {ce.profile.kernels:.0f} kernels per step; CPU time to issue "
               f"a step {ce.host_issue_ms:.3f} ms untraced.")
    out.append("")
    f = ce.floors
    ratios = f.ratios()
    out += _table(["floor (whole step)", "ms", "measured ÷ floor"],
                  [[name + (" ◀" if name == f.binding else ""), f"{ms:.3f}", f"{ratios[name]:.2f}×"] for name, ms in f.by_name.items()])
    u = f.utilisation()
    out += ["", f"Whole step: **{f.verdict}**; MFU {_pct(u['measured']['mfu'])}, MBU {_pct(u['measured']['mbu'])} (counted FLOPs, least bytes); "
                f"at the binding floor MFU {_pct(u['ceiling']['mfu'])}, MBU {_pct(u['ceiling']['mbu'])}.", ""]
    sf = ce.step_floors
    if sf is not None:
        rows = [[p.name, f"{p.flops / 1e12:.3f}", f"{p.bytes / 1e9:.3f}", f"{p.kernels:.0f}", f"{p.compute_ms:.3f}", f"{p.memory_ms:.3f}",
                 f"{p.launch_ms:.3f}", f"{p.host_ms:.3f}", p.binding, f"{p.floor_ms:.3f}", _num(p.gpu_ms, ".3f"),
                 _num(p.gpu_over_floor, ".2f")] for p in sf.passes]
        out += _table(["pass", "TFLOP", "GB", "kernels", "compute ms", "memory ms", "launch ms", "host ms", "binding", "floor ms",
                       "profiled GPU ms", "GPU ÷ floor"], rows)
        d = sf.to_dict()
        by_limit = ", ".join(f"{name} {ms:.3f}" for name, ms in sf.by_limit.items() if ms > 0)
        out += ["", f"Step floor (Σ the passes' binding floors) **{sf.floor_ms:.3f} ms** ({by_limit}): {sf.verdict}; the eager step is "
                    f"{d['measured_over_floor']:.2f}× it. MFU {_pct(d['mfu'])}, MBU {_pct(d['mbu'])} (this step's FLOPs and least bytes); "
                    f"at its floor the step would reach MFU {_pct(d['ceiling_mfu'])}, MBU {_pct(d['ceiling_mbu'])}.", ""]
    rows = [["eager", "–", f"{ce.eager_ms:.3f}", "–", "1.00×", _num(row.get("first_step_s"), ".1f"), _pct(row.get("mfu"))]]
    for mode, r in ce.measured.items():
        pred = ce.predictions_ms.get(mode)
        if r.get("status") != "ok":
            rows.append([mode, _num(pred, ".3f"), f"{r.get('status')}: {r.get('message')}", "–", "–", "–", "–"])
            continue
        rows.append([mode, _num(pred, ".3f"), f"{r['median_ms']:.3f}", f"{pred / r['median_ms'] - 1:+.1%}" if pred else "–",
                     f"{ce.eager_ms / r['median_ms']:.2f}×", _num(r.get("first_step_s"), ".1f"), _pct(r.get("mfu"))])
    if ce.measured:
        out += _table(["mode", "predicted ms", "measured ms", "error", "speedup", "first step s", "MFU"], rows) + [""]
    if ce.fix_results:
        rows = []
        for i, fx in enumerate(ce.fix_results, 1):
            r = fx.measured
            if r.get("status") != "ok":
                rows.append([str(i), f"`{fx.name}`", _num(fx.predicted_ms, ".3f"), f"{r.get('status')}: {r.get('message')}", "–", "–", "–", "–", "–"])
                continue
            mem = r.get("peak_mem_alloc_mb")
            rows.append([str(i), f"`{fx.name}`", _num(fx.predicted_ms, ".3f"), f"{fx.measured_ms:.3f}", _num(fx.error, "+.1%"),
                         f"{ce.eager_ms / fx.measured_ms:.2f}×", _num(r.get("first_step_s"), ".1f"), _num(mem / 1024 if mem else None, ".2f"),
                         _pct(r.get("mfu"))])
        eager_mem = row.get("peak_mem_alloc_mb")
        rows.insert(0, ["", "eager", "–", f"{ce.eager_ms:.3f}", "–", "1.00×", _num(row.get("first_step_s"), ".1f"),
                        _num(eager_mem / 1024 if eager_mem else None, ".2f"), _pct(row.get("mfu"))])
        out += _table(["#", "fix", "predicted ms", "measured ms", "error", "speedup", "first step s", "peak GiB", "MFU"], rows)
        out += [""] + [f"{i}. `{fx.name}`: {fx.model}" for i, fx in enumerate(ce.fix_results, 1)] + [""]
        batches = [fx for fx in ce.fix_results if set(fx.changes) == {"batch_size"} and fx.measured_ms]
        if batches:
            rows = [[str(row.get("batch_size")), f"{ce.eager_ms:.3f}", _num(row.get("tokens_per_s"), ".1f"), _pct(row.get("mbu")), "0"]]
            rows += [[str(fx.changes["batch_size"]), f"{fx.measured_ms:.3f}", _num(fx.measured.get("tokens_per_s"), ".1f"),
                      _pct(fx.measured.get("mbu")), f"{fx.measured_ms - ce.eager_ms:+.3f}"] for fx in batches]
            out += _table(["batch", "ms per step", "tokens/s", "MBU", "latency cost ms"], rows) + [""]
    ranked = [fx for fx in ce.fixes() if fx.get("speedup")]
    if ranked:
        out += ["Ranked by measured gain: " + "; ".join(f"{i + 1}. `{fx['fix']}` {fx['speedup']:.2f}× ({fx['measured_ms']:.3f} ms)"
                                                       for i, fx in enumerate(ranked)), ""]
    return "\n".join(out)


def explanation_markdown(explanation, device: str = "") -> str:
    return "\n".join(case_markdown(ce, device) for ce in explanation.cases)
