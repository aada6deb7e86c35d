"""perflab explain for an lm training step on a GPU, with every fix measured on the best mode: per-pass floors, the modes
and the fixes each predicted then measured (error, host and GPU terms, seconds to the first step, peak memory, MFU of
counted FLOPs), and optionally the same best fix on transformers' Llama of the same shape.

    PYTHONPATH=src python benchmarks/explain_training.py explain_gpt_large.md
        [--model gpt_large] [--workload train_step] [--seq-len 512] [--batch-size 4] [--dtype bf16]
        [--modes cudagraph compile:reduce-overhead] [--fixes optimizer:foreach ... | none] [--fixes-on best|eager|MODE]
        [--combos SPEC ... | none] [--vs-transformers] [--min-time 1.0] [--warmup 10] [--steps 3] [--json FILE]

It is ``perflab explain MODEL --workload train_step ...`` run in stages, each case timed alone (``perflab explain``
times them together, interleaved, which pairs them in time; this script trades that for a file rewritten after every
measurement, so a run cut short still leaves what it measured): the eager case is timed, profiled and explained first
(floors, per-pass floors), then each mode, then each fix on the fastest measured (``--fixes-on best``, the default) or
on the base named, then each combination as given. Fixes default to the family's (for train_step: optimizer:foreach,
optimizer:in_backward, optimizer:in_backward_stream, checkpoint). To fit a time budget, drop modes or fixes
(``--modes compile:reduce-overhead --fixes optimizer:in_backward_stream``) or time less (``--min-time 0.5 --warmup 5``).
Progress goes to stderr with the seconds elapsed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from perflab import api
from perflab.analysis.fixes import Fix
from perflab.errors import PerflabError
from perflab.diagnosis.explanation import FIXES_ON, best_mode, case_fixes, explanation_of, parse_fix, plan_fixes, predict_fix
from perflab.report.explain_markdown import explanation_markdown
from perflab.spec import validate_case

START = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f} s] {message}", file=sys.stderr, flush=True)


def write(path: Path, explanation, extra: list[str], device: str) -> None:
    path.write_text(explanation_markdown(explanation, device) + "\n" + "\n".join(extra) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("markdown", type=Path, help="Markdown file to write (rewritten after every measurement).")
    parser.add_argument("--model", default="gpt_large")
    parser.add_argument("--workload", default="train_step")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--modes", nargs="*", default=["cudagraph", "compile:reduce-overhead"])
    parser.add_argument("--fixes", nargs="*", default=None, help="Fix specs; default: the family's; 'none': none.")
    parser.add_argument("--fixes-on", default="best", help="best (the fastest mode measured, the default), eager, or a mode.")
    parser.add_argument("--combos", nargs="*", default=None, help="Combined fixes (a+b), measured as given; default: none.")
    parser.add_argument("--vs-transformers", action="store_true", help="Also run the best measured fix on transformers' Llama of the same shape.")
    parser.add_argument("--min-time", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=3, help="Steps in the profiled pass.")
    parser.add_argument("--out-dir", type=Path, default=Path("perflab-traces"))
    parser.add_argument("--json", type=Path, default=None, help="Also write explain's JSON here.")
    args = parser.parse_args(argv)

    import torch

    from perflab.measure.harness import run_case

    try:
        (case,) = api.make_cases(model=[args.model], workload=[args.workload], seq_len=[args.seq_len], batch_size=[args.batch_size],
                                 dtype=[args.dtype], mode=["eager"], device="cuda", warmup=args.warmup, min_time=args.min_time,
                                 repeats=args.repeats)
        fixes = case_fixes(case, args.fixes)
        for spec in fixes + [c for c in (args.combos or []) if c != "none"]:  # bad input fails now, not after minutes
            validate_case(replace(case, **parse_fix(spec)))
        for mode in args.modes:
            validate_case(replace(case, mode=mode))
        if args.fixes_on not in FIXES_ON + tuple(args.modes):
            raise PerflabError(f"--fixes-on {args.fixes_on!r}: use best, eager, or one of --modes ({', '.join(args.modes)})")
    except PerflabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    extra: list[str] = []
    log(f"{case.label()} on {device}: eager, profile, floors")
    try:
        explanation = explanation_of(case, None, args.out_dir, steps=args.steps, modes=(), on_stage=log, fixes=["none"])
    except PerflabError as exc:  # e.g. the eager case could not be measured (an OOM): one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ce = explanation.cases[0]
    write(args.markdown, explanation, extra, device)
    sf = ce.step_floors
    if sf is not None:
        for p in sf.passes:
            log(f"  pass {p.name}: floors compute {p.compute_ms:.3f} memory {p.memory_ms:.3f} launch {p.launch_ms:.3f} host {p.host_ms:.3f} ms "
                f"→ {p.binding} {p.floor_ms:.3f} ms; profiled GPU {p.gpu_ms if p.gpu_ms is None else round(p.gpu_ms, 3)} ms")
        d = sf.to_dict()
        log(f"  step floor {sf.floor_ms:.3f} ms ({sf.binding}); eager {ce.eager_ms:.3f} ms; MFU {d['mfu']:.1%} (ceiling {d['ceiling_mfu']:.1%}), "
            f"MBU {d['mbu']:.1%} (ceiling {d['ceiling_mbu']:.1%})")

    for mode in args.modes:
        log(f"mode {mode} (predicted {ce.predictions_ms.get(mode, float('nan')):.3f} ms)")
        row = ce.measured[mode] = run_case(replace(case, mode=mode))
        log(f"  {mode}: {row.get('median_ms') or row.get('status')} ms, first step {row.get('first_step_s')} s, MFU {row.get('mfu')}")
        write(args.markdown, explanation, extra, device)

    base = best_mode(ce.eager_row, ce.measured) if args.fixes_on == "best" else args.fixes_on
    base_row = ce.eager_row if base == "eager" else ce.measured[base]
    log(f"fixes on {base} ({base_row.get('median_ms')} ms)")

    def measure_fix(spec: str, changes: dict, fix_case, on: str, eager_only) -> None:
        row = ce.eager_row if on == "eager" else ce.measured.get(on, {})
        prediction = predict_fix(ce.fix_context, spec, changes, on, row) if "mode" in changes or row.get("status") == "ok" else None
        fix = Fix(spec, changes, prediction and prediction.ms, prediction.model if prediction else f"{on} failed", base=on, base_row=row,
                  eager_only=eager_only, predicted_host_ms=prediction and prediction.host_ms, predicted_gpu_ms=prediction and prediction.gpu_ms)
        log(f"fix {spec} on {on} (predicted {fix.predicted_ms if fix.predicted_ms is None else round(fix.predicted_ms, 3)} ms: {fix.model})")
        fix.measured = run_case(fix_case)
        ce.fix_results.append(fix)
        log(f"  {spec}: {fix.measured_ms or fix.measured.get('status')} ms, error {fix.error}, first step {fix.measured.get('first_step_s')} s, "
            f"peak {fix.measured.get('peak_mem_alloc_mb')} MiB (above {fix.measured.get('memory_baseline_mb')} MiB held before), "
            f"MFU {fix.measured.get('mfu')}" + (f"; missed: {fix.missed_term}" if fix.missed_term else ""))
        write(args.markdown, explanation, extra, device)

    combos = [c for c in (args.combos or []) if c != "none"]
    for plan in plan_fixes(case, [(spec, parse_fix(spec)) for spec in fixes + combos], base):
        measure_fix(*plan[:2], plan[2], plan[3], plan[4])

    best = min((fx for fx in ce.fixes() if fx.get("measured_ms")), key=lambda fx: fx["measured_ms"], default=None)
    if best is not None:
        row = next((fx.measured for fx in ce.fix_results if fx.name == best["fix"]), None) or ce.measured.get(best["fix"], {})
        mfu, first = row.get("mfu"), row.get("first_step_s")
        formula = row.get("mfu_analytic")
        extra.append(f"Best measured: `{best['fix']}` {best['measured_ms']:.3f} ms, {best['speedup']:.2f}× eager, MFU "
                     f"{'–' if mfu is None else format(mfu, '.1%')} of the measured peak ({row.get('peak_tflops_measured')} TFLOP/s) by counted "
                     f"FLOPs ({'–' if formula is None else format(formula, '.1%')} by the formula's, counted ÷ formula "
                     f"{row.get('flops_counted_over_analytic') or float('nan'):.4f}), "
                     f"first step {'–' if first is None else format(first, '.1f')} s.")
        log(extra[-1])
        write(args.markdown, explanation, extra, device)
        if args.vs_transformers and case.family == "lm":
            sys.path.insert(0, str(Path(__file__).parent))
            from lm_vs_transformers import measure

            fixed = replace(case, warmup=5, repeats=10, **parse_fix(best["fix"]))  # a mode, a fix or a combination
            pair = {}
            for impl in ("perflab", "transformers"):
                log(f"{impl} with {best['fix']}")
                try:
                    pair[impl] = measure(fixed, impl)
                except Exception as exc:  # reported, not fatal
                    pair[impl] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
                    torch.cuda.empty_cache()
                log(f"  {json.dumps(pair[impl])}")
            a, b = pair["perflab"], pair["transformers"]
            if "error" in a or "error" in b:
                extra.append(f"Same fix on transformers' Llama: perflab {a.get('error') or a['median_ms']}, transformers {b.get('error') or b['median_ms']}.")
            else:
                extra.append(f"Same fix (`{best['fix']}`) in benchmarks/lm_vs_transformers.py's harness: perflab {a['median_ms']:.3f} ms "
                             f"(MFU {a['mfu']:.1%}), transformers' Llama {b['median_ms']:.3f} ms (MFU {b['mfu']:.1%}; counted FLOPs), ratio "
                             f"{b['median_ms'] / a['median_ms']:.3f}.")
            write(args.markdown, explanation, extra, device)
    if args.json:
        args.json.write_text(json.dumps(dict(explanation.to_dict(), notes=extra)))
    print(args.markdown.read_text())
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
