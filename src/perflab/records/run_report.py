"""``perflab run``'s report (``OUT/run.json``, and each rank's ``rankR/rank.json`` under torchrun) as one typed record,
declared here, below every stage that writes or reads it: ``program.report`` builds it (``build_run_report``) and
``program.ranks`` adds the ranks' merge; ``api`` (compare's run.json sides), ``analysis.compare``, ``sweep.programs``,
``program.torchrun`` (the scaling over rank counts), ``program.children`` and ``report.run_page`` read it. Every one of
them reads a file through ``load`` (or ``read``, which is ``load`` that answers None where there is no readable
report) and writes one through ``save``: the format is checked in one place.

**The format.** run.json holds ``"format": FORMAT`` first. A file without the key was written before there was one
and reads as format 0 (the same fields: the key is all that was added). A file of a format newer than this perflab
knows is one ``PerflabError`` line (exit 2 at the command line) naming the file and both formats, not a guess at what
its fields mean.

**Absent and null.** A key run.json leaves out is not the same as one it holds as null: the traced-steps section is
absent when the program ended before the traced steps and null when nothing was traced, ``exit_code`` is written only
when the program's end is known. A field left at ``ABSENT`` (falsy) is left out of the dict; ``None`` is written as
null. A report read back keeps what its file left out absent, so that it is written again as it was read.

**The sections** are mappings as the analysis makes them (``analysis.program.program_report``, ``analysis.loop``,
``program.recorder.timing_summary``, ``analysis.comm``), and run.json holds them unchanged. Their keys are declared
once, below, each section a ``Section`` whose annotations are its keys and their types: the timing, the loop (its
stalls, waits, synchronising calls, input, loaders and fix, the GPU's busy share), the traced steps, the accounting,
the verdict and its evidence, the FLOPs, the utilisation, the compiled split, what the recorder saw (its compiler
phases and limit hits), the options, the ranks, the communication and the processes; and ``scaling.json``
(``Scaling``), written beside the counts' run.json. ``RunView`` reads a whole run.json by attribute through them
(``RunView.of(report).loop.stalls.threshold_ms``), its keys ``RunReport``'s fields; a test holds every key of kept
run.json files (CPU, GPU, format 0) to the declarations. ceilings, floors, ddp, fsdp and all_reduce stay mappings of
their builders' keys.

**Built in two steps on rank 0 under torchrun.** ``build_run_report`` makes the whole record of one rank in one step
(under torchrun this rank's ``ddp`` (or ``fsdp``) and ``all_reduce`` too, from ``program.ranks.rank_fields``); only on rank 0 does
``program.ranks.gather`` set the merged fields (``ranks``, ``slowest_rank``, ``step_ms``, ``ranks_missing``,
``communication`` and its note, and the verdict held against the most exposed communication) afterwards. That cannot
be one step: the merge reads every rank's report as written (rank 0's own ``rank.json`` among them), so rank 0's
merged fields exist only after its own rank report has been built and saved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from perflab.errors import PerflabError, show

FORMAT = 1  # run.json's format; a file without the key is format 0 (written before the key was)
FORMAT_KEY = "format"
RUN_FILE, RANK_FILE = "run.json", "rank.json"
NOT_AN_OBJECT = "not a JSON object"  # UnreadableReport's reason for JSON that holds no object
RUN_WHAT = "`perflab run` writes it whole (run it again to have a new one)"


class _Absent:
    """A field run.json leaves out (``None`` is written as null). Falsy, as a missing key's ``.get`` is."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


# --- the sections, read by attribute ------------------------------------------------------------------------------------

class Section:
    """A section of run.json read by attribute. Each subclass declares the section's keys once, as annotations with
    their types; an instance reads the dict run.json holds (``raw``), unchanged, so that what is written is what was
    built. A key the section leaves out reads None; a key declared as a section reads that section (empty where absent,
    so that ``run.loop.stalls.steps`` needs no guard), and a list of sections a list of them. A name not declared is an
    AttributeError, not a None: a misspelt key fails where it is read. A value that is no mapping reads as an empty
    section (a damaged file's, or a format-0 verdict that was a sentence: ``raw`` keeps what was there)."""

    __slots__ = ("raw",)

    def __init__(self, raw=None) -> None:
        self.raw = raw if isinstance(raw, dict) else {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for name in cls.__dict__.get("__annotations__", {}):
            setattr(cls, name, _Key(name))

    def __bool__(self) -> bool:
        return bool(self.raw)

    def __contains__(self, name: str) -> bool:
        """Whether the section holds ``name`` (null or not): a key left out is not the same as one held as null."""
        return name in self.raw

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.raw!r})"

    @classmethod
    def keys(cls) -> set[str]:
        """The declared keys."""
        return set(get_type_hints(cls))


