"""compare: Δwall = Σ Δcategory GPU time − Δoverlap + Δidle by cause, exactly; on real traces and on
random synthetic kernel tables."""

from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perflab.analysis.compare import compare_traces, step_profile
from perflab.errors import PerflabError
from perflab.trace import load_trace
from perflab.trace.schema import KERNEL_COLUMNS, Trace

TRACES = sorted((Path(__file__).parent / "data" / "traces").glob("*.json.gz"))
CATEGORIES = ["gemm", "attention", "elementwise", "sort/topk/gather/index"]


@pytest.fixture(scope="module")
def loaded():
    return {p.name: load_trace(p) for p in TRACES}


def test_every_pair_of_committed_traces_closes_to_the_nanosecond(loaded):
    for (na, a), (nb, b) in combinations(loaded.items(), 2):
        if (len(a.steps) > 0) != (len(b.steps) > 0):  # a step against a whole trace: refused
            with pytest.raises(PerflabError, match="has step annotations"):
                compare_traces(a, b, (na, nb))
            continue
        c = compare_traces(a, b, (na, nb))
        assert abs(c.closure_ns()) < 1e-3, (na, nb, c.closure_ns())
        assert abs(c.a.closure_ns()) < 1e-3 and abs(c.b.closure_ns()) < 1e-3


def test_a_trace_against_itself_changes_nothing(loaded):
    t = loaded["eager_vit.json.gz"]
    c = compare_traces(t, t)
    assert c.delta_wall_ns == 0 and all(v == 0 for v in c.delta_by_category.values())
    assert len(c.added_kernels) == 0 and len(c.removed_kernels) == 0


def test_added_and_removed_kernels_are_matched_by_full_name_with_one_short_name_each(loaded):
    a, b = loaded["eager_vit.json.gz"], loaded["lm_train_step_explicit.json.gz"]
    c = compare_traces(a, b)
    records = c.to_dict()["added_kernels"] + c.to_dict()["removed_kernels"]
    assert len({r["full_name"] for r in records}) == len({r["name"] for r in records}) == len(records) > 10
    assert all(len(r["name"]) <= 100 for r in records) and max(len(r["full_name"]) for r in records) > 500
    # the lm trace runs four different kernels that all shorten to vectorized_elementwise_kernel<MulFunctor<float>>
    # (Binary and AUnary/BUnary functors, fp32 and bf16 tensors): kept apart, counted apart, told apart by #2, #3, #4
    mul = [r for r in c.added_kernels.to_dict(orient="records") if r["name"].startswith("vectorized_elementwise_kernel<MulFunctor<float>>")]
    assert sorted(r["name"][len("vectorized_elementwise_kernel<MulFunctor<float>>"):] for r in mul) == ["", " #2", " #3", " #4"]
    assert [r["count_b"] for r in mul] == [22, 10, 6, 4] and len({r["full_name"] for r in mul}) == 4
    steps = min(len(a.steps), len(b.steps))
    kernels = b.kernels
    for r in mul:  # per step, exactly the launches of that full name in B (A has none)
        assert r["count_b"] == pytest.approx(step_profile(b, steps).by_name.loc[r["full_name"], "count"])
        assert r["count_a"] == 0 and (kernels["name"].astype(str) == r["full_name"]).any()


def test_step_profile_matches_direct_sums(loaded):
    """Per-step means recomputed here by hand from the KernelTable and the step annotations."""
    t = loaded["train_step.json.gz"]
    p = step_profile(t)
    steps = t.steps.sort_values("start_ns")
    starts = steps["start_ns"].to_numpy()
    launched = np.where(t.kernels["launch_start_ns"] >= 0, t.kernels["launch_start_ns"], t.kernels["start_ns"])
    in_steps = launched >= starts[0]
    kernels = t.kernels[in_steps & (t.kernels["kind"] == "kernel")]
    assert p.steps == 3
    assert p.kernels == pytest.approx(len(kernels) / 3)
    assert p.kernel_time_ns == pytest.approx(kernels["dur_ns"].sum() / 3)


