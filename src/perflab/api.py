"""perflab's public Python API.

    import perflab
    rows = perflab.bench(perflab.api.make_cases(model=["deit_base_patch16_224"], batch_size=[1, 64]))

Heavy modules (torch) are imported inside the functions that need them, so that trace analysis stays
torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from perflab.errors import show
from perflab.spec import ARGUMENT_DEFAULT as _ARG
from perflab.spec import AXES, CASE_FIELDS, Case, check_integers, expand_grid, validate_case


def make_cases(
    model: Sequence[str],
    input_size: Sequence[int] = _ARG["input_size"],
    batch_size: Sequence[int] = _ARG["batch_size"],
    keep_rate: Sequence[float] = _ARG["keep_rate"],
    reduction_loc: Sequence[int] = _ARG["reduction_loc"],
    attn: str = _ARG["attn"],
    dtype: Sequence[str] = _ARG["dtype"],
    mode: Sequence[str] = _ARG["mode"],
    device: str = _ARG["device"],
    warmup: int = _ARG["warmup"],
    min_time: float = _ARG["min_time"],
    iters: int | None = _ARG["iters"],
    repeats: int = _ARG["repeats"],
    seed: int = _ARG["seed"],
    workload: Sequence[str] = _ARG["workload"],
    seq_len: Sequence[int] = _ARG["seq_len"],
    prompt_len: Sequence[int] = _ARG["prompt_len"],
    context_len: Sequence[int] = _ARG["context_len"],
    new_tokens: Sequence[int] = _ARG["new_tokens"],
    layers: int | None = _ARG["layers"],
    layers_only: bool = _ARG["layers_only"],
    model_args: dict | None = _ARG["model_args"],
    max_memory=_ARG["max_memory"],
    family: str | None = _ARG["family"],
    optimizer: str | None = _ARG["optimizer"],
    checkpoint_activations: bool = _ARG["checkpoint_activations"],
    parallel: str | None = _ARG["parallel"],
    world_size: int = _ARG["world_size"],
) -> list[Case]:
    """Every combination of the multi-valued arguments, validated (PerflabError on bad input).

    Shape arguments left empty take each model family's defaults (224 px and batch 1 for image models,
    seq_len 128 and batch 4 for language models, ...). ``keep_rate`` and ``reduction_loc`` apply to the
    token-reducing models among ``model`` (so a baseline and its top-k variant can be measured in one call);
    giving them with no reducing model is an error. ``max_memory``: bytes, or a size such as "24GiB".
    ``model`` names perflab's models or references to your own (``file.py:NAME``, ``package.module:NAME``,
    ``hf:DIR``); ``family`` says which inputs a reference takes where it cannot be read from it.
    ``optimizer`` and ``checkpoint_activations``: lm training variants (train_step; workloads with a backward).
    ``parallel`` (``ddp``, ``fsdp``, with options: ``spec.parse_parallel``) and ``world_size``: a data-parallel
    step on that many ranks, the batch per rank.

    The arguments are the Case's fields (``spec.CASE_FIELDS`` declares each, its default here and whether it is a list).
    """
    given = dict(locals())
    from perflab.models.registry import parse_model_name
    from perflab.runtime.device import resolve_device
    from perflab.spec import convert_field

    device = resolve_device(device)
    reducing = {m for m in model if parse_model_name(m).reduces_tokens}
    base = {name: value for name, value in given.items() if not CASE_FIELDS[name].list_valued}
    base.update(device=device, model_args=convert_field("model_args", dict(model_args or {})),
                max_memory=convert_field("max_memory", max_memory) if max_memory is not None else None)
    grid = {name: list(given[name]) for name in AXES}  # the product's axes, slowest first
    grid = {k: v for k, v in grid.items() if v}
    cases = []
    for d in expand_grid(base, grid):
        if d["model"] in reducing or not reducing:  # the list-valued fields that are no axis: one case takes the whole list
            d.update({name: tuple(given[name]) for name, f in CASE_FIELDS.items() if f.list_valued and f.axis is None})
        cases.append(validate_case(Case(**d)))
    return cases


# cases_for_model takes one value of these as a list of one.
_MULTI = tuple(name for name, f in CASE_FIELDS.items() if f.list_valued and name != "model")


def cases_for_model(model, **options) -> list[Case]:
    """``make_cases`` for one model given as an object (an nn.Module, a class or a factory, registered for this
    process as ``object:NAME``) or a name; scalar options are taken as one-value lists."""
    from perflab.references import register_object

    name = model if isinstance(model, str) else register_object(model)
    for key in _MULTI:
        if key in options and not isinstance(options[key], (list, tuple)):
            options[key] = [options[key]]
    return make_cases(model=[name], **options)


# bench --processes: each process starts, builds, warms up and times every case, one after another (10 s to minutes),
# and the CI across processes narrows as 1/sqrt(N): 100 already cost 20 minutes to hours for an interval 5.8x narrower
# than 3 give; 1000 would narrow it 3.2x more for 10x the time (100,000 would run for days).
MAX_PROCESSES = 100
DEMO_GPU_PROCESSES = 3  # perflab demo on a GPU: its CIs cover between-process variance (docs/performance.md, issue 22)


def model_catalog() -> dict:
    """What ``--model`` takes: every built-in model by its workload family (with its dimensions), the families (what a
    step runs, their workloads), the prefixes that make variants of them, and the forms of a reference to your own."""
    from perflab.models.llama import llama_configs
    from perflab.models.lm import lm_configs
    from perflab.models.registry import METHODS
    from perflab.models.vit import vit_configs
    from perflab.workloads import FAMILIES

    def dims(config: dict, keys) -> str:
        return ", ".join(f"{label} {config[key]}" for key, label in keys if key in config)

    built_in = {
        "classify": {name: dims(c, (("dim", "dim"), ("depth", "depth"), ("n_heads", "heads"))) for name, c in vit_configs.items()},
        "lm": {name: dims(c, (("d_model", "d_model"), ("n_layers", "layers"), ("n_heads", "heads"), ("d_ff", "d_ff")))
               for name, c in lm_configs.items()},
        "decode": {name: dims(c, (("dim", "dim"), ("n_layers", "layers"), ("n_heads", "heads"), ("n_kv_heads", "kv heads"),
                                  ("vocab_size", "vocab"))) for name, c in llama_configs.items()},
    }
    families = [{"name": name, "describe": spec.describe, "workloads": list(spec.workloads), "item": spec.item,
                 "models": built_in.get(name, {})} for name, spec in FAMILIES.items()]
    variants = [{"form": f"{method}_<vit>", "family": "classify",
                 "means": f"{'EViT' if fuses else 'top-k'} token reduction of a ViT above ({'the dropped tokens fused into one' if fuses else 'the rest dropped'}); "
                          "--keep-rate, --reduction-loc"} for method, fuses in METHODS.items()]
    variants.append({"form": "timm:<name>", "family": "classify", "means": "any timm image model (needs timm: pip install timm)"})
    references = [
        {"form": "path/to/file.py:NAME", "means": "NAME (an nn.Module subclass, or a function that returns one) in that file; "
                                                  "--model-arg NAME=VALUE become its keyword arguments"},
        {"form": "package.module:NAME", "means": "NAME in an importable module"},
        {"form": "hf:DIR_OR_ID", "means": "a transformers model from its config.json (random weights, nothing downloaded); "
                                          "needs transformers: pip install 'perflab[hf]'"},
    ]
    return {"families": families, "variants": variants, "references": references,
            "note": "a reference's family (classify, lm, decode) is found from the model; --family names it where it cannot be"}


def demo_cases(device: str = "auto") -> list[Case]:
    """The quick start's cases: the token-reduction paradox (DeiT-B baseline vs top-k 0.1 at 3,6,9, bf16,
    batch 1 and 64, eager and CUDA graph) on a GPU; a small version (DeiT-Tiny, fp32, eager) on the CPU."""
    from perflab.runtime.device import resolve_device

    device = resolve_device(device)
    if device == "cuda":
        spec = dict(model=["deit_base_patch16_224", "topk_deit_base_patch16_224"], batch_size=[1, 64], dtype=["bf16"], mode=["eager", "cudagraph"])
    else:
        spec = dict(model=["deit_tiny_patch16_224", "topk_deit_tiny_patch16_224"], batch_size=[1, 8], dtype=["fp32"], mode=["eager"], min_time=0.5, warmup=3)
    return make_cases(keep_rate=[0.1], reduction_loc=[3, 6, 9], device=device, **spec)


def bench(cases: Iterable[Case] | None = None, on_case: Callable[[int, Case, str], None] | None = None, memory_snapshot=None,
          pin: bool = True, one_thread: bool = True, *, interleave: bool = True, processes: int = 1, model=None, gpus: Sequence[int] | None = None,
          inductor_cache=None, **case_options) -> list[dict]:
    """Measure the cases in this process (and, with ``processes`` > 1, in that many processes in all); an OOM or
    failure in one becomes its row and the rest still run.

    ``interleave`` (default): the cases that fit on the device together are built and warmed first, then timed in
    blocks in a seeded random interleaved order (``measure.interleave``; the seed is the cases' ``seed``), so a slow
    stretch of the host falls on all of them, and a speedup is read from blocks paired in time
    (``stats.paired_ratio``, used by the speedup table). It costs memory (every case held at once) and a
    warm-up per case before any timing; ``interleave=False`` times each case alone right after its warm-up.
    ``processes``: spread each case's samples over this many processes (this one, then fresh ones); its CI is
    then taken across processes (``ci_level``). ``pin``: pin the timing thread to one core for warm-up and the
    timed loop; ``one_thread``: one torch intra-op thread meanwhile for CUDA cases (``measure.pinning``). Run
    options: case ids do not depend on them.

    From a notebook, name the model directly instead of cases: ``model`` is an ``nn.Module`` (measured as it is),
    an ``nn.Module`` subclass or a function that returns one, or any model name or reference ``make_cases``
    takes; the other keywords are ``make_cases``'s (``family="lm", seq_len=[512], workload=["train_step"]``,
    one value or a list each)::

        rows = perflab.bench(model=MyGPT, family="lm", model_args={"n_layers": 2}, seq_len=256, workload="train_step")

    Data-parallel cases (``parallel`` set) run one at a time, each on ``world_size`` fresh processes
    (``measure.parallel``): ``gpus`` are their CUDA devices (default 0..world_size-1).

    ``inductor_cache``: a directory for inductor's caches, this process's and its children's (``paths.use_inductor_cache``):
    a max-autotune case then takes the kernels an earlier process chose there instead of tuning afresh. Compiled rows
    of the max-autotune modes carry ``autotune``, the kernels chosen; several processes that chose differently, or whose
    medians are more than 3% apart, flag ``max_autotune_varies``.

    ``on_case(index, case, stage)`` is called as each case moves through its stages (for progress bars).
    ``memory_snapshot``: a path for the CUDA memory history pickle (memory_viz); with several cases, the
    case id is added to each file's name, and each case is timed alone. Rows whose host canary is more than 15%
    off the median of the run's rows (three or more) are flagged ``host_drift``, rows whose timing thread waited
    for a CPU (or lost it to the hypervisor) over the timed loop ``host_contention``, GPU-bound rows neither
    (``measure.canary``).
    """
    from pathlib import Path

    from perflab.errors import CudaContextLost, PerflabError
    from perflab.measure.canary import mark_host_flags
    from perflab.measure.harness import run_case, run_cases, run_in_processes
    from perflab.measure.pinning import HostOptions

    if model is not None:
        if cases is not None:
            raise PerflabError("give either cases or model=..., not both")
        cases = cases_for_model(model, **case_options)
    elif case_options:
        raise PerflabError(f"options {', '.join(sorted(case_options))} describe cases: pass them with model=..., or build cases with make_cases")
    if isinstance(processes, bool) or not isinstance(processes, int) or not 1 <= processes <= MAX_PROCESSES:
        raise PerflabError(f"--processes: expected a whole number of processes from 1 to {MAX_PROCESSES}, got {show(processes)} (each "
                           f"builds, warms and times every case again, one after another; the CI across them narrows as 1/√N)")
    host = HostOptions(pin=pin, one_thread=one_thread)
    cases = list(cases or [])
    for case in cases:  # cases built in code, not by make_cases: nothing runs that could not be stored
        check_integers(case)
    if inductor_cache is not None:
        from perflab.paths import use_inductor_cache

        use_inductor_cache(inductor_cache)
    if any(case.parallel for case in cases):
        return _bench_parallel(cases, gpus, on_case, memory_snapshot, processes, pin=pin, one_thread=one_thread, interleave=interleave)
    if memory_snapshot is not None:
        if processes > 1:
            raise PerflabError("--memory-snapshot records one process's allocator: use it with one process")
        rows = []
        for i, case in enumerate(cases):
            stage = (lambda s, i=i, case=case: on_case(i, case, s)) if on_case else None
            path = Path(memory_snapshot)
            snapshot = path if len(cases) == 1 else path.with_name(f"{path.stem}_{case.id}{path.suffix or '.pickle'}")
            rows.append(run_case(case, on_stage=stage, memory_snapshot=snapshot, host=host))
            if case.device == "cuda":
                rows[-1]["memory_snapshot"] = str(snapshot)
    else:
        seed = cases[0].seed if cases else 0
        try:
            if processes > 1:
                rows = run_in_processes(cases, processes, host=host, interleave=interleave, seed=seed, on_case=on_case)
            else:
                rows = run_cases(cases, host=host, interleave=interleave, seed=seed, on_case=on_case)
        except CudaContextLost as lost:  # the rows measured before it, judged like any others, go with it
            lost.rows = mark_host_flags(lost.rows)
            raise
    return mark_host_flags(rows)


@dataclass
class Ranks:
    """The ranks of a data-parallel run: its mode, how many, and their GPUs (None on the CPU)."""

    parallel: str | None = None
    world_size: int = 1
    gpus: list | None = None

    def case_options(self) -> dict:
        return {"parallel": self.parallel, "world_size": self.world_size} if self.parallel else {}


def ranks(parallel: str | None, gpus: Sequence[int] | None, world_size: int | None, device: str) -> Ranks:
    """--parallel, --gpus and --world-size, checked together (PerflabError, one line); the mode's options and the
    case by spec.validate_case."""
    from perflab.errors import PerflabError

    if parallel is None:
        if gpus is not None or world_size is not None:
            raise PerflabError("--gpus and --world-size choose the ranks of --parallel ddp|fsdp; add --parallel, or leave them out")
        return Ranks()
    from perflab.runtime.device import resolve_device
    from perflab.spec import parse_parallel

    parse_parallel(parallel)
    listed = list(gpus) if gpus is not None else None
    if listed is not None and len(set(listed)) != len(listed):
        raise PerflabError(f"--gpus lists a GPU twice ({','.join(map(str, listed))}): one rank per GPU")
    if listed is not None and len(listed) < 2:
        raise PerflabError(f"--parallel {parallel} needs at least 2 GPUs, one rank each; --gpus lists {len(listed)}")
    if resolve_device(device) == "cpu":
        if listed is not None:
            raise PerflabError("--gpus picks CUDA devices; on the CPU give the number of gloo ranks with --world-size")
        if world_size is None:
            raise PerflabError(f"--parallel {parallel} on the CPU runs gloo processes: give their number with --world-size, e.g. 2")
        return Ranks(parallel, world_size)
    if listed is None:
        if world_size is None:
            raise PerflabError(f"--parallel {parallel}: list the ranks' GPUs with --gpus, e.g. --gpus 0,1")
        listed = list(range(world_size))
    if world_size is not None and world_size != len(listed):
        raise PerflabError(f"--world-size {world_size} does not match the {len(listed)} GPU(s) of --gpus {','.join(map(str, listed))}")
    import torch

    present = torch.cuda.device_count()
    missing = [g for g in listed if g >= present]
    if missing:
        raise PerflabError(f"--gpus {','.join(map(str, listed))}: this machine has {present} GPU(s) (0..{present - 1}); GPU {missing[0]} is not one of them")
    return Ranks(parallel, len(listed), listed)


def _bench_parallel(cases, gpus, on_case, memory_snapshot, processes, **options) -> list[dict]:
    """Data-parallel cases each on their ranks, the others as bench runs them; rows in the cases' order."""
    from perflab.errors import PerflabError
    from perflab.measure.parallel import run_parallel_case
    from perflab.measure.stages import Stage

    if memory_snapshot is not None or processes > 1:
        raise PerflabError("--memory-snapshot and --processes measure one process; they do not apply with --parallel")
    rows: list = [None] * len(cases)
    single = [i for i, case in enumerate(cases) if not case.parallel]
    for i, row in zip(single, bench([cases[i] for i in single], **options) if single else []):
        rows[i] = row
    for i, case in enumerate(cases):
        if case.parallel:
            if on_case:
                on_case(i, case, Stage(f"{case.world_size} ranks", "timing"))
            rows[i] = run_parallel_case(case, gpus=list(gpus)[:case.world_size] if gpus else None)
    return rows