_KINDS: dict[tuple[type, str], tuple[str, type] | None] = {}


def _kind(owner: type, name: str) -> tuple[str, type] | None:
    """("one", S) where the key is declared a section S (or S | None), ("list", S) where a list of them, else None."""
    key = (owner, name)
    if key not in _KINDS:
        hint, found = get_type_hints(owner)[name], None
        args = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) in (Union, UnionType) else [hint]
        for arg in args:
            if isinstance(arg, type) and issubclass(arg, Section):
                found = ("one", arg)
            elif get_origin(arg) is list and get_args(arg) and isinstance(get_args(arg)[0], type) and issubclass(get_args(arg)[0], Section):
                found = ("list", get_args(arg)[0])
        _KINDS[key] = found
    return _KINDS[key]


class _Key:
    """A declared key of a section: read from its dict (``Section``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, section, owner):
        if section is None:
            return self
        value = section.raw.get(self.name)
        kind = _kind(owner, self.name)
        if kind is None:
            return value
        how, cls = kind
        if how == "one":
            return cls(value)
        return [cls(v) for v in value] if isinstance(value, list) else []


# --- the sections' keys (declared; the values are run.json's dicts) ---------------------------------------------------

class TimingSection(Section):
    """The timed (untraced) steps' summary (``program.recorder.timing_summary``), ms."""

    steps: int
    median_ms: float
    mean_ms: float
    p10_ms: float
    p90_ms: float
    cv: float
    ci_ms: list[float]
    ci95_ms: list[float]
    ci_level: str
    ci_units: int
    ci_coverage: float
    ci_clamped: bool  # the CI was cut to the fastest and slowest step (``program.recorder.timing_summary``)
    samples_ms: list[float]
    host_median_ms: float
    modes: dict | None
    host_wait_frac: float | None
    host_steal_frac: float | None


class Throughput(Section):
    samples_per_step: float | None
    tokens_per_step: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    source: str  # where the work a step came from (the batches perflab counted, --batch-size), or why there is none


class LoopInput(Section):
    """The timed steps' waits for input (``analysis.loop``): the exposed wait a step and its share of the wall time;
    where the program's DataLoader workers were watched, their side too (further keys)."""

    waits: int
    waits_per_step: float
    wait_ms_per_step: float
    exposed_ms_per_step: float
    hidden_ms_per_step: float
    exposed_share: float | None
    sources: list[str]
    loaders: list[Loader]
    named: list | None
    fix: InputFix | None
    worker_batch_ms: float | None
    worker_batches: list | None
    workers_seen: int | None


class Loader(Section):
    """One DataLoader the program iterated (``analysis.loop``): its settings."""

    dataset: str | None
    batch_size: int | None
    num_workers: int | None
    pin_memory: bool | None
    prefetch_factor: int | None
    persistent_workers: bool | None


class InputFix(Section):
    """The input's fix (``analysis.loop``): the workers it takes for the GPU not to wait, and the mean step then."""

    num_workers: int | None
    workers_needed: int | None
    batch_ms: float | None
    predicted_mean_ms: float | None
    speedup: float | None
    workers_keep_up: bool | None


class Stalls(Section):
    """The timed steps over ``factor`` × the median (``analysis.loop``): which, how often, what they cost, their cause."""

    steps: list[int]
    count: int
    threshold_ms: float | None
    factor: float
    period: int | None
    share: float | None
    excess_ms: float | None
    cause: str | None
    causes_ms: dict | None
    said: bool
    typical_cv: float | None


class PerStep(Section):
    """Each timed step's waits (``analysis.loop``), ms, in step order."""

    input_ms: list[float]
    exposed_input_ms: list[float]
    sync_ms: list[float]


class SyncSite(Section):
    """A synchronising call's site in the program (``analysis.loop``): the call, where, how often, how long blocked."""

    call: str
    site: str
    per_step: float
    blocked_ms_per_step: float | None


class Sync(Section):
    """The program's synchronising calls in the timed steps (``analysis.loop``)."""

    calls_per_step: float
    blocked_ms_per_step: float
    blocked_share: float | None
    sites: list[SyncSite]


