"""The command line's flags, declared once and shared by the commands (as asv's ``common_args``).

``case_flags``: the case-flag group, what describes a case (its shapes, precision, mode, device, timing, build), made
from the fields' declarations (``perflab.spec.CASE_FIELDS``: each flag's help, default and whether it takes several
values), which every command that takes a case takes: bench, ab, track, profile, compare, explain, ncu and breakeven.
A command leaves out what it has no use for and swaps in a variant where it takes one value instead of several
(explain's one case); it gets the group's values as one ``CaseFlags``, which turns them into ``api.make_cases``' keyword
arguments. Below the group: single flags that several commands share, and ab's and track's (``versions_flags``: the
case-flag group with --model, --spec and how the rounds run, as one ``VersionsFlags``).
"""

from __future__ import annotations

import functools
import inspect
import typing
from pathlib import Path
from typing import List, Optional

import typer

from perflab.errors import PerflabError
from perflab.spec import CASE_FIELDS, Case, CaseField

# The case-flag group, in the order --help lists it: name -> (annotation, option) each, made from the fields' declarations
# (perflab.spec.CASE_FIELDS: their flags, help and defaults).
_CASE_TYPES = typing.get_type_hints(Case)


def _annotation(field: CaseField):
    """The type a case field's flag takes: its ``flag_type``, else the Case's (a list of them where it takes several)."""
    if field.flag_type is not None:
        return field.flag_type
    hint = _CASE_TYPES[field.name]
    optional = type(None) in typing.get_args(hint)
    one = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
    if typing.get_origin(one) is tuple:  # keep_rate, reduction_loc: one case's tuple, given value by value
        one = typing.get_args(one)[0]
    if field.list_valued:
        return List[one]
    return Optional[one] if optional else one


CASE_FLAGS = {f.param: (_annotation(f), typer.Option(f.flag_default, f.option, help=f.help)) for f in CASE_FIELDS.values() if f.in_group}

# Parts of the group that a command may leave out.
FAMILY_SHAPES = ("workload", "seq_len", "prompt_len", "context_len", "new_tokens", "layers", "layers_only", "model_arg", "max_memory", "family")
TIMING = ("warmup", "min_time", "iters", "repeats")
BUILD = ("seed", "optimizer", "checkpoint_activations")
# make_cases takes these as lists: a command's one-value variant (explain's --batch-size N) is handed on as [N], or [] when not given
LIST_VALUED = tuple(f.param for f in CASE_FIELDS.values() if f.in_group and f.list_valued)
# Of those, the ones make_cases makes a case of each value of (a token-reducing case takes all its keep rates and
# reduction locations together): the axes of its product.
CASE_PER_VALUE = tuple(f.param for f in CASE_FIELDS.values() if f.in_group and f.axis is not None)

# One-value variants, for the commands that take one case (explain, ncu) or one per side (compare).
ONE_INPUT_SIZE = (Optional[int], typer.Option(None, "--input-size", help="Image models: input resolution (default 224)."))
ONE_BATCH_SIZE = (Optional[int], typer.Option(None, "--batch-size", help="Batch size (default: the family's)."))
GPU_DEVICE = (str, typer.Option("cuda", "--device", help="cuda; cpu for explain --parallel only (its ranks as gloo processes)."))


class CaseFlags:
    """The case-flag group's values, as a command was given them."""

    def __init__(self, values: dict):
        self.values = values

    def __getitem__(self, name: str):
        return self.values[name]

    def options(self, **given) -> dict:
        """``api.make_cases``' keyword arguments (one-value flags as lists, --model-arg's NAME=VALUE read), then ``given``.
        A bad --model-arg raises here: a command calls this where it reads its cases, after its own checks, so that the
        first mistake on its command line is the one said."""
        options = {name: (value if isinstance(value, list) else [] if value is None else [value]) if name in LIST_VALUED else value
                   for name, value in self.values.items()}
        if "model_arg" in options:
            options["model_args"] = model_args(options.pop("model_arg"))
        return options | given

    def one_case_options(self, command: str, **given) -> dict:
        """``options`` for a command that takes one case of each model it names (explain, ncu): a flag of the group given
        several values is refused, naming it; make_cases would make a case of each, and the command would take the
        first for its case and the second for the next model's (explain's --vs)."""
        several = [(name, value) for name, value in self.values.items() if name in CASE_PER_VALUE and isinstance(value, list) and len(value) > 1]
        if several:
            name, values = several[0]
            raise PerflabError(f"--{name.replace('_', '-')}: {command} takes one case, got {len(values)} values "
                               f"({' '.join(map(str, values))}); run it once per value")
        return self.options(**given)