# ---------------------------------------------------------------------------------------------------
# Sweeps, stored results, reports and break-even


def load_experiment(path, max_cases: int | None = None):
    """Read and validate an experiment spec (YAML); PerflabError naming the file and key on any mistake
    (and, with ``max_cases``, on a spec of more cases than that, before expanding it)."""
    from perflab.sweep.spec import read_experiment

    return read_experiment(path, max_cases=max_cases)


def spec_schema_json() -> str:
    """The JSON Schema of an experiment spec file (``perflab spec-schema``), as indented JSON text."""
    import json

    from perflab.spec_schema import json_schema

    return json.dumps(json_schema(), indent=2) + "\n"


def sweep(spec, out=None, *, resume: bool = False, retry_failed: bool = False, gpus: Sequence[int] | None = None,
          workers: int = 1, timeout_s: float | None = None, command: str = "", on_event=None, engine: str = "local",
          address: str | None = None, pin: bool = True, launcher: str | None = None, inductor_cache=None):
    """Run an experiment, one subprocess per case, committing each row to ``OUT/results.sqlite`` at once.

    ``spec``: a YAML file, a spec dict (as YAML would give) or an Experiment. ``out`` defaults to the spec's
    ``out:``, else ``runs/<name>``. ``resume`` skips cases stored for this environment; ``retry_failed``
    also reruns their error/timeout rows. ``gpus``: one worker per GPU; otherwise ``workers`` CPU workers
    (default one at a time). Everything is validated before the store is opened. Returns a SweepSummary.
    ``engine="ray"`` runs each case as a Ray task (``address``: a cluster to join; default a local instance).
    ``pin=False`` (or ``pin: false`` under the spec's ``harness``) times the cases unpinned (``measure.pinning``).
    ``launcher``: ``fork`` (default: each case's fresh process forked by a launcher that imported torch once per sweep)
    or ``exec`` (each a new interpreter; ``$PERFLAB_LAUNCHER`` sets the default). The Ray engine always execs.
    ``inductor_cache``: a directory for inductor's caches, shared by every case's process (``paths.use_inductor_cache``;
    on one host they share inductor's default one already; this one travels with the results, to another machine too).
    """
    from dataclasses import replace
    from pathlib import Path

    from perflab.sweep.runner import run_sweep

    experiment = _experiment(spec)
    if inductor_cache is not None:
        from perflab.paths import use_inductor_cache

        use_inductor_cache(inductor_cache)
    if not pin:
        experiment = replace(experiment, pin=False)
    out_dir = Path(out or experiment.out or Path("runs") / experiment.name)
    command = command or f"perflab.api.sweep({experiment.source!r}, out={str(out_dir)!r})"
    if launcher is not None:
        from perflab.sweep.launcher import choose_launcher

        launcher = choose_launcher(launcher)  # a bad name: one clear line
    if engine == "ray" or address:
        from perflab.sweep.ray_engine import check_engine_options, run_sweep_ray

        check_engine_options(engine, gpus, workers)
        if launcher == "fork":
            from perflab.errors import PerflabError

            raise PerflabError("--launcher fork: the Ray engine starts each case's worker as a new interpreter on its node; "
                               "leave --launcher out (or give exec)")
        return run_sweep_ray(experiment, out_dir, address=address, resume=resume, retry_failed=retry_failed,
                             timeout_s=timeout_s, command=command, on_event=on_event)
    if engine != "local":
        from perflab.errors import PerflabError

        raise PerflabError(f"--engine: expected local or ray, got {engine!r}")
    return run_sweep(experiment, out_dir, resume=resume, retry_failed=retry_failed, gpus=list(gpus) if gpus else None,
                     workers=workers, timeout_s=timeout_s, command=command, on_event=on_event, launcher=launcher)