class Busy(Section):
    """The GPU's busy share over the timed steps without a profiler (``analysis.loop``): GPM and NVML's samples."""

    busy_share: float | None
    busy_ms_per_step: float | None
    busy_source: str | None
    gpm_graphics_util: float | None
    gpm_sm_util: float | None
    gpm_sample_ms: float | None
    nvml_util: float | None
    nvml_samples: int | None
    nvml_sample_period_ms: float | None
    window_s: float | None
    why: dict | None  # per source (gpm, nvml), why it read no busy share


class Loop(Section):
    """The whole loop of the timed steps, untraced (``analysis.loop.loop_section``)."""

    steps: int
    median_ms: float
    mean_ms: float
    wall_ms: float
    steps_per_s: float
    mean_over_median: float
    host_mean_ms: float
    per_step: PerStep
    throughput: Throughput
    input: LoopInput | None
    sync: Sync | None
    stalls: Stalls
    busy: Busy | None
    host_own_ms: float | None


class Traced(Section):
    """The traced steps (``analysis.program.program_report``)."""

    steps: int
    step_ms: float
    step_ms_each: list[float]
    warmup_step_ms: list[float]
    window_ms: float
    untraced_ms: float
    inflation: float | None
    inflation_limit: float
    inflated: bool
    trace_path: str | None
    cpu_only: bool


class AccountingNs(Section):
    """The traced steps' wall time, closed exactly: wall = busy + host-bound + kernel gaps + other (ns)."""

    start_ns: int
    end_ns: int
    wall_ns: int
    busy_ns: int
    idle_ns: int
    host_bound_ns: int
    kernel_gap_ns: int
    other_ns: int


class AccountingSection(Section):
    """Where the traced steps' time went (``analysis.program.program_report``, from the trace)."""

    wall_us: float
    gpu_busy_us: float
    idle_us: float
    idle_by_cause_us: dict
    accounting_ns: AccountingNs
    kernels: int
    kernels_per_step: float
    top_kernels: list[dict]
    categories_us: dict
    step_accounting: dict
    launch: dict


class Verdict(Section):
    """What bounds the step (``analysis.program.step_verdict``): its kind and the sentence saying it."""

    verdict: str
    message: str
    kernel_fill: float
    busy_share: float
    fill: float
    step_ms: float
    median_ms: float
    busy_ms: float
    busy_basis: str  # where busy_ms is not the traced steps' own time (an inflated CPU trace's, carried to the untraced step)
    host_ms: float
    host_own_ms: float | None
    exposed_comm_ms: float | None
    input_exposed_share: float | None
    near_line: float  # the busy share less GPU_BOUND_FILL, where it lies within NEAR_FILL_LINE of that line
    exposed_comm_share: float | None
    busy_basis: str | None


class Evidence(Section):
    """What the verdict was drawn from (``analysis.program.program_report``'s ``verdict_evidence``)."""

    step_ms: float | None
    mean_ms: float | None
    busy_ms: float | None
    busy_share: float | None
    busy_source: str | None
    busy_basis: str | None
    traced_busy_ms: float | None
    nvml_util: float | None
    communication_apart: bool | None
    categories_ms: dict | None
    host_ms: float | None
    host_source: str | None
    host_mean_ms: float | None
    host_own_ms: float | None
    host_bound_idle_ms: float | None
    inflation: float | None
    inflated: bool | None
    cpu_only: bool | None
    cpu_verdict: dict | None
    operator_share: float | None
    input: dict | None
    input_exposed_share: float | None
    sync_idle: dict | None
    sync_sites: list | None
    sync_blocked_ms: float | None
    syncs_per_step: float | None


class Flops(Section):
    """The traced steps' FLOPs counted from their operators' shapes (``analysis.op_flops.OpFlops.to_dict``)."""

    flops: int
    flops_per_step: float
    steps: int
    counted_calls: int
    by_op: dict
    by_dtype: dict
    conv_by_dtype: dict
    dtype: str | None
    uncounted_ops: dict
    heavy_gpu_ns: int
    uncounted_heavy_gpu_ns: int
    uncounted_heavy_share: float | None
    shapes_recorded: bool
    complete: bool
    known: bool