def model_args(items: list[str]) -> dict:
    """--model-arg NAME=VALUE, as make_cases' ``model_args``: ints, floats or (anything else) strings."""
    args = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise PerflabError(f"--model-arg: expected NAME=VALUE such as d_ff=2048, got {item!r}")
        value = value.strip()
        try:
            args[key.strip()] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            args[key.strip()] = value
    return args


def case_flags(leave_out=(), **variants):
    """A command that takes the case-flag group, where its ``flags`` parameter stands, and gets the values as
    ``flags: CaseFlags``. ``leave_out``: flags of the group it does not take; ``variants``: NAME=(annotation, option) for a
    flag it takes in another form (one value, another default)."""
    return _flag_group("flags", _case_group(leave_out, variants), CaseFlags)


_GROUP_CTX = "_group_ctx"


def _refuse_several_of_one(ctx) -> None:
    """A flag that takes several values in other commands but one in this one (explain's --batch-size, ncu's --mode),
    given several (``--batch-size 1 8``, or the flag twice): refused, for the parser keeps the last alone."""
    from perflab import cli_argv

    once = {opt for p in ctx.command.params if p.param_type_name == "option" and not p.multiple for opt in p.opts}
    for flag, values in cli_argv.repeated_values(cli_argv.of(ctx).parsed).items():
        if flag in once:
            raise PerflabError(f"{flag}: {ctx.info_name} takes one value, got {len(values)} ({' '.join(values)})")


def versions_flags():
    """ab and track: their cases (--model with the case-flag group, or --spec) and how their rounds run, where the
    command's ``versions`` parameter stands, as ``versions: VersionsFlags``."""
    case = _case_group()
    own = _parameters(VERSIONS_FLAGS)
    return _flag_group("versions", own[:1] + case + own[1:],
                       lambda values: VersionsFlags({p.name: values[p.name] for p in own}, CaseFlags({p.name: values[p.name] for p in case})))


def _case_group(leave_out=(), variants=None) -> list[inspect.Parameter]:
    variants = variants or {}
    unknown = (set(leave_out) | set(variants)) - set(CASE_FLAGS)
    if unknown:
        raise ValueError(f"not flags of the case group: {sorted(unknown)}")
    return _parameters({name: variants.get(name, flag) for name, flag in CASE_FLAGS.items() if name not in leave_out})


def _parameters(flags: dict) -> list[inspect.Parameter]:
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=option)
            for name, (annotation, option) in flags.items()]