def results(out_dir, env_key: str | None = None, on_unreadable=None) -> list[dict]:
    """The rows stored in a sweep directory (each with its ``env_key``), in the order they were stored. A row that
    cannot be decoded is left out and passed to ``on_unreadable`` (a ``store.Unreadable``; a warning without it); a
    store with damaged pages is one PerflabError naming the file."""
    from perflab.sweep.store import read_rows

    return read_rows(out_dir, env_key, on_unreadable=on_unreadable)


def report(out_dir, *, n_boot: int = 2000, spec=None, on_unreadable=None):
    """Write ``OUT/report.md`` (seed-shaped tables, break-even) and its PNG plots; returns the report's path.
    ``spec``: the experiment to count the cases of (default: the store's latest sweep's). ``on_unreadable``: as
    ``results``; the report names those records too. A ``perflab run``'s directory (run.json, or a ``--nproc 1,2``
    run's scaling.json, and no results store) gets its page instead: :func:`run_page`."""
    from pathlib import Path

    from perflab.errors import PerflabError
    from perflab.paths import not_a_store
    from perflab.report.markdown import write_report
    from perflab.sweep.store import STORE_NAME, store_path

    check_bootstrap(n_boot)
    if not store_path(out_dir).is_file():
        if any((Path(out_dir) / name).is_file() for name in ("run.json", "scaling.json")):
            return run_page(out_dir)
        raise PerflabError(not_a_store(out_dir, STORE_NAME))
    return write_report(out_dir, n_boot=n_boot, spec=spec, on_unreadable=on_unreadable)


def run_page(out_dir, report: dict | None = None):
    """Write ``OUT/report.html``, the page of a ``perflab run`` (``perflab run`` writes it too): one self-contained file
    (inline CSS and SVG, nothing fetched) with the step times over the run, the verdict and its evidence, where the
    time goes, the compiler, the ranks and scaling, the processes and how to open the trace in Perfetto. From
    ``report`` (run.json's dict) or ``OUT/run.json``; a ``--nproc 1,2`` run's directory gets its scaling page and each
    count's run its own. Returns the page's path; a directory without a run, or a damaged run.json, is one
    PerflabError."""
    from perflab.report.run_page import write_run_page

    return write_run_page(out_dir, report)


def write_run_page_quietly(out_dir, report: dict) -> None:
    """``perflab run``'s page hook (``program.run.Run(page=...)``): OUT/report.html beside run.json."""
    run_page(out_dir, report)


def render_run_stderr(report: dict) -> None:
    """A followed child's console report (``program.run.CHILD_HOOKS``): rank 0's, or a single child's, on stderr."""
    from rich.console import Console

    from perflab.report.program import render_run

    render_run(Console(stderr=True), report)


def check_bootstrap(n_boot) -> None:
    """PerflabError (one line) unless ``n_boot`` is a whole number of bootstrap replicates in the range a CI can rest on."""
    from perflab.analysis.breakeven import MAX_BOOT, MIN_BOOT
    from perflab.errors import PerflabError, show

    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or not MIN_BOOT <= n_boot <= MAX_BOOT:
        why = ("more only add time and memory" if isinstance(n_boot, int) and n_boot > MAX_BOOT
               else "fewer put each end of a 95% CI on one or two replicates")
        raise PerflabError(f"--bootstrap: expected a whole number of replicates from {MIN_BOOT} to {MAX_BOOT:,}, got {show(n_boot)} ({why})")


def breakeven_experiment(
    model: str,
    variant: str,
    input_sizes,
    batch_size: Sequence[int] = (1,),
    dtype: Sequence[str] = _ARG["dtype"],
    mode: Sequence[str] = _ARG["mode"],
    device: str = _ARG["device"],
    keep_rate: Sequence[float] = _ARG["keep_rate"],
    reduction_loc: Sequence[int] = _ARG["reduction_loc"],
    attn: str = _ARG["attn"],
    warmup: int = _ARG["warmup"],
    min_time: float = _ARG["min_time"],
    iters: int | None = _ARG["iters"],
    repeats: int = _ARG["repeats"],
    timeout_s: float | None = None,
    name: str = "breakeven",
):
    """The experiment that measures ``model`` and ``variant`` across ``input_sizes`` ("160:640:32" or a list)."""
    from perflab.sweep.spec import DEFAULT_TIMEOUT_S, parse_experiment

    entry = dict(model=model, variant=variant, input_sizes=input_sizes if isinstance(input_sizes, str) else list(input_sizes),
                 batch_size=list(batch_size), dtype=list(dtype), mode=list(mode))
    if keep_rate:
        entry["keep_rate"] = list(keep_rate)
    if reduction_loc:
        entry["reduction_loc"] = list(reduction_loc)
    spec = {
        "name": name,
        "description": f"break-even of {variant} against {model}",
        "defaults": {"device": device, "attn": attn},
        "harness": {"warmup": warmup, "min_time": min_time, "iters": iters, "repeats": repeats,
                    "timeout_s": timeout_s or DEFAULT_TIMEOUT_S},
        "breakeven": entry,
    }
    return parse_experiment(spec, "perflab breakeven")