class Utilisation(Section):
    """MFU and MBU against the GPU's measured peaks (``analysis.program``)."""

    mfu: float | None
    mbu: float | None
    dtype: str | None
    flops_by_precision: dict
    peak_tflops: float | None
    copy_gbps: float | None
    bytes_per_step: int | None
    bytes_source: str
    mfu_lower_bound: bool
    ceilings_measured_at: str | None


class Compiled(Section):
    """The traced work launched inside compiled regions and outside them (``analysis.program.compiled_split``)."""

    compiled_ns: int
    eager_ns: int
    dynamo_overhead_ns: int
    communication_ns: int
    compiled_share: float | None
    eager_share: float | None
    eager_top: list
    unknown: str  # why the split could not be made (no operators recorded)


class CompilePhase(Section):
    """What dynamo did in one phase of the run (``program.compiler.delta``): frames, graphs, breaks, recompiles."""

    frames: int
    frames_ok: int
    graphs: int
    backend_graphs: int
    graph_breaks: int
    recompiles: int
    break_reasons: list


class LimitHit(Section):
    """A frame that hit one of dynamo's limits (``program.compiler``): from then on it runs eagerly."""

    function: str
    where: str
    limit: str
    value: int
    step: int | None
    last_reason: str | None


class OwnWork(Section):
    """perflab's own work at one step boundary (``program.recorder``): perflab's step, its phase, the milliseconds and
    their parts. It lands in the program's own step that holds the boundary."""

    step: int
    phase: str
    ms: float
    parts: dict


class RecordedSection(Section):
    """What the recorder saw (``program.recorder.Recorded``), less the step times (in timing and traced)."""

    device: str | None
    phase: str | None
    steps_seen: int | None
    trace_path: str | None
    shapes_trace_path: str | None
    traced_steps: int | None
    trace_warmup: int | None
    trace_note: str | None
    profiler_seconds: float | None
    compile_phases: dict
    limit_hits: list[LimitHit]
    optimizers: list
    own_work: list[OwnWork]
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    peak_rss_bytes: int | None
    wall_s: float | None


class Options(Section):
    """The run's options (``program.recorder.RunOptions``), as given."""

    skip: int
    steps: int
    trace: int
    trace_warmup: int
    record_shapes: bool
    shapes_steps: int
    inflation_limit: float
    stall_factor: float
    stop_after: str | None
    batch_size: int | None
    seq_len: int | None
    inputs: list | None
    out_dir: str


class CommunicationRank(Section):
    """One rank's communication in the merged traces (``analysis.comm.communication_section``), ms a step."""

    rank: int
    step_ms: float
    traced_step_ms: float
    comm_ms: float
    exposed_ms: float
    waiting_ms: float | None
    transfer_ms: float | None
    overlapped_ms: float
    overlap_fraction: float | None
    measured_over_floor: float | None


class Communication(Section):
    """The ranks' communication (rank 0 under torchrun, ``analysis.comm.communication_section``): the floor of the
    all-reduces the gradients need (DDP), or of the all-gathers and reduce-scatters (FSDP), at the measured bus
    bandwidth, and each rank's exposed share."""

    world_size: int
    steps_profiled: int
    note: str | None
    floor_ms: float | None
    ranks: list[CommunicationRank]
    mode: str | None  # ddp, fsdp, or None without a data-parallel module
    grad_bytes: int | None
    param_bytes: int | None
    collectives: list | None  # each collective a step: its payload, bus bytes, calls and one call's message
    bus_bytes: int | None
    calls: int | None
    buckets: list | None
    message_bytes: int | None
    busbw_gbps: float | None
    busbw_size_bytes: int | None
    busbw_source: str | None
    latency_us: float | None
    floor_fraction: float | None
    floor_note: str | None


class RankRow(Section):
    """One rank in rank 0's merge (``program.ranks.merge``): its step, its CI and flags, its loop."""

    rank: int
    median_ms: float | None
    ci_ms: list[float] | None
    ci_coverage: float | None
    ci95_ms: list[float] | None
    steps_seen: int | None
    flags: list[str]
    mean_ms: float | None
    input_exposed_ms: float | None
    input_share: float | None


class Process(Section):
    """One process the program started (``program.children.processes_section``); those not followed of one kind are
    one row, with their count and pids."""

    pid: int
    ppid: int | None
    kind: str
    target: str | None
    rank: int | None
    followed: bool
    steps_seen: int | None
    timed_steps: int | None
    exit_code: int | None
    out_dir: str | None
    why: str | None
    count: int
    pids: list[int]


class Flag(Section):
    flag: str
    message: str