def _flag_group(param: str, group: list[inspect.Parameter], make):
    """Decorates a command: the flags ``group`` stand where its parameter ``param`` stands, and it is called with
    ``param=make({name: value})`` of them."""

    def decorate(command):
        params = list(inspect.signature(command, eval_str=True).parameters.values())
        at = [p.name for p in params].index(param)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
        # the parser's context, to read what was typed: the command's own ctx parameter, else one the wrapper takes
        ctx_name = next((p.name for p in own if p.annotation is typer.Context), None)
        added = [] if ctx_name else [inspect.Parameter(_GROUP_CTX, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]

        @functools.wraps(command)
        def wrapper(**kwargs):
            _refuse_several_of_one(kwargs[ctx_name] if ctx_name else kwargs.pop(_GROUP_CTX))
            return command(**{param: make({p.name: kwargs.pop(p.name) for p in group})}, **kwargs)

        wrapper.__signature__ = inspect.Signature(own[:at] + group + own[at + 1:] + added)
        wrapper.__annotations__ = {p.name: p.annotation for p in wrapper.__signature__.parameters.values()}
        return wrapper

    return decorate


# Single flags that several commands share.
OPT_STEPS = typer.Option(5, "--steps", help="Steps to record in the profiled pass (after one warm-up step).")
OPT_TRACE_DIR = typer.Option(Path("perflab-traces"), "--out", help="Directory for the traces it records.")
OPT_NO_PIN = typer.Option(False, "--no-pin", help="Time with the timing thread unpinned (default: pinned to one core for "
                          "warm-up and the timed loop, where the OS allows; not part of case ids).")
OPT_NO_INTERLEAVE = typer.Option(False, "--no-interleave", help="Time each case alone, right after its warm-up (default: build and "
                                 "warm every case that fits, then time them in seeded random interleaved blocks).")
OPT_PARALLEL = typer.Option(None, "--parallel", help="Train on several ranks, one process each: ddp or fsdp, options after a colon "
                            "(ddp:bucket_cap_mb=100,grad_view=true,no_sync=4; fsdp:reshard=false). The batch is per rank.")
OPT_RANK_GPUS = typer.Option(None, "--gpus", help="With --parallel: the GPUs of the ranks, e.g. 0,1 (one rank each).")
OPT_WORLD_SIZE = typer.Option(None, "--world-size", help="With --parallel: the number of ranks (default: one per --gpus; "
                              "on the CPU, gloo processes).")
OPT_INDUCTOR_CACHE = typer.Option(None, "--inductor-cache", help="A directory for inductor's caches (FX graphs, autotuning "
                                  "choices), shared by every process this run starts: max-autotune then takes the kernels the first "
                                  "process chose instead of tuning afresh (default: inductor's, /tmp/torchinductor_$USER, one host's).")
OPT_THRESHOLD = typer.Option(0.05, "--threshold", help="Stored results (and the untraced timings beside two traces): a ratio beyond "
                             "1 ± this fraction, with a CI that excludes 1, is faster or slower (default 0.05, asv's); a CI inside it "
                             "is no change.")
OPT_PROCESSES = typer.Option(1, "--processes", help="Spread each case's samples over N processes, 1 to 100 (this one, then fresh ones); "
                             "the CI then covers between-process variance.")

# ab and track: the versions' flags.
OPT_VERSIONS_MODEL = typer.Option([], "--model", help="The cases as bench's flags (instead of --spec): model name(s) or your own, "
                                  "path/file.py:NAME (relative: read in each revision's worktree), package.module:NAME, hf:DIR.")
OPT_VERSIONS_SPEC = typer.Option(None, "--spec", help="The cases as an experiment spec (instead of bench flags); a spec inside "
                                 "--repo is read from each revision's worktree.")
OPT_ROUNDS_ORDER = typer.Option("alternate", "--order", help="The versions' order in each round, balanced: alternate (A B, B A, "
                                "B A, A B, ...) or random (each pair of rounds' order drawn with --order-seed, reversed in the "
                                "second); with --pairing blocks, also the order of the interleaved blocks in each round's process.")
OPT_ORDER_SEED = typer.Option(None, "--order-seed", help="Seed of --order random (default 0), and of the order of several cases' "
                              "blocks in a round; refused where it would change nothing (--order alternate with one case, or "
                              "with --pairing processes).")
OPT_AA = typer.Option(None, "--aa/--no-aa", help="Time a second copy of the first version beside the others in every round, an "
                      "A/A pair whose ratio is the noise floor the verdicts are judged against (default: on with --pairing blocks, "
                      "where it costs a block per round; off with processes, where it costs a process per round; on for a program, whose "
                      "A/A reads faster or slower about 1 run in 20 without it).")
OPT_VERSIONS_TIMEOUT = typer.Option(None, "--timeout", help="Seconds per case before its worker is killed (default: the spec's, else "
                                    "600); a blocks round's process gets this for each case at each version it holds.")
OPT_VERSIONS_LAUNCHER = typer.Option(None, "--launcher", help="fork (default: one launcher per interpreter forks the workers) or exec.")
PAIRING_HELP = ("blocks: each round is one process that builds every version's cases and times them interleaved, block by block "
                "(a process's own speed cancels in the ratio); processes: each case at each version a process of its own, the "
                "versions' processes alternated (--order)")
# In --help order, --model first and the case-flag group after it.
VERSIONS_FLAGS = {
    "model": (List[str], OPT_VERSIONS_MODEL), "spec": (Optional[Path], OPT_VERSIONS_SPEC), "order": (str, OPT_ROUNDS_ORDER),
    "order_seed": (Optional[int], OPT_ORDER_SEED), "aa": (Optional[bool], OPT_AA), "timeout": (Optional[float], OPT_VERSIONS_TIMEOUT),
    "no_pin": (bool, OPT_NO_PIN), "launcher": (Optional[str], OPT_VERSIONS_LAUNCHER),
}


# ab and track of a program (a program after "--"): each round's perflab run options, and ab's sides by arguments
OPT_A_ARGS = typer.Option(None, "--a-args", help="A program's A/B: side A is the program with these arguments added (one string, "
                          "split as a shell would: --a-args \"--compile=False\"); without it, side A is the program as given.")
OPT_B_ARGS = typer.Option(None, "--b-args", help="A program's A/B: side B is the program with these arguments added; without it, "
                          "side B is the program as given.")
OPT_PROGRAM_SKIP = typer.Option(None, "--skip", help="A program (after --): steps each round's perflab run lets run first, untimed (default 5).")
OPT_PROGRAM_STEPS = typer.Option(None, "--steps", help="A program (after --): steps each round's perflab run times (default 20).")
OPT_PROGRAM_NPROC = typer.Option(None, "--nproc", help="A program (after --): run it under torchrun with this many ranks; the "
                                 "slowest rank's step is compared.")
OPT_PROGRAM_INPUT = typer.Option(None, "--input", help="A program (after --): a function whose calls are waits for input, as "
                                 "perflab run's --input (repeatable).")
OPT_PROGRAM_STEP = typer.Option(None, "--step", help="A program (after --): a step is each call of this function, as perflab run's --step.")
OPT_PROGRAM_STEP_RANGE = typer.Option(None, "--step-range", help="A program (after --): a step is each NVTX or record_function range "
                                      "whose name starts with this, as perflab run's --step-range.")
# name → (annotation, option): the flags a program's ab and track take beside the versions' own
PROGRAM_FLAGS = {"skip": (Optional[int], OPT_PROGRAM_SKIP), "steps": (Optional[int], OPT_PROGRAM_STEPS),
                 "nproc": (Optional[int], OPT_PROGRAM_NPROC), "inputs": (Optional[List[str]], OPT_PROGRAM_INPUT),
                 "step": (Optional[str], OPT_PROGRAM_STEP), "step_range": (Optional[str], OPT_PROGRAM_STEP_RANGE)}


def program_flags():
    """ab and track: each round's ``perflab run`` options for a program after "--" (--skip, --steps, --nproc, --input,
    --step, --step-range), where the command's ``program`` parameter stands, as ``program: ProgramFlags``."""
    own = _parameters(PROGRAM_FLAGS)
    return _flag_group("program", own, ProgramFlags)


class ProgramFlags:
    """A program's ab or track: the run options given (None where not given)."""

    def __init__(self, values: dict):
        self.values = values

    def given(self) -> list[str]:
        """The flags given, as typed (--skip, --input, ...)."""
        return [PROGRAM_FLAGS[name][1].param_decls[0] for name, value in self.values.items() if value not in (None, [])]

    def options(self) -> dict:
        """``api.ab_program``'s and ``track_program``'s keyword arguments for each round's perflab run."""
        v = self.values
        out = {"skip": 5 if v["skip"] is None else v["skip"], "steps": 20 if v["steps"] is None else v["steps"], "nproc": v["nproc"],
               "inputs": tuple(v["inputs"] or ()), "step": v["step"], "step_range": v["step_range"]}
        return out


def case_flags_given(case: CaseFlags, allowed=()) -> list[str]:
    """The case-flag group's flags given other values than their defaults (as typed), leaving out ``allowed``: a
    program's A/B takes none of them but --batch-size and --seq-len."""
    given = []
    for name, value in case.values.items():
        if name in allowed or name not in CASE_FLAGS:
            continue
        default = CASE_FLAGS[name][1].default
        if value != default and not (value in (None, []) and default in (None, [])):
            given.append(CASE_FLAGS[name][1].param_decls[0])
    return given


class VersionsFlags:
    """ab's and track's shared flags' values, as a command was given them."""

    def __init__(self, values: dict, case: CaseFlags):
        self.values = values
        self.case = case

    def options(self) -> dict:
        """``api.ab``'s and ``api.track``'s keyword arguments for the cases and how the rounds run them."""
        v = self.values
        return dict(spec=v["spec"], case_options=self.case.options(model=v["model"]), order=v["order"], seed=v["order_seed"],
                    aa=v["aa"], timeout_s=v["timeout"], launcher=v["launcher"], pin=not v["no_pin"])