def breakeven(out_dir, *, n_boot: int = 2000, seed: int = 0) -> list:
    """Break-even analyses of the stored experiment's ``breakeven`` entries, from its stored rows."""
    from perflab.analysis.breakeven import analyze_rows
    from perflab.errors import PerflabError
    from perflab.sweep.store import load_stored

    check_bootstrap(n_boot)
    stored = load_stored(out_dir)
    if stored.experiment is None or not stored.experiment.breakevens:
        raise PerflabError(f"{out_dir}: the stored experiment has no breakeven section; run `perflab breakeven ...` or add one to the spec")
    return [
        analyze_rows(b.name, stored.rows, [c.id for c in b.baseline], [c.id for c in b.variant],
                     patch_size=b.patch_size, n_boot=n_boot, seed=seed)
        for b in stored.experiment.breakevens
    ]


def _experiment(spec):
    from perflab.sweep.spec import Experiment, parse_experiment, read_experiment

    if isinstance(spec, Experiment):
        return spec
    if isinstance(spec, dict):
        return parse_experiment(spec, "<spec dict>")
    return read_experiment(spec)


def analyze(path, top: int = 10, kernel_gap_threshold_us: float = 5.0):
    """Load a trace (Kineto .json/.json.gz or nsys SQLite) and account for its time; torch-free.

    Returns a :class:`perflab.analysis.trace_report.TraceReport`: DataFrames ``kernels`` (the KernelTable),
    ``steps`` (per-step accounting), ``top_kernels``, ``categories``, ``ranges``, ``launch_apis``, and
    ``to_dict()`` / ``to_json()`` / ``write_csv(dir)``. Bad input raises PerflabError.
    """
    from perflab.analysis.trace_report import analyze_trace
    from perflab.trace.load import load_trace

    return analyze_trace(load_trace(path), top=top, kernel_gap_threshold_ns=round(kernel_gap_threshold_us * 1000))


def profile(steps: int = 5, warmup: int = 1, out=None, sync: bool = True):
    """Profile a user's own loop; see :class:`perflab.trace.capture.StepProfiler`.

        with perflab.profile(steps=5) as p:
            for batch in data:
                train_step(batch)
                p.step()
        p.analysis.steps      # per-step accounting (DataFrame); p.trace_path is the Kineto trace
    """
    from perflab.trace.capture import StepProfiler

    return ProfiledLoop(StepProfiler(steps=steps, warmup=warmup, out=out, sync=sync))


class ProfiledLoop:
    """What ``perflab.profile`` returns: capture (a StepProfiler) and then, after the block, the analysis.

    ``p.step()`` marks a step; ``p.trace_path`` is the Kineto trace; ``p.analysis`` its TraceReport (on the CPU,
    accounted over torch's operators)."""

    def __init__(self, profiler):
        self.profiler = profiler
        self.analysis = None

    @property
    def trace_path(self):
        return self.profiler.trace_path

    def step(self) -> None:
        self.profiler.step()

    def __enter__(self) -> "ProfiledLoop":
        self.profiler.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.profiler.__exit__(exc_type, exc, tb)
        if exc_type is None:
            self.analysis = analyze(self.trace_path)
        return False


def run(program: Sequence[str], *, skip: int = 5, steps: int = 20, trace: int = 3, step: str | None = None, step_range: str | None = None,
        stop_after: bool = False, out_dir="perflab-run", nproc: int | Sequence[int] | None = None, render=None, trace_warmup: int = 3,
        inflation_limit: float = 1.10, record_shapes: bool = True, render_scaling=None, stall_factor: float = 1.5,
        inputs: Sequence[str] = (), batch_size: int | None = None, seq_len: int | None = None) -> int:
    """Run a program (``["train.py", "--lr", "3e-4"]``, ``["-m", "pkg.train"]``) unchanged in this process, time
    ``steps`` of its steps after ``skip``, trace ``trace`` more after ``trace_warmup`` steps under the profiler that are
    thrown away (its start-up), and report (``render(report)``; the report is also
    written to ``OUT/run.json``). Returns the program's exit code. ``nproc``: run it under torchrun with that many ranks
    (each rank runs ``python -m perflab run``; rank 0 merges); a list of counts runs it at each (``OUT/nprocN/``) and
    reports the scaling over the first (``OUT/scaling.json``; ``render_scaling(section)`` prints it). ``stall_factor``: a
    timed step beyond this × the median is a stall; ``inputs``: functions whose calls are waits for input, beside the
    DataLoaders'; ``batch_size`` and ``seq_len``: samples a step and tokens a sample, where the batches do not say.
    Bad options raise PerflabError before the program runs."""
    from perflab.program.boundaries import make_source
    from perflab.program.recorder import RunOptions
    from perflab.program.run import Run, check_options
    from perflab.program.script import parse_program

    check_options(skip, steps, trace, step, step_range, trace_warmup=trace_warmup, inflation_limit=inflation_limit, stall_factor=stall_factor,
                  inputs=inputs, batch_size=batch_size, seq_len=seq_len)
    if nproc is not None:
        from perflab.program.torchrun import check_rank_counts

        check_rank_counts(list(nproc) if isinstance(nproc, (list, tuple)) else [nproc], several=isinstance(nproc, (list, tuple)))
    make_source(step, step_range)  # bad --step/--step-range: one line, before anything runs
    program_ = parse_program(list(program))
    from perflab.paths import check_writable_file, make_out_dir

    out = make_out_dir(out_dir)  # a path that cannot take the report: one line, before the program runs
    check_writable_file(out / "run.json")
    options = RunOptions(skip=skip, steps=steps, trace=trace, trace_warmup=trace_warmup, record_shapes=record_shapes,
                         inflation_limit=inflation_limit, stop_after=stop_after, out_dir=out, stall_factor=stall_factor,
                         inputs=tuple(inputs), batch_size=batch_size, seq_len=seq_len)
    if isinstance(nproc, (list, tuple)):
        from perflab.program.torchrun import torchrun_counts

        code = torchrun_counts(list(nproc), program, options, step=step, step_range=step_range, render=render_scaling)
        _scaling_page(out)
        return code
    if nproc is not None:
        from perflab.program.torchrun import torchrun

        return torchrun(nproc, program, options, step=step, step_range=step_range)
    from perflab.report.program import StderrRender

    # the report made in a process of its own (program.report_job) only where the console hook is perflab's own, which
    # that process can make again: a caller's render(report) (a closure, a bound method that keeps the report) runs here
    elsewhere = render is None or isinstance(render, StderrRender)
    result = Run(program_, options, step=step, step_range=step_range, render=render, follow=True, page=write_run_page_quietly,
                 report_process=elsewhere)()
    return result.exit_code


def _scaling_page(out) -> None:
    """``--nproc 1,2``'s page (``OUT/report.html``: the scaling, each count's run linked); a failure to write it is one
    line, after the runs, never their exit code."""
    from perflab.errors import PerflabError
    from perflab.program.guard import say

    try:
        run_page(out)
    except (PerflabError, OSError) as exc:
        say(f"perflab: {out / 'report.html'} could not be written: {exc}")


def check_profiled_steps(steps: int) -> None:
    """``steps`` to record in a profiled pass: at least 1, said before any case is timed (the tracer would refuse 0 only
    after the untraced timing)."""
    from perflab.errors import PerflabError

    if steps < 1:
        raise PerflabError(f"--steps must be at least 1, got {steps}")