def synthetic_trace(kernels, step_starts, step_end) -> Trace:
    rows = []
    for i, (stream, start, dur, category, gap) in enumerate(kernels):
        rows.append(dict(name=f"k_{category}", category=category, kind="kernel", device=0, stream=stream, start_ns=start, end_ns=start + dur,
                         dur_ns=dur, correlation=i, launch_api="cudaLaunchKernel", launch_start_ns=max(start - gap, 0),
                         launch_end_ns=max(start - gap, 0) + 1, launch_tid=1, range="", range_id=-1, grid="", block=""))
    table = pd.DataFrame(rows, columns=list(KERNEL_COLUMNS))
    for col in ("name", "category", "kind", "launch_api", "range", "grid", "block"):
        table[col] = table[col].astype("category")
    for col in ("device", "stream", "start_ns", "end_ns", "dur_ns", "correlation", "launch_start_ns", "launch_end_ns", "launch_tid", "range_id"):
        table[col] = table[col].astype("int64")
    ends = list(step_starts[1:]) + [step_end]
    steps = pd.DataFrame({"step": range(len(step_starts)), "name": [f"ProfilerStep#{i}" for i in range(len(step_starts))],
                          "start_ns": np.array(step_starts, dtype=np.int64), "end_ns": np.array(ends, dtype=np.int64)})
    empty = pd.DataFrame({c: pd.Series([], dtype="int64") for c in ("start_ns", "end_ns")})
    return Trace(kernels=table, launches=empty, ranges=empty, steps=steps, meta={})


kernel_st = st.tuples(
    st.integers(0, 2),  # stream
    st.integers(0, 50_000),  # start ns
    st.integers(1, 8_000),  # duration ns
    st.sampled_from(CATEGORIES),
    st.integers(0, 20_000),  # launch lead time
)


def trace_st():
    return st.builds(
        lambda ks, cuts: synthetic_trace(ks, sorted(set([0] + cuts)), 60_000),
        st.lists(kernel_st, min_size=1, max_size=40),
        st.lists(st.integers(1, 55_000), max_size=4),
    )


@settings(max_examples=60, deadline=None)
@given(trace_st(), trace_st())
def test_decomposition_closes_exactly_on_random_overlapping_kernels(a, b):
    c = compare_traces(a, b)
    assert abs(c.a.closure_ns()) < 1e-6 and abs(c.b.closure_ns()) < 1e-6
    assert abs(c.closure_ns()) < 1e-6
    # The named terms are the only terms: wall per step is the sum of GPU time, overlap and idle.
    assert c.a.wall_ns == pytest.approx(sum(c.a.category_ns.values()) - c.a.overlap_ns + sum(c.a.idle_ns.values()), abs=1e-6)


def test_launch_bound_verdict_prices_extra_launches_at_one_cpu_speed():
    """Two launch-bound steps: A with 10 kernels, B with 13; B's host ran faster in its run."""
    def launch_bound(n_kernels, gap):
        # each kernel launched `gap` ns after the previous one ended: all idle is host-bound
        kernels, t = [], 1000
        for i in range(n_kernels):
            kernels.append((0, t, 100, "gemm", 0))
            t += 100 + gap
        return synthetic_trace(kernels, [0], t)

    a, b = launch_bound(10, 900), launch_bound(13, 600)
    c = compare_traces(a, b)
    assert both_launch_bound(c)
    assert c.b.kernels - c.a.kernels == 3
    per_launch_a = c.a.wall_ns / 10
    assert f"{3 * per_launch_a / 1e6:.3g} ms of host time per step" in c.verdict
    assert "host speed drifted" in c.verdict


from perflab.analysis.compare import both_launch_bound  # noqa: E402


def naive_union_ns(intervals):
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def test_category_times_and_overlap_match_a_hand_count(loaded):
    """Per-step GPU time by category and the overlap term, recomputed from the KernelTable by hand."""
    t = loaded["train_step.json.gz"]
    p = step_profile(t)
    steps = t.steps.sort_values("start_ns")
    k = t.kernels
    launched = np.where(k["launch_start_ns"] >= 0, k["launch_start_ns"], k["start_ns"])
    by_category = {}
    for i, s in enumerate(steps["start_ns"]):
        e = steps["start_ns"].iloc[i + 1] if i + 1 < len(steps) else np.inf
        acts = k[(launched >= s) & (launched < e)]
        for cat, dur in zip(acts["category"].astype(str), acts["dur_ns"]):
            by_category[cat] = by_category.get(cat, 0) + int(dur)
    assert p.category_ns == pytest.approx({c: v / 3 for c, v in by_category.items()})
    assert p.overlap_ns == pytest.approx(0, abs=1e-9)  # one stream, each step synchronised

    two = loaded["two_streams.json.gz"]  # no step annotations: the whole trace is the window
    q = step_profile(two)
    union = naive_union_ns(zip(two.kernels["start_ns"], two.kernels["end_ns"]))
    assert q.overlap_ns == pytest.approx(two.kernels["dur_ns"].sum() - union)
    assert q.overlap_ns > 0  # the two streams really ran at once