class ScalingRow(Section):
    """One rank count of ``perflab run --nproc 1,2`` (``analysis.program.scaling_section``)."""

    nproc: int
    step_ms: float | None
    ci95_ms: list[float] | None
    flops_per_rank_step: float | None
    work_ratio: float | None
    expected_ms: float | None
    growth_ms: float | None
    efficiency: float | None
    ranks: list[dict]
    verdict: str | None


class Scaling(Section):
    """``OUT/scaling.json`` of ``perflab run --nproc 1,2`` (beside each count's ``nprocN/run.json``): the counts in the
    order given, the first the base."""

    counts: list[int]
    rows: list[ScalingRow]
    base: int | None
    note: str | None


@dataclass
class RunReport:
    """One rank's report of a ``perflab run``, and on rank 0 under torchrun the ranks merged. ``to_dict`` is run.json;
    the fields are in run.json's key order (``format`` first). Each field holds run.json's value (a section is the dict
    its builder made) and is annotated with what it is read as: ``RunView`` reads the record by attribute, each
    section as its ``Section``."""

    # run.json's format (``FORMAT``; 0: a file written before the key was)
    format: int = field(default=FORMAT, kw_only=True)
    # the timed steps' summary (``program.recorder.timing_summary``) and the device the steps ran on
    timing: TimingSection
    device: str | None
    # the whole loop of the timed steps, untraced (``analysis.loop``): mean and median, throughput, stalls, input waits,
    # synchronising calls, the GPU's busy share; null where no step was timed
    loop: Loop | None = ABSENT
    # the traced steps' analysis (``analysis.program.program_report``): absent when the program ended before them
    traced: Traced | None = ABSENT
    accounting: AccountingSection | None = ABSENT
    flops: Flops | None = ABSENT
    utilisation: Utilisation | None = ABSENT
    floors: dict | None = ABSENT
    verdict: Verdict | None = ABSENT
    compiled: Compiled | None = ABSENT
    traced_verdict: str | None = ABSENT  # present when a trace was read
    ceilings: dict | None = ABSENT  # the GPU's measured peaks the floors were held against
    verdict_evidence: Evidence | None = ABSENT  # present when a trace was read
    model_bytes: dict | None = ABSENT  # the modules' parameter and buffer bytes on the GPU
    ceilings_note: str | None = ABSENT
    report_error: str | None = ABSENT  # perflab's own failure to analyse the traced steps
    # the run itself
    program: str | None = ABSENT
    steps_from: str | None = ABSENT
    options: Options | None = ABSENT
    recorded: RecordedSection | None = ABSENT  # what the recorder saw, less the step times (in timing and traced)
    partial: bool | None = ABSENT  # the program ended before the traced steps did
    rank: int | None = ABSENT
    world_size: int | None = ABSENT
    run_id: str | None = ABSENT  # the run's id: every rank's report and every child's carries it; a run reads only its own
    flags: list[Flag] | None = ABSENT  # the validity flags (``program.report.run_report_checks``)
    # the processes the program started (``program.children``), where it started any: each one's kind, whether it
    # was followed (and why not), its steps; and where it stepped only in them, whose report this is
    processes: list[Process] | None = ABSENT
    steps_in: str | None = ABSENT
    report_of: str | None = ABSENT
    # the program's end: known only when run.json is written after it
    exit_code: int | None = ABSENT
    ended_by: str | None = ABSENT  # exit, exception, interrupt or sigterm
    last_words: str | None = ABSENT  # the exception (or sys.exit's message) the program ended with
    perflab_notes: list[str] | None = ABSENT  # perflab's own failures, said after the program
    # under torchrun (``program.ranks``): this rank's DDP layout (or its FSDP layout, only where it has one) and the
    # all-reduce sweep; on rank 0 the merge
    ddp: dict | None = ABSENT
    fsdp: dict | None = ABSENT
    all_reduce: dict | None = ABSENT
    ranks: list[RankRow] | None = ABSENT
    slowest_rank: int | None = ABSENT
    step_ms: float | None = ABSENT  # the slowest rank's median step
    ranks_missing: list[int] | None = ABSENT
    communication: Communication | None = ABSENT
    communication_note: str | None = ABSENT

    def to_dict(self) -> dict:
        """run.json's dict: the fields in order, those absent left out, and ``format`` where it is one (a format-0
        report read back is written again as it was, without the key)."""
        return {f.name: value for f in fields(self)
                if (value := getattr(self, f.name)) is not ABSENT and not (f.name == FORMAT_KEY and value == 0)}

    @classmethod
    def from_dict(cls, data: dict, path=None) -> RunReport:
        """A report read back (run.json, a rank's rank.json): its format checked (``check_format``; none is 0), the keys
        it does not know left out, the ones it leaves out kept absent."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known and k != FORMAT_KEY}
        return cls(**{"timing": ABSENT, "device": ABSENT, **values}, format=check_format(data, path))

    def get(self, name: str, default=None):
        """A field's value, ``default`` where it is absent (or no field of the record), as a dict's ``get``."""
        value = getattr(self, name, ABSENT)
        return default if value is ABSENT else value

    # the sections as their readers take them: a mapping, {} where the report holds none (or a damaged one)
    def section(self, name: str) -> dict:
        value = getattr(self, name, ABSENT)
        return value if isinstance(value, dict) else {}

    def flag_names(self) -> list[str]:
        """The validity flags' names, those that are well formed."""
        flags = self.flags
        return [f["flag"] for f in flags if isinstance(f, dict) and isinstance(f.get("flag"), str)] if isinstance(flags, list) else []