def profile_case(case: Case, out_dir, steps: int = 5, top: int = 10, pin: bool = True, by_module: bool = False) -> dict:
    """Time ``case`` with the harness (no profiler), then record ``steps`` steps of it and analyse them.

    Returns {"case", "row" (the untraced result row), "trace_path", "report" (TraceReport),
    "traced_step_ms" (median step window), "inflation" (traced ÷ untraced)}. The row is judged for
    ``host_contention`` (one row: no ``host_drift``); ``pin``: as for :func:`bench`. ``by_module``: the profiled
    pass also records module ranges, and ``report.modules`` is the module tree (eager mode).
    """
    from perflab.diagnosis.profiling import profile_pass as run

    check_profiled_steps(steps)
    return run(case, out_dir, steps=steps, top=top, pin=pin, by_module=by_module)


def ncu(case: Case, top: int = 10, out_dir="perflab-traces", per_config: int = 0):
    """Nsight Compute counters for the top-``top`` kernels of ``case``, joined with its kernel table.

    ``per_config``: launches profiled per launch configuration (kernel, grid, block), each standing for the step's
    launches of its configuration; 0 (the default) profiles every launch. Returns (joined DataFrame, profile result).
    Raises PerflabError when ncu is absent.
    """
    from perflab.diagnosis.profiling import ncu_case

    return ncu_case(case, top=top, out_dir=out_dir, per_config=per_config)


def profile_parallel(case: Case, out_dir, steps: int = 5, gpus: Sequence[int] | None = None) -> dict:
    """A data-parallel case timed on its ranks, then ``steps`` steps profiled on every rank (``rank{N}.json`` in
    ``out_dir``), the ranks' traces merged: per rank, exact compute-only, overlapped and exposed communication and
    idle time over the common window (``analysis.ranks``), and per step which rank the others waited for.

    Returns ``{"row", "trace_paths", "accounts", "waits_per_step", "note", "steps", "rank_passes"}``. On the CPU (gloo)
    a rank's compute is its main thread inside torch's operators and its communication gloo's collectives, and
    ``note`` says so (``trace.cpu_ranks``)."""
    from perflab.diagnosis.profiling import profile_ranks as run

    check_profiled_steps(steps)
    return run(case, out_dir, steps=steps, gpus=gpus)


def ceilings(gpus: Sequence[int] | None = None, refresh: bool = False, on_note=None) -> dict:
    """This GPU's ceilings (``measure.ceilings``, cached), and with two or more ``gpus`` the all-reduce sweep over them.
    Fewer than two GPUs: ``on_note`` gets one line saying so, and the rest is measured. No GPU: PerflabError."""
    import torch

    from perflab.errors import PerflabError
    from perflab.measure.ceilings import get_all_reduce, get_ceilings

    if not torch.cuda.is_available():
        raise PerflabError("perflab ceilings measures a GPU; none is visible here")
    present = torch.cuda.device_count()
    gpus = list(gpus) if gpus is not None else list(range(present))
    missing = [g for g in gpus if g >= present or g < 0]
    if missing:
        raise PerflabError(f"--gpus: GPU {missing[0]} is not one of this machine's {present}")
    with torch.cuda.device(gpus[0] if gpus else 0):
        result = {"ceilings": get_ceilings(refresh=refresh), "all_reduce": None}
    if len(gpus) < 2:
        if on_note:
            on_note(f"all-reduce bandwidth needs 2 or more GPUs; {len(gpus)} here: measured the one-GPU ceilings only")
    else:
        result["all_reduce"] = get_all_reduce(gpus, refresh=refresh)
    return result


def is_trace_path(item) -> bool:
    """An existing file, or a name that looks like one (so that a missing trace is reported as missing)."""
    from pathlib import Path

    from perflab.references import is_reference

    text = str(item)
    if is_reference(text):
        return False
    return Path(text).exists() or "/" in text or text.endswith((".json", ".gz", ".sqlite", ".db"))


# make_cases options that compare takes per side: one value (both sides) or two (A's, then B's)
COMPARE_PER_SIDE = ("workload", "seq_len", "prompt_len", "context_len", "new_tokens", "batch_size", "dtype", "mode")


def compare_items(a: str, b: str, **options) -> list:
    """The two sides of a comparison: a trace path stays a Path; a model name becomes a Case.

    ``options``: make_cases options; those of ``COMPARE_PER_SIDE`` are lists of one value (both sides) or two (A's,
    then B's). Both names go into one make_cases call per side, so keep_rate/reduction_loc reach the token-reducing
    one only, as in bench."""
    from pathlib import Path

    from perflab.errors import PerflabError

    per_side = {key: options.pop(key) for key in COMPARE_PER_SIDE if key in options}
    common = options
    for option, values in per_side.items():
        if len(values) > 2:
            raise PerflabError(f"--{option.replace('_', '-')}: give one value (both sides) or two (A's, then B's), got {len(values)}")
    names = [item for item in (a, b) if not is_trace_path(item)]
    if len(names) < 2 and any(len(v) == 2 for v in per_side.values()):
        raise PerflabError("two values of an option (A's, then B's) are for two cases; a trace was recorded with its own settings")

    def case_of(name, i):
        side = {k: [v[i]] if len(v) == 2 else list(v) for k, v in per_side.items()}
        return next(c for c in make_cases(model=names, **side, **common) if c.model == name)

    return [Path(item) if is_trace_path(item) else case_of(item, i) for i, item in enumerate((a, b))]


def run_trace(item):
    """The trace a side names: a trace file as it is, or for ``perflab run``'s run.json the trace written beside it."""
    from pathlib import Path

    from perflab.errors import PerflabError
    from perflab.records.run_report import NOT_AN_OBJECT, RUN_FILE, RunView, UnreadableReport, load

    path = Path(str(item))
    if path.name != RUN_FILE:
        return path
    try:
        trace = RunView.of(load(path)).traced.trace_path
    except UnreadableReport as exc:
        if exc.reason != NOT_AN_OBJECT:
            raise PerflabError(f"{path}: cannot read it as perflab run's report ({exc.reason})") from None
        trace = None  # JSON, but no report: no trace named
    if not isinstance(trace, str) or not trace:
        raise PerflabError(f"{path}: its run traced no step (perflab run --trace 0, or it ended first); compare needs a trace")
    return path.parent / Path(trace).name  # beside it, wherever the run was started from


def compare(a, b, labels=None, steps: int = 5, out_dir="perflab-traces", batch_size=(None, None), by_module: bool = False,
            threshold: float = 0.05):
    """Compare two runs exactly (see perflab.analysis.compare). ``a``/``b``: trace paths, or Cases to profile
    (``by_module``: with module ranges, so the comparison says which modules changed; two traces that recorded
    module ranges are compared module by module too). ``batch_size``: items per step of a trace side, for its
    throughput (a profiled Case's are its row's). Two traces are labelled by what tells them apart: the program and
    arguments of the ``perflab run`` that wrote each (its run.json beside it), else the shortest path suffixes that
    differ. What the traces describe (``analysis.compare.qualify``): a trace its run.json flags ``trace_inflated``
    is named first; where both sides have untraced timings (their run.json, or the profiled cases' rows), the verdict
    is theirs at ``threshold`` and the traced Δ attributes it."""
    from pathlib import Path

    from perflab.analysis.compare import compare_traces, qualify, run_record, side_labels
    from perflab.analysis.regressions import check_threshold
    from perflab.trace.load import load_trace
    from perflab.workloads import item_of

    check_threshold(threshold)

    if any(isinstance(item, Case) for item in (a, b)):
        check_profiled_steps(steps)  # before a trace side is read
    traces, names, items, rows = [], [], list(batch_size), []
    runs, untraced = [None, None], [None, None]
    for i, item in enumerate((a, b)):
        if isinstance(item, Case):
            result = profile_case(item, out_dir, steps=steps, by_module=by_module)
            if result["report"] is None:
                from perflab.errors import PerflabError

                raise PerflabError(f"{item.label()} could not be profiled ({result['row']['status']}: {result['row'].get('message')})")
            traces.append(result["report"].trace)
            names.append(item.label())
            rows.append(result["row"])
            untraced[i] = result["row"]
            items[i] = items[i] or result["row"].get("items_per_step") or item.batch_size
        else:
            traces.append(load_trace(run_trace(item)))
            names.append(None)
            runs[i] = run_record(Path(str(item)) if Path(str(item)).name == "run.json" else Path(run_trace(item)).parent / "run.json")
    if None in names:  # traces: by what tells them apart (run.json's program beside each, else their paths)
        traced = side_labels([run_trace(x) for x in (a, b)])
        names = [name or traced[i] for i, name in enumerate(names)]
    from perflab.analysis.compare import untraced_loop

    loops = [untraced_loop(run, "") if run is not None else None for run in runs]
    for i, loop in enumerate(loops):  # a run's samples a step (its batches, or its --batch-size), where none was given
        items[i] = items[i] or ((loop or {}).get("samples_per_step"))
    item = item_of(rows) if len(rows) == 2 else None  # img or token: what the throughput counts, both sides profiled alike
    if item is None and all(loop and loop.get("samples_per_step") for loop in loops) and not any(batch_size):
        item = "sample"
    comparison = compare_traces(traces[0], traces[1], tuple(labels or names), tuple(items), item=item)
    return qualify(comparison, runs, untraced, threshold)