def test_compare_takes_a_batch_size_per_side():
    """perflab compare llama3_8b llama3_8b --batch-size 1 --batch-size 64: A at batch 1, B at 64 (issue 25's decode)."""
    from perflab import api

    a, b = api.compare_items("llama3_8b", "llama3_8b", batch_size=[1, 64], workload=["decode"], context_len=[512],
                             mode=["compile:reduce-overhead"], dtype=["bf16"], device="cpu")
    assert (a.batch_size, b.batch_size) == (1, 64) and a.mode == b.mode == "compile:reduce-overhead" and a.context_len == 512
    from perflab.cli_argv import expand_multi_value_options

    assert expand_multi_value_options(["--batch-size", "1", "64"]) == ["--batch-size", "1", "--batch-size", "64"]


# CPU-only traces (torch.profiler on the CPU, as perflab run and profile record there): operators, not kernels

CPU_ONLY_TRACE = Path(__file__).parent / "data" / "cpu_only.json.gz"


def _cpu_trace_with_a_slower_first_matmul(path: Path, extra_us: float) -> None:
    """The CPU-only trace with its first step's matmul (and mm) ``extra_us`` longer, everything after it later by as much."""
    import gzip
    import json

    data = json.load(gzip.open(CPU_ONLY_TRACE))
    events = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    first_matmul = min(e["ts"] for e in events if e["name"] == "aten::matmul")
    for e in events:
        if e["name"] in ("aten::matmul", "aten::mm") and e["ts"] < first_matmul + 100:
            e["dur"] += extra_us
        elif e["ts"] > first_matmul + 100:
            e["ts"] += extra_us
        elif e.get("cat") == "user_annotation" or e["name"].startswith("PyTorch Profiler"):  # the first step and the window
            e["dur"] += extra_us
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(data, f)


def test_two_cpu_traces_are_compared_in_cpu_terms_and_told_apart_by_their_directories(tmp_path):
    import shutil

    from cli_util import run_cli_here

    (tmp_path / "a").mkdir()
    shutil.copy(CPU_ONLY_TRACE, tmp_path / "a" / "trace.json.gz")
    _cpu_trace_with_a_slower_first_matmul(tmp_path / "b" / "trace.json.gz", 5000.0)  # 5 ms more in one of 2 steps
    done = run_cli_here("compare", "a/trace.json.gz", "b/trace.json.gz", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    # the same two steps, B's first matmul 5 ms longer: 2.5 ms per step more, all of it in operators; two steps a side
    # (one of them 5 ms longer, the other not) cannot tell a difference, and the verdict says so before attributing it
    assert "Verdict: Cannot tell from 2 traced steps a side whether b/trace.json.gz is faster or slower than a/trace.json.gz: " \
           "Δ +2.5 ms a step, 95% CI" in text
    assert "In the traced steps, b/trace.json.gz's step is 2.5 ms longer than a/trace.json.gz's: operator time +2.5 ms (gemm +2.5 ms)" in text
    assert text.endswith("time between operators +0 ms, 0 more operators per step: operator-bound.")
    for gpu_word in ("GPU", "kernel", "img/s", "launch"):
        assert gpu_word not in text, gpu_word
    assert "operator time: gemm" in text and "time between operators" in text


def test_traces_written_by_perflab_run_are_labelled_by_their_programs(tmp_path):
    import json
    import shutil

    from perflab import api

    for side, lr in (("a", "1e-3"), ("b", "3e-4")):
        (tmp_path / side).mkdir()
        shutil.copy(CPU_ONLY_TRACE, tmp_path / side / "trace.json.gz")
        (tmp_path / side / "run.json").write_text(json.dumps({"program": f"train.py --lr {lr}", "steps_from": "optimizer steps",
                                                              "traced": {"trace_path": "elsewhere/trace.json.gz"}}))
    c = api.compare(tmp_path / "a" / "trace.json.gz", tmp_path / "b" / "trace.json.gz")
    assert c.labels == ("train.py --lr 1e-3", "train.py --lr 3e-4")
    # the run.json itself names its side: its trace is the one beside it (the run started elsewhere)
    assert api.compare(tmp_path / "a" / "run.json", tmp_path / "b" / "run.json").labels == ("train.py --lr 1e-3", "train.py --lr 3e-4")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "run.json").write_text(json.dumps({"program": "train.py", "traced": None}))
    with pytest.raises(PerflabError, match="its run traced no step"):
        api.compare(tmp_path / "a" / "run.json", tmp_path / "c" / "run.json")
    (tmp_path / "b" / "run.json").write_text(json.dumps({"program": "train.py --lr 1e-3"}))  # one program twice: their paths
    assert api.compare(tmp_path / "a" / "trace.json.gz", tmp_path / "b" / "trace.json.gz").labels == ("a/trace.json.gz", "b/trace.json.gz")


