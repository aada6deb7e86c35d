"""perflab's public Python API.

    import perflab
    rows = perflab.bench(perflab.api.make_cases(model=["deit_base_patch16_224"], batch_size=[1, 64]))

Heavy modules (torch) are imported inside the functions that need them, so that trace analysis stays
torch-free.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from perflab.spec import Case, expand_grid, validate_case


def make_cases(
    model: Sequence[str],
    input_size: Sequence[int] = (224,),
    batch_size: Sequence[int] = (1,),
    keep_rate: Sequence[float] = (),
    reduction_loc: Sequence[int] = (),
    attn: str = "sdpa",
    dtype: Sequence[str] = ("fp32",),
    mode: Sequence[str] = ("eager",),
    device: str = "auto",
    warmup: int = 10,
    min_time: float = 1.0,
    iters: int | None = None,
    repeats: int = 20,
    seed: int = 0,
) -> list[Case]:
    """Every combination of the multi-valued arguments, validated (PerflabError on bad input).

    ``keep_rate`` and ``reduction_loc`` apply to the token-reducing models among ``model`` (so a baseline and
    its top-k variant can be measured in one call); giving them with no reducing model is an error.
    """
    from perflab.models.registry import parse_model_name
    from perflab.runtime.device import resolve_device

    device = resolve_device(device)
    reducing = {m for m in model if parse_model_name(m).reduces_tokens}
    base = dict(attn=attn, device=device, warmup=warmup, min_time=min_time, iters=iters, repeats=repeats, seed=seed)
    grid = dict(model=list(model), input_size=list(input_size), batch_size=list(batch_size), dtype=list(dtype), mode=list(mode))
    cases = []
    for d in expand_grid(base, grid):
        if d["model"] in reducing or not reducing:
            d.update(keep_rate=tuple(keep_rate), reduction_loc=tuple(reduction_loc))
        cases.append(validate_case(Case(**d)))
    return cases


def bench(cases: Iterable[Case], on_case: Callable[[int, Case, str], None] | None = None) -> list[dict]:
    """Measure each case in this process; an OOM or failure in one becomes its row and the rest still run.

    ``on_case(index, case, stage)`` is called as each case moves through its stages (for progress bars).
    """
    from perflab.measure.harness import run_case

    rows = []
    for i, case in enumerate(cases):
        stage = (lambda s, i=i, case=case: on_case(i, case, s)) if on_case else None
        rows.append(run_case(case, on_stage=stage))
    return rows
