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

    a, b = api.compare_items("llama3_8b", "llama3_8b", per_side={"batch_size": [1, 64], "workload": ["decode"], "context_len": [512],
                                                                    "mode": ["compile:reduce-overhead"], "dtype": ["bf16"]}, device="cpu")
    assert (a.batch_size, b.batch_size) == (1, 64) and a.mode == b.mode == "compile:reduce-overhead" and a.context_len == 512
    from perflab.cli import expand_multi_value_options

    assert expand_multi_value_options(["--batch-size", "1", "64"]) == ["--batch-size", "1", "--batch-size", "64"]