def test_path_suffixes_are_the_shortest_that_differ(tmp_path):
    from perflab.analysis.compare import path_suffixes

    assert path_suffixes([tmp_path / "x/a/t.json.gz", tmp_path / "y/a/t.json.gz"]) == ["x/a/t.json.gz", "y/a/t.json.gz"]
    assert path_suffixes([tmp_path / "a.json.gz", tmp_path / "b.json.gz"]) == ["a.json.gz", "b.json.gz"]
    assert path_suffixes([tmp_path / "t.json.gz", tmp_path / "t.json.gz"]) == ["t.json.gz (A)", "t.json.gz (B)"]


def test_a_module_new_in_b_is_null_in_the_json_not_nan(loaded):
    # compare --by-module --json: a module only B has (a token-reducing block) has no ratio; strict JSON holds no NaN
    import json

    from perflab.analysis.modules import module_deltas

    t = loaded["eager_vit.json.gz"]
    c = compare_traces(t, t)
    a = pd.DataFrame({"pass": ["forward"], "module": ["blocks.3"], "inclusive_ns": [10_000.0]})
    b = pd.DataFrame({"pass": ["forward", "forward"], "module": ["blocks.3", "blocks.3.topk"], "inclusive_ns": [12_000.0, 4_000.0]})
    c.extra["modules"] = module_deltas(a, b)
    text = json.dumps(c.to_dict(), allow_nan=False)
    assert json.loads(text)["modules"] == [
        {"pass": "forward", "module": "blocks.3.topk", "a_ns": 0.0, "b_ns": 4_000.0, "delta_ns": 4_000.0, "ratio": None},
        {"pass": "forward", "module": "blocks.3", "a_ns": 10_000.0, "b_ns": 12_000.0, "delta_ns": 2_000.0, "ratio": 1.2}]


# Intervals over the traced steps, "cannot tell", and what a trace describes (its run.json)


def steps_trace(gemm_us) -> Trace:
    """One gemm kernel a step, its duration each step's figure (µs), launched 50 ns before it ran; each step 1 µs of
    idle on top."""
    kernels, starts, t = [], [], 0
    for us in gemm_us:
        starts.append(t)
        kernels.append((0, t + 500, int(us * 1000), "gemm", 50))
        t += int(us * 1000) + 1000
    return synthetic_trace(kernels, starts, t)


A_STEPS = [100.0, 104.0, 97.0, 101.0, 99.0, 103.0]