# ---------------------------------------------------------------------------------------------------
# Stored results compared, and one experiment at several versions (docs/regressions.md)


def is_results_path(item) -> bool:
    """Whether ``item`` names stored results rather than a trace or a model: a directory (a store), a results store's
    SQLite file, a ``bench --out`` file (.csv, .jsonl), or a .json file whose first line is a result row."""
    import sqlite3
    from pathlib import Path

    from perflab.paths import RESULT_FILE_SUFFIXES, json_first_line

    path = Path(str(item))
    if path.is_dir() or path.suffix in RESULT_FILE_SUFFIXES:
        return True
    if not path.is_file():
        return False
    if path.suffix in (".sqlite", ".db"):
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
                return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'results'").fetchone() is not None
        except sqlite3.DatabaseError:
            return False
    return path.suffix == ".json" and json_first_line(path) == "row"


def are_results(a, b) -> bool:
    """Whether ``compare a b`` compares stored results (``is_results_path``) rather than traces or models; PerflabError
    where only one side is: the other missing (a mistyped path) or something else."""
    from pathlib import Path

    from perflab.errors import PerflabError

    held = [is_results_path(a), is_results_path(b)]
    if held[0] != held[1]:
        other = b if held[0] else a
        why = "no such file or directory" if not Path(str(other)).exists() else "not stored results"
        raise PerflabError(f"{other}: {why}; compare takes two stored results (stores or bench --out files), and "
                           f"{a if held[0] else b} is one (or two traces or models)")
    return held[0]


def load_results(item, on_unreadable=None) -> list[dict]:
    """The result rows ``item`` names (``is_results_path``): a store's (its latest environment's) or a file's, each field
    of each row of the type and range ``records.row.check_row`` holds it to (PerflabError naming the row otherwise).
    A stored row that cannot be decoded is left out and passed to ``on_unreadable`` (a warning without it)."""
    from pathlib import Path

    from perflab.errors import PerflabError
    from perflab.records.row import check_row
    from perflab.report.export import read_exported_rows

    path = Path(str(item))
    if path.is_dir() or path.suffix in (".sqlite", ".db"):
        from perflab.sweep.store import STORE_NAME, load_stored, report_unreadable

        if not path.is_dir() and path.name != STORE_NAME:  # the store is its directory's results.sqlite, nothing else
            raise PerflabError(f"{item}: a store is read as a directory's {STORE_NAME}; give the directory that holds it, "
                               f"with the file named {STORE_NAME}")
        stored = load_stored(path if path.is_dir() else path.parent)
        report_unreadable(stored.unreadable, on_unreadable, item)  # its case reads as held by the other side alone
        if not stored.rows:
            raise PerflabError(f"{item}: the store holds no rows")
        rows = [check_row(row, f"{item}, case {row['case_id']}") for row in stored.rows]
        versions = {(r.get("version") or {}).get("key") for r in rows}
        if len(versions) > 1:
            raise PerflabError(f"{item}: holds rows of {len(versions)} versions (perflab ab or track): `perflab report {item}` "
                               "compares them")
        return rows
    return read_exported_rows(path)


def compare_results(a, b, threshold: float = 0.05, on_unreadable=None):
    """Two stored runs compared case by case (``analysis.regressions.compare_rows``): ``a`` and ``b`` are stores
    (sweep output directories, or their results.sqlite) or ``bench --out`` files (.csv or JSON lines). A stored row that
    cannot be decoded is left out and passed to ``on_unreadable(side, store.Unreadable)`` (a warning without it)."""
    from perflab.analysis.regressions import check_threshold, compare_rows

    check_threshold(threshold)
    sides = [load_results(side, on_unreadable and (lambda item, side=side: on_unreadable(side, item))) for side in (a, b)]
    return compare_rows(*sides, threshold)


def version_experiment(spec=None, case_options: dict | None = None, root=None, repo=None, name: str = "ab"):
    """The experiment one version runs: the spec (a file inside ``repo`` read from the version's worktree, whose
    directory ``root`` stands for ``repo``; another read as it is, its relative model references read in ``root``),
    or the cases of bench flags (``make_cases`` options), their references read in ``root`` (default the working
    directory)."""
    from dataclasses import replace
    from pathlib import Path

    from perflab.errors import PerflabError
    from perflab.references import using_model_root
    from perflab.sweep.spec import parse_experiment, read_experiment, read_spec
    from perflab.sweep.versions import make_bench_experiment

    if (spec is None) == (not case_options or not case_options.get("model")):
        raise PerflabError("give the cases either as --spec FILE or as bench flags (--model ...), not both or neither")
    if spec is not None:
        spec = Path(spec)
        if root is None:
            return read_experiment(spec)
        try:
            inside = spec.resolve().relative_to(Path(repo).resolve())
        except ValueError:
            inside = None
        if inside is not None:
            return read_experiment(Path(root) / inside)  # the spec as committed at this revision
        data, text = read_spec(spec)
        with using_model_root(root):
            experiment = parse_experiment(data, str(spec), text=text, default_name=spec.stem)
        return replace(experiment, model_root=str(root))
    with using_model_root(root):
        cases = make_cases(**case_options)
    return make_bench_experiment(name, f"perflab {name} (bench flags)", cases, Path(root) if root else Path.cwd())


def ab(*, repo=None, a: str | None = None, b: str | None = None, python_a: str | None = None, python_b: str | None = None,
       spec=None, case_options: dict | None = None, rounds: int | None = None, order: str = "alternate", seed: int | None = None, out=None,
       timeout_s: float | None = None, threshold: float = 0.05, command: str = "", on_event=None, launcher: str | None = None,
       pin: bool = True, pairing: str | None = None, aa: bool | None = None):
    """One experiment at two versions, A and B, round by round; returns (the run's summary, its comparison:
    ``analysis.regressions.RowComparison`` of A's rows and B's, paired per round).

    A version is a revision of the git repository ``repo`` (``a``, ``b``: each checked out in a worktree of its own,
    the cases' relative model references read there), or an interpreter (``python_a``, ``python_b``). The cases: a
    spec (``spec``) or ``make_cases`` options (``case_options``). ``out``: the store (default ``runs/ab/<time>``).
    ``pairing`` (``sweep.versions.run_versions``): ``blocks`` (the default for revisions: each round one process times
    A's and B's cases interleaved) or ``processes`` (each in a process of its own, alternated; interpreters' only
    choice). ``rounds``: default 3 for blocks, 4 for processes (which need an even number to balance who goes first).
    ``aa``: time a second copy of A beside A and B in each round, the A/A pair the noise floor is measured from
    (default: with the blocks pairing). ``seed``: of ``order`` random; refused where nothing is drawn with it."""
    import time
    from dataclasses import replace
    from pathlib import Path

    from perflab.analysis.regressions import RowComparison, check_threshold, compare_rows
    from perflab.errors import PerflabError
    from perflab.sweep.versions import (check_balance, check_order, check_pairing, check_rounds, check_seed,
                                        plan_interpreters, plan_revisions, run_versions)

    check_threshold(threshold)
    check_order(order)
    by_revision = repo is not None or a is not None or b is not None
    by_python = python_a is not None or python_b is not None
    if by_revision == by_python or (by_revision and None in (repo, a, b)) or (by_python and None in (python_a, python_b)):
        raise PerflabError("give two versions: --repo DIR --a REV --b REV (git revisions), or --python-a PATH --python-b PATH (interpreters)")
    check_pairing(pairing, by_python)
    pairing = pairing or ("processes" if by_python else "blocks")
    rounds = rounds if rounds is not None else (4 if pairing == "processes" else 3)
    check_rounds(rounds, least=2)
    check_balance(pairing, rounds)
    check_seed(seed, order, pairing)

    def experiment_at(root):
        experiment = version_experiment(spec, case_options, root, repo, name="ab")
        return experiment if pin else replace(experiment, pin=False)

    if by_revision:
        plan = plan_revisions(repo, [("A", a, "--a"), ("B", b, "--b")], experiment_at, side_keys=True)
    else:
        plan = plan_interpreters([("A", "--python-a", python_a), ("B", "--python-b", python_b)], experiment_at(None))
    try:
        out_dir = Path(out) if out is not None else Path("runs") / "ab" / time.strftime("%Y%m%d-%H%M%S")
        summary = run_versions(plan, out_dir, rounds=rounds, order=order, seed=seed, timeout_s=timeout_s, reuse=False,
                               command=command or "perflab.api.ab(...)", kind="ab", on_event=on_event, launcher=launcher,
                               record={"threshold": threshold}, pairing=pairing, aa=pairing == "blocks" if aa is None else aa)
    finally:
        plan.close()
    rows_a, rows_b = (summary.rows_of(v) for v in plan.versions)
    if not (rows_a and rows_b):  # interrupted before a case's last round: nothing stored to compare
        return summary, RowComparison([], threshold=threshold)
    return summary, compare_rows(rows_a, rows_b, threshold, rows_aa=summary.rows_of(summary.copy) if summary.copy else None)