class RunView(Section):
    """A run.json read by attribute, its sections as their ``Section``s: the keys are ``RunReport``'s fields, with the
    types they are annotated with there (one declaration)."""

    __annotations__ = dict(RunReport.__annotations__)

    @classmethod
    def of(cls, report) -> RunView:
        """The view of a ``RunReport`` (its run.json dict) or of run.json's dict itself."""
        return cls(report.to_dict() if isinstance(report, RunReport) else report)


class UnreadableReport(PerflabError):
    """No report could be read at a path: it cannot be read, is not JSON, or is not a JSON object. ``reason``: why, in
    a few words (the OS's, or the parser's)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class NewerFormat(PerflabError):
    """A report of a format newer than this perflab knows."""


def check_format(data: dict, path=None) -> int:
    """The format a report's dict holds (0 where it holds none); a newer one than ``FORMAT``, or one that is no
    format, is one PerflabError line."""
    where = f"{path}: " if path is not None else ""
    value = data.get(FORMAT_KEY, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnreadableReport(f"{where}damaged, its {FORMAT_KEY!r} is {show(value)}, not a format number; {RUN_WHAT}", "no format number")
    if value > FORMAT:
        from perflab.version import __version__

        raise NewerFormat(f"{where}a perflab run report of format {value}, newer than this perflab ({__version__}) reads (up to "
                          f"{FORMAT}): read it with the perflab that wrote it, or upgrade perflab")
    return value


def read_dict(path, what: str = RUN_WHAT) -> dict:
    """The JSON object at ``path``, or UnreadableReport: it cannot be read, is not JSON, or not a JSON object."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        reason = str(exc.strerror or exc)
        raise UnreadableReport(f"{path}: could not be read ({reason})", reason) from None
    except ValueError as exc:  # not UTF-8
        raise UnreadableReport(f"{path}: damaged, not JSON ({exc}); {what}", str(exc)) from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UnreadableReport(f"{path}: damaged, not JSON ({exc}); {what}", str(exc)) from None
    if not isinstance(data, dict):
        raise UnreadableReport(f"{path}: damaged, not a JSON object; {what}", NOT_AN_OBJECT)
    return data


def load(path, what: str = RUN_WHAT) -> RunReport:
    """The report at ``path`` (run.json, rank.json). UnreadableReport where there is none to read there; NewerFormat
    where its format is newer than this perflab's. The fields are as written (a damaged section is the reader's to
    refuse: ``section`` gives {} for one that is no mapping)."""
    return RunReport.from_dict(read_dict(path, what), path)


def read(path) -> RunReport | None:
    """``load``, or None where there is no report to read at ``path`` (no such file, not JSON, not an object). A report
    of a newer format is still an error: it is there, and cannot be read right."""
    try:
        return load(path)
    except UnreadableReport:
        return None


def save(report: RunReport, path) -> None:
    """The report written to ``path``, whole or not at all."""
    write_json(Path(path), report.to_dict())


def write_json(path: Path, data: dict) -> None:
    """A JSON file (a report, scaling.json) written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, default=str))
        tmp.replace(path)
    except OSError:  # a full disk: no half-written file left beside the report
        tmp.unlink(missing_ok=True)
        raise