def test_every_delta_has_an_interval_over_the_traced_steps_and_a_difference_within_their_spread_cannot_be_told():
    from perflab.stats import t975, units_needed

    same = compare_traces(steps_trace(A_STEPS), steps_trace([101.0, 98.0, 103.0, 100.0, 102.0, 97.0]))  # one program twice
    wall = same.intervals["wall"]
    a, b = np.array(A_STEPS) * 1000 + 1000, np.array([101.0, 98.0, 103.0, 100.0, 102.0, 97.0]) * 1000 + 1000
    se = np.hypot(a.std(ddof=1) / np.sqrt(6), b.std(ddof=1) / np.sqrt(6))
    assert wall.delta == pytest.approx(b.mean() - a.mean()) and wall.se == pytest.approx(se)
    assert wall.low == pytest.approx(wall.delta - t975(wall.dof) * se) and wall.low < 0 < wall.high
    assert not same.decided and not same.claims_difference
    spread = np.hypot(a.std(ddof=1), b.std(ddof=1))
    assert same.steps_needed == units_needed(spread, wall.delta, most=1000, dof_of=lambda n: 2 * n - 2)
    assert same.verdict.startswith("Cannot tell from 6 traced steps a side whether B is faster or slower than A: Δ")
    assert f"about {same.steps_needed} traced steps a side" in same.verdict and "In the traced steps, B's step is" in same.verdict
    d = same.to_dict()
    assert d["delta_wall_ci_us"] == pytest.approx([wall.low / 1e3, wall.high / 1e3]) and d["decided"] is False
    assert d["delta_by_category_ci_us"]["gemm"] == pytest.approx(d["delta_wall_ci_us"])  # the gemm is all that moved
    # 20% more work in every step: told apart, the interval holding the true 20 µs
    slower = compare_traces(steps_trace(A_STEPS), steps_trace([x * 1.2 + (1 if i % 2 else -1) for i, x in enumerate(A_STEPS)]))
    assert slower.decided and slower.claims_difference and slower.steps_needed is None
    assert slower.intervals["wall"].low < 0.2 * np.mean(A_STEPS) * 1000 < slower.intervals["wall"].high
    assert slower.verdict.startswith("B is 0.0201 ms per step slower than A: GPU time +0.0201 ms (gemm +0.0201 ms)")
    # one traced step a side: no spread, no interval
    one = compare_traces(steps_trace([100.0]), steps_trace([150.0]))
    assert one.intervals["wall"] is None and not one.decided and one.to_dict()["delta_wall_ci_us"] is None
    assert one.verdict.startswith("Cannot tell from 1 traced step a side whether B is faster or slower than A: one step gives no spread")


def write_run(directory: Path, trace: Trace, steps_ms: list[float], inflation: float | None) -> Path:
    """A perflab run's directory as it leaves it: run.json (its untraced timing; trace_inflated where ``inflation``
    passes 1.1) and a trace file beside it (empty: the test hands compare the planted trace in its place)."""
    import json

    from perflab.stats import summarize

    directory.mkdir(parents=True)
    timing = {"steps": len(steps_ms), **summarize(steps_ms).to_dict()}
    flags = [{"flag": "trace_inflated", "message": "..."}] if inflation and inflation > 1.1 else []
    (directory / "run.json").write_text(json.dumps({"program": f"train.py {directory.name}", "timing": timing, "flags": flags,
                                                    "traced": {"inflation": inflation, "inflated": bool(inflation and inflation > 1.1),
                                                               "trace_path": str(directory / "trace.json.gz")}}))
    (directory / "trace.json.gz").write_bytes(b"")
    return directory / "run.json"


def test_an_inflated_trace_is_named_first_and_untraced_timings_give_the_verdict(tmp_path, monkeypatch):
    import json

    from cli_util import run_cli_here
    from perflab import api

    traces = {"a": steps_trace(A_STEPS), "b": steps_trace([x * 1.5 for x in A_STEPS])}  # traced: B 50% longer under the profiler
    import perflab.trace.load as load

    monkeypatch.setattr(load, "load_trace", lambda path: traces[Path(path).parent.name])
    untraced = [0.100, 0.102, 0.099, 0.101, 0.100, 0.098, 0.103, 0.100, 0.101, 0.099] * 2  # the same program, untraced
    a = write_run(tmp_path / "a", traces["a"], untraced, 1.05)
    b = write_run(tmp_path / "b", traces["b"], [x * 1.01 for x in untraced], 3.21)
    c = api.compare(a, b)
    assert c.inflated == [{"side": "train.py b", "inflation": 3.21}]
    assert c.first_line == ("Inflated trace (run.json: trace_inflated): train.py b's traced steps took ×3.21 its untraced ones. The traced Δ "
                            "describes the program under the profiler, not as it runs.")
    assert c.decided and c.untraced.verdict == "no change" and c.untraced.ratio.basis == "within-run" and not c.claims_difference
    assert c.verdict.startswith("From the untraced steps: train.py b ÷ train.py a 1.010× (")
    assert "no change (within ±5.0%) · within-run. In the traced steps, train.py b's step is" in c.verdict
    result = run_cli_here("compare", a, b)
    assert result.returncode == 0 and result.stdout.splitlines()[0].startswith("Inflated trace (run.json: trace_inflated): train.py b's")
    document = json.loads(run_cli_here("compare", a, b, "--json").stdout)
    assert document["inflated"] == c.inflated and document["untraced"]["verdict"] == "no change" and document["claims_difference"] is False
    # without untraced timings, an inflated trace's verdict says what it describes
    (tmp_path / "b" / "run.json").write_text(json.dumps({"program": "train.py b", "flags": [{"flag": "trace_inflated"}],
                                                         "traced": {"inflation": 3.21, "inflated": True, "trace_path": "trace.json.gz"}}))
    assert api.compare(a, b).verdict.startswith("Under the profiler, train.py b is ")


