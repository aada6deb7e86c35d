"""explain's result as markdown (``perflab explain --markdown FILE``, benchmarks/explain_training.py): the same
tables as the console, for docs/performance.md. Torch-free."""

from __future__ import annotations

from perflab.report.explain_rows import (BATCH_HEADER, FIX_HEADER, FIXES_TITLE, FLOOR_HEADER, MODE_HEADER, PASS_HEADER, batch_rows, compile_lines,
                                         fix_model_lines, fix_rows, floor_rows, floor_verdict, flops_line, mode_miss_lines, mode_rows, pass_rows,
                                         profile_lines, ranked_line, step_floor_lines)
from perflab.report.md import md_table


def case_markdown(ce, device: str = "") -> str:
    out = [f"### {ce.case.label()}" + (f" ({device})" if device else ""), ""]
    out += [" ".join(profile_lines(ce)), ""]
    out += [md_table(FLOOR_HEADER, floor_rows(ce.floors)), "", floor_verdict(ce.floors), ""]
    sf = ce.step_floors
    if sf is not None:
        out += [md_table(PASS_HEADER, pass_rows(sf)), "", " ".join(step_floor_lines(sf)), ""]
    out += [flops_line(ce.eager_row) + ".", ""]
    if ce.measured:
        out += [md_table(MODE_HEADER, mode_rows(ce)), ""]
        misses = mode_miss_lines(ce)
        if misses:
            out += [f"- {line}" for line in misses] + [""]
    if ce.fix_results:
        out += [f"{FIXES_TITLE}:", "", md_table(FIX_HEADER, fix_rows(ce)), ""] + fix_model_lines(ce) + [""]
        batches = batch_rows(ce)
        if batches:
            out += [md_table(BATCH_HEADER, batches), ""]
    compiled = compile_lines(ce)
    if compiled:
        out += [" ".join(compiled), ""]
    ranked = ranked_line(ce)
    if ranked:
        out += ["Ranked by measured gain over eager: " + ranked, ""]
    return "\n".join(out)


def explanation_markdown(explanation, device: str = "") -> str:
    if getattr(explanation, "parallel", False):  # explain --parallel
        from perflab.report.explain_parallel import parallel_markdown

        return parallel_markdown(explanation, device)
    return "\n".join(case_markdown(ce, device) for ce in explanation.cases)