def track_revisions(repo, revs=(), range_: str | None = None) -> list[str]:
    """track's revisions, oldest first: ``revs`` (each may list several, comma-separated) or ``range_`` ``A..B`` (A, then
    each commit after it up to B along B's first parents); PerflabError unless two or more, given one way."""
    from perflab.errors import PerflabError
    from perflab.sweep.versions import repository, revision_range

    revs = [r for rev in revs for r in str(rev).split(",") if r]
    if bool(revs) == bool(range_):
        raise PerflabError("give the revisions as --revs A,B,C (or A B C) or as --range A..B")
    if range_:
        top, _ = repository(repo)
        listed = revision_range(top, range_)
        revs = [listed[0]] + [sha[:10] for sha in listed[1:]]
    if len(revs) < 2:
        raise PerflabError(f"--revs: give two or more revisions to track, got {len(revs)}")
    return revs


def track(*, repo, revs=(), range_: str | None = None, spec=None, case_options: dict | None = None, out, rounds: int = 1,
          order: str = "alternate", seed: int | None = None, timeout_s: float | None = None, threshold: float = 0.05, command: str = "",
          on_event=None, launcher: str | None = None, pin: bool = True, pairing: str = "blocks", aa: bool | None = None,
          profile_changes: int | None = None):
    """One experiment at each of a list of revisions of ``repo`` (``revs``, or ``range_`` ``A..B``: A and each commit after
    it up to B), into one store at ``out``; rows already stored there for a revision are reused. Returns (the run's
    summary, the per-case series over the revisions with their change points: ``analysis.regressions.revision_series``).
    ``pairing``: ``blocks`` (each round one process times every revision's cases interleaved) or ``processes`` (an
    even number of rounds). ``aa``: time a second copy of the first revision beside the others in each round, the A/A
    pair every step's noise floor is measured from (default: with the blocks pairing). ``profile_changes``: each change
    point's two revisions are profiled with this many traced steps a side, and the point's ``cause``
    (``diagnosis.change_points``: the Δ by kernel or operator category with its intervals, and the ``perflab ab``
    command that times the pair again) is attached and kept in ``OUT/change_points.json``; 0: none; None: ``diagnosis.change_points.PROFILE_CHANGES``."""
    from dataclasses import replace
    from pathlib import Path

    from perflab.analysis.regressions import check_threshold, revision_series
    from perflab.errors import PerflabError
    from perflab.sweep.versions import check_balance, check_order, check_pairing, check_rounds, check_seed, plan_revisions, run_versions

    check_threshold(threshold)
    check_rounds(rounds)
    check_order(order)
    check_pairing(pairing, False)
    check_balance(pairing, rounds)
    check_seed(seed, order, pairing)
    from perflab.diagnosis.change_points import PROFILE_CHANGES

    profile_changes = PROFILE_CHANGES if profile_changes is None else profile_changes
    if isinstance(profile_changes, bool) or not isinstance(profile_changes, int) or not 0 <= profile_changes <= 100:
        raise PerflabError(f"--profile-changes: expected traced steps a side from 0 (none) to 100, got {show(profile_changes)}")
    revs = track_revisions(repo, revs, range_)

    def experiment_at(root):
        experiment = version_experiment(spec, case_options, root, repo, name="track")
        return experiment if pin else replace(experiment, pin=False)

    plan = plan_revisions(repo, [(rev, rev, "--revs" if not range_ else "--range") for rev in revs], experiment_at)
    commits = [v.commit for v in plan.versions]
    twice = next((v for v in plan.versions if commits.count(v.commit) > 1), None)
    if twice is not None:
        plan.close()
        raise PerflabError(f"--revs: {' and '.join(v.name for v in plan.versions if v.commit == twice.commit)} are one commit "
                           f"({twice.commit[:10]}); list each revision once")
    try:
        summary = run_versions(plan, out, rounds=rounds, order=order, seed=seed, timeout_s=timeout_s, reuse=True,
                               command=command or "perflab.api.track(...)", kind="track", on_event=on_event, launcher=launcher,
                               record={"threshold": threshold}, pairing=pairing, aa=pairing == "blocks" if aa is None else aa)
        rows = [row for v in plan.versions for row in summary.rows_of(v)]
        series = revision_series(rows, [(v.key, v.name) for v in plan.versions], threshold,
                                 rows_aa=summary.rows_of(summary.copy) if summary.copy else None)
        if not summary.interrupted:  # the causes kept beside the store are this run's (none: the file goes)
            from perflab.diagnosis.change_points import explain_changes, write_causes

            causes = []
            if profile_changes and any(s.change_points for s in series):
                if on_event is not None:
                    on_event("note", text=f"profiling each change point's two revisions ({profile_changes} traced steps a side)")
                causes = explain_changes(series, plan.versions, Path(out), profile_changes, command, repo)
            write_causes(Path(out), causes)
    finally:
        plan.close()
    return summary, series


def _per_side(values, option: str, n: int = 2) -> list:
    """A run option of a program's A/B given once (every side) or once a side (A's, then B's)."""
    from perflab.errors import PerflabError

    values = list(values or [])
    if len(values) > n or (1 < len(values) < n):
        raise PerflabError(f"{option}: give one value (every side) or {n} (A's, then B's), got {len(values)}")
    return values * n if len(values) == 1 else (values or [None] * n)


def _program_sizes(batch_size, seq_len, n: int = 2) -> list:
    batches, seqs = _per_side(batch_size, "--batch-size", n), _per_side(seq_len, "--seq-len", n)
    return list(zip(batches, seqs))