@pytest.mark.parametrize("run", [{"traced": 5, "flags": "trace_inflated", "timing": []}, {"timing": {"median_ms": "1", "ci_ms": [0, 2]}},
                                 {"traced": {"inflated": True, "inflation": "x"}, "timing": {"median_ms": 2.0, "ci_ms": [1.0, float("nan")]}},
                                 {"flags": [3, {"flag": 4}], "timing": {"median_ms": 5.0, "ci_ms": [1.0, 2.0]}}])
def test_a_run_json_of_the_wrong_shape_qualifies_nothing_and_raises_nothing(run):
    from perflab.analysis.compare import qualify
    from perflab.records.run_report import RunReport

    run = RunReport.from_dict(run)  # as run.json is read (records.run_report.load): the fields as written
    c = qualify(compare_traces(steps_trace(A_STEPS), steps_trace(A_STEPS)), runs=(run, run))
    assert c.untraced is None and c.first_line in (None, "Inflated traces (run.json: trace_inflated): A's traced steps ran longer than "
                                                         "its untraced ones; B's traced steps ran longer than its untraced ones. The traced "
                                                         "Δ describes the program under the profiler, not as it runs.")


def test_compare_of_two_runs_shows_their_throughput_and_judges_the_time_a_sample_where_their_batches_differ(tmp_path, monkeypatch):
    """Batch 8 against batch 16, B's step 1.9× A's: per step B is slower, per token (both count tokens) it is faster (0.95×); compare says
    the latter, from the untraced steps, with each run's samples/s and tokens/s beside its step (run.json's loop)."""
    import json

    from cli_util import run_cli_here
    from perflab import api
    import perflab.trace.load as load

    traces = {"a": steps_trace(A_STEPS), "b": steps_trace([x * 1.9 for x in A_STEPS])}
    monkeypatch.setattr(load, "load_trace", lambda path: traces[Path(path).parent.name])
    untraced = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.3, 10.0, 10.1, 9.9] * 2
    paths = {}
    for side, batch, scale in (("a", 8, 1.0), ("b", 16, 1.9)):
        paths[side] = write_run(tmp_path / side, traces[side], [x * scale for x in untraced], 1.05)
        run = json.loads(paths[side].read_text())
        mean = sum(untraced) / len(untraced) * scale
        run["loop"] = {"mean_ms": mean, "median_ms": run["timing"]["median_ms"], "steps_per_s": 1000 / mean,
                       "throughput": {"samples_per_step": batch, "tokens_per_step": batch * 128, "samples_per_s": batch * 1000 / mean,
                                      "tokens_per_s": batch * 128 * 1000 / mean, "source": "the batches the timed steps took"}}
        paths[side].write_text(json.dumps(run))
    c = api.compare(paths["a"], paths["b"])
    assert c.untraced_unit == "token" and [x["samples_per_step"] for x in c.untraced_loop] == [8, 16]
    assert c.untraced.ratio.ratio == pytest.approx(1.9 / 2) and c.untraced.verdict in ("faster", "inconclusive")
    assert "From the untraced steps, the time a token (their tokens a step differ: 1024 and 2048)" in c.verdict
    assert c.items_per_step == (8, 16) and c.throughput_unit == "sample/s"  # the traced table's throughput column, from the batches
    result = run_cli_here("--wide", "compare", paths["a"], paths["b"])
    assert result.returncode == 0, result.stderr
    assert "The untraced steps (run.json)" in result.stdout and "samples/s" in result.stdout and "tokens/s" in result.stdout
    assert f"{8 * 1000 / (sum(untraced) / len(untraced)):,.4g}" in result.stdout  # A's samples/s, beside its step
    document = json.loads(run_cli_here("compare", paths["a"], paths["b"], "--json").stdout)
    assert document["untraced_unit"] == "token" and document["untraced_loop"][1]["samples_per_s"] == pytest.approx(16 * 1000 / (sum(untraced) / len(untraced) * 1.9))
