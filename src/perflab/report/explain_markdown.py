"""explain's result as markdown (``perflab explain --markdown FILE``, benchmarks/explain_training.py): the same
tables as the console, for docs/performance.md. Torch-free."""

from __future__ import annotations


from perflab.report.explain_rows import (BATCH_HEADER, FIX_HEADER, FIXES_TITLE, MODE_HEADER, PASS_HEADER, batch_rows, fix_model_lines, fix_rows,
                                         flops_line, mode_rows, pass_rows, ranked_line)
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
        out += _table(PASS_HEADER, pass_rows(sf))
        d = sf.to_dict()
        by_limit = ", ".join(f"{name} {ms:.3f}" for name, ms in sf.by_limit.items() if ms > 0)
        out += ["", f"Step floor (Σ the passes' binding floors) **{sf.floor_ms:.3f} ms** ({by_limit}): {sf.verdict}; the eager step is "
                    f"{d['measured_over_floor']:.2f}× it. MFU {_pct(d['mfu'])} (counted FLOPs; {_pct(d['mfu_analytic'])} by the formula), "
                    f"MBU {_pct(d['mbu'])} (least bytes); at its floor the step would reach MFU {_pct(d['ceiling_mfu'])}, "
                    f"MBU {_pct(d['ceiling_mbu'])}.", ""]
    out += [flops_line(row) + ".", ""]
    if ce.measured:
        out += _table(MODE_HEADER, mode_rows(ce)) + [""]
    if ce.fix_results:
        out += [f"{FIXES_TITLE}:", ""] + _table(FIX_HEADER, fix_rows(ce)) + [""] + fix_model_lines(ce) + [""]
        batches = batch_rows(ce)
        if batches:
            out += _table(BATCH_HEADER, batches) + [""]
    ranked = ranked_line(ce)
    if ranked:
        out += ["Ranked by measured gain over eager: " + ranked, ""]
    return "\n".join(out)


def explanation_markdown(explanation, device: str = "") -> str:
    return "\n".join(case_markdown(ce, device) for ce in explanation.cases)