def ab_program(program: Sequence[str], *, repo=None, a: str | None = None, b: str | None = None, python_a: str | None = None,
               python_b: str | None = None, a_args: str | None = None, b_args: str | None = None, skip: int = 5, steps: int = 20,
               nproc: int | None = None, inputs: Sequence[str] = (), step: str | None = None, step_range: str | None = None,
               batch_size: Sequence[int] = (), seq_len: Sequence[int] = (), rounds: int | None = None, order: str = "alternate",
               seed: int | None = None, out=None, timeout_s: float | None = None, threshold: float = 0.05, command: str = "",
               on_event=None, aa: bool | None = None):
    """A/B of the user's own program (``["train.py", "--lr", "3e-4"]``): two sides, each round a fresh ``perflab run``
    process a side in a balanced order, compared by their mean step (``sweep.programs``). The sides: two revisions of
    the git repository ``repo`` (``a``, ``b``), two interpreters (``python_a``, ``python_b``), or two argument strings
    added to the program's command line (``a_args``, ``b_args``; one may be left out: no extra arguments). ``skip``,
    ``steps``, ``nproc``, ``inputs``, ``step``, ``step_range``: each round's ``perflab run`` options; ``batch_size`` and
    ``seq_len``: one value (both sides) or two (A's, then B's). ``rounds``: 2 to 100, even (default 4). ``aa``: a second
    copy of A in every round, the A/A pair the noise floor is measured from (default on: it costs a process a round, and
    without it an A/A reads "faster" or "slower" about 1 run in 20; ``False`` leaves it out).
    Returns (the run's summary, ``analysis.regressions.RowComparison`` of A's row and B's)."""
    import contextlib
    import time
    from pathlib import Path

    from perflab.analysis.regressions import check_threshold, compare_rows
    from perflab.errors import PerflabError
    from perflab.sweep import programs

    check_threshold(threshold)
    forms = [name for name, given in (("--repo/--a/--b", repo is not None or a is not None or b is not None),
                                      ("--python-a/--python-b", python_a is not None or python_b is not None),
                                      ("--a-args/--b-args", a_args is not None or b_args is not None)) if given]
    if len(forms) != 1:
        why = f"{' and '.join(forms)} are two kinds" if forms else "none was given"
        raise PerflabError(f"give the two sides one way ({why}): --repo DIR --a REV --b REV (git revisions), --python-a PATH "
                           "--python-b PATH (interpreters), or --a-args \"...\" --b-args \"...\" (arguments added to the program's)")
    if forms[0] == "--repo/--a/--b" and None in (repo, a, b):
        raise PerflabError("git revisions as sides need --repo DIR, --a REV and --b REV")
    if forms[0] == "--python-a/--python-b" and None in (python_a, python_b):
        raise PerflabError("interpreters as sides need --python-a PATH and --python-b PATH")
    rounds = programs.DEFAULT_ROUNDS if rounds is None else rounds
    options = programs.RoundOptions(skip=skip, steps=steps, nproc=nproc, inputs=tuple(inputs or ()), step=step, step_range=step_range)
    programs.check(options, rounds, order, seed)
    sizes = programs.check_sizes(_program_sizes(batch_size, seq_len))
    words = list(program)
    with contextlib.ExitStack() as stack:
        if forms[0] == "--repo/--a/--b":
            versions = programs.plan_revisions(repo, words, [("A", a, "--a"), ("B", b, "--b")], sizes, stack, side_keys=True)
        elif forms[0] == "--python-a/--python-b":
            versions = programs.plan_interpreters(words, [("A", "--python-a", python_a), ("B", "--python-b", python_b)], sizes)
        else:
            versions = programs.plan_arguments(words, [("A", a_args, "--a-args"), ("B", b_args, "--b-args")], sizes)
        out_dir = Path(out) if out is not None else Path("runs") / "ab" / time.strftime("%Y%m%d-%H%M%S")
        summary = programs.run_program_versions(versions, programs.program_case(words, options), options, out_dir, rounds=rounds,
                                                order=order, seed=seed, timeout_s=timeout_s, kind="ab", threshold=threshold,
                                                command=command or "perflab.api.ab_program(...)", on_event=on_event, aa=aa is not False)
    rows_a, rows_b = (summary.rows_of(v) for v in versions)
    if not (rows_a and rows_b):  # interrupted before the last round: nothing stored to compare
        from perflab.analysis.regressions import RowComparison

        return summary, RowComparison([], threshold=threshold)
    return summary, compare_rows(rows_a, rows_b, threshold, names=("A", "B"), rows_aa=summary.rows_of(summary.copy) if summary.copy else None)


def track_program(program: Sequence[str], *, repo, revs=(), range_: str | None = None, skip: int = 5, steps: int = 20,
                  nproc: int | None = None, inputs: Sequence[str] = (), step: str | None = None, step_range: str | None = None,
                  batch_size: int | None = None, seq_len: int | None = None, rounds: int | None = None, order: str = "alternate",
                  seed: int | None = None, out, timeout_s: float | None = None, threshold: float = 0.05, command: str = "",
                  on_event=None, aa: bool | None = None):
    """The user's program at each of a list of revisions of ``repo`` (``revs``, or ``range_`` ``A..B``), each round a
    fresh ``perflab run`` process a revision in a balanced order, into one store at ``out`` (``sweep.programs``);
    ``rounds`` 2 to 100, even (default 2). ``aa``: a second copy of the first revision in every round, the noise floor
    (default on; ``False`` leaves it out). Returns (the run's summary, the program's series over the revisions with
    its change points: ``analysis.regressions.revision_series``)."""
    import contextlib
    from pathlib import Path

    from perflab.analysis.regressions import check_threshold, revision_series
    from perflab.errors import PerflabError
    from perflab.sweep import programs

    check_threshold(threshold)
    rounds = 2 if rounds is None else rounds
    options = programs.RoundOptions(skip=skip, steps=steps, nproc=nproc, inputs=tuple(inputs or ()), step=step, step_range=step_range)
    programs.check(options, rounds, order, seed)
    programs.check_sizes([(batch_size, seq_len)])
    revs = track_revisions(repo, revs, range_)
    words = list(program)
    with contextlib.ExitStack() as stack:
        versions = programs.plan_revisions(repo, words, [(rev, rev, "--revs" if not range_ else "--range") for rev in revs],
                                           [(batch_size, seq_len)] * len(revs), stack, side_keys=False)
        commits = [v.commit for v in versions]
        twice = next((v for v in versions if commits.count(v.commit) > 1), None)
        if twice is not None:
            raise PerflabError(f"--revs: {' and '.join(v.name for v in versions if v.commit == twice.commit)} are one commit "
                               f"({twice.commit[:10]}); list each revision once")
        summary = programs.run_program_versions(versions, programs.program_case(words, options), options, Path(out), rounds=rounds,
                                                order=order, seed=seed, timeout_s=timeout_s, kind="track", threshold=threshold,
                                                command=command or "perflab.api.track_program(...)", on_event=on_event, aa=aa is not False)
    rows = [row for v in versions for row in summary.rows_of(v)]
    series = revision_series(rows, [(v.key, v.name) for v in versions], threshold,
                             rows_aa=summary.rows_of(summary.copy) if summary.copy else None)
    return summary, series


EXPLAIN_DTYPES = {"cuda": "bf16", "cpu": "fp32"}  # explain's dtype where none is given: a GPU's tensor-core dtype; the CPU's own


def explain_dtype(device: str) -> tuple[str, str]:
    """The dtype ``perflab explain`` uses on ``device`` when --dtype is not given (bf16 on a GPU, fp32 on the CPU), and
    the line that says so."""
    from perflab.runtime.device import resolve_device

    where = resolve_device(device) if device.lower() == "auto" else ("cpu" if device.lower() == "cpu" else "cuda")
    dtype = EXPLAIN_DTYPES[where]
    return dtype, (f"dtype {dtype}: explain's default on the {'GPU' if where == 'cuda' else 'CPU'} (bf16 on a GPU, fp32 on the CPU; "
                   f"--dtype to choose)")


def explain(case: Case, vs: Case | None = None, out_dir="perflab-traces", steps: int = 5, modes=None, on_stage=None, pin: bool = True,
            fixes=None, by_module: bool = False, fixes_on: str = "best", compile_budget_s: float | None = None, gpus: Sequence[int] | None = None,
            on_case=None):
    """Why ``case`` takes its time (and how it differs from ``vs``), per-pass floors, predictions for other modes
    and for ``fixes`` (None: the family's defaults; ["none"]: none) applied on ``fixes_on`` ("best": the fastest of
    eager and the modes measured; "eager"; or a mode), measured. ``pin``: as for :func:`bench`. ``compile_budget_s``: a
    time limit on each compiled case's compile (``perflab.runtime.compile_budget``).

    A data-parallel case (``case.parallel``, a train_step; ``gpus``: its ranks' GPUs, None on the CPU) returns a
    ``perflab.diagnosis.explain_parallel.ParallelExplanation``: its communication against its floor and the communication
    fixes (``ddp:OPTION=VALUE``, ``fsdp``, ``compile``) predicted, then measured.

    Progress (``report.progress.ExplainProgress`` draws it): ``on_stage(stage)`` hears what runs, each part's beginning a
    ``measure.stages.Stage`` that counts the parts; ``on_case(index, case, stage)`` the stages of its timing sessions'
    cases, as :func:`bench`'s."""
    from perflab.diagnosis.explanation import PREDICTED_MODES
    from perflab.diagnosis.explanation import explanation_of as run

    check_profiled_steps(steps)
    if case.parallel:
        from perflab.diagnosis.explain_parallel import check_parallel_explain, explain_parallel

        check_parallel_explain(case, vs, by_module, fixes_on, compile_budget_s, modes)
        return explain_parallel(case, out_dir, steps=steps, gpus=gpus, fixes=fixes, on_stage=on_stage or (lambda s: None))

    return run(case, vs, out_dir, steps=steps, modes=tuple(modes or PREDICTED_MODES), on_stage=on_stage or (lambda s: None), pin=pin,
               fixes=fixes, by_module=by_module, fixes_on=fixes_on, compile_budget_s=compile_budget_s, on_case=on_case)
