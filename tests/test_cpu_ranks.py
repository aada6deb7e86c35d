"""A CPU rank's trace (gloo) read as the per-rank accounting reads a GPU rank's kernels: exact ns, the main thread's
operators as compute, gloo's ranges as communication, closing to the ns on a synthetic two-rank trace and on two real
gloo ranks; read by the one Kineto reader (the tables it gave with its own json.load, pinned)."""

import hashlib
import json
from pathlib import Path

import pytest

from perflab.analysis.ranks import account_ranks, collective_waits, merge_ranks
from perflab.trace.cpu_ranks import cpu_rank_activities


def _trace(path, events):
    path.write_text(json.dumps({"traceEvents": events}).replace('"TS', "").replace('TS"', ""))  # ts as JSON numbers with 3 decimals
    return path


def _op(name, ts, dur, tid=100, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": f"TS{ts}TS", "dur": f"TS{dur}TS"}


def test_cpu_rank_activities_and_their_accounting(tmp_path):
    # rank 0: its main thread (tid 100) computes 0-10 us and 15-20 us (a nested op inside), gloo's thread all-reduces 8-14 us;
    # a cpu_op on another thread is not the main thread's compute
    r0 = _trace(tmp_path / "rank0.json", [
        _op("forward", "1000000.000", "20.000", cat="user_annotation"), _op("aten::mm", "1000000.000", "10.000"),
        _op("aten::add", "1000002.000", "1.000"), _op("aten::mul", "1000015.000", "5.000"),
        _op("gloo:all_reduce", "1000008.0005", "6.000", tid=7, cat="user_annotation"), _op("aten::copy_", "1000000.000", "30.000", tid=8),
        _op("c10d::allreduce_", "1000009.000", "0.500"),
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 100}])
    # rank 1: computes 0-12 us, its all-reduce 12-14 us (it arrived last: rank 0 waited 12 - 8.0005 us for it)
    r1 = _trace(tmp_path / "rank1.json", [_op("aten::mm", "1000000.000", "12.000", tid=200), _op("aten::mm", "1000014.000", "6.000", tid=200),
                                          _op("gloo:all_reduce", "1000012.000", "2.000", tid=9, cat="user_annotation")])
    t0, passes = cpu_rank_activities(r0)
    assert list(t0["name"]) == ["aten::mm", "aten::add", "gloo:all_reduce", "c10d::allreduce_", "aten::mul"]
    assert list(t0["comm"]) == [False, False, True, False, False]
    # 1000008.0005 us has 4 decimals: 1000008000.5 ns, rounded half to even
    assert t0.loc[t0["comm"], "start_ns"].item() == 1000008000 and t0.loc[t0["comm"], "end_ns"].item() == 1000014000
    assert passes.to_dict("records") == [{"name": "forward", "start_ns": 1000000000, "end_ns": 1000020000}]
    t1, _ = cpu_rank_activities(r1)
    merged = merge_ranks({0: t0, 1: t1})
    a0, a1 = account_ranks(merged)  # the common window: 1000000000 to 1000020000 ns
    # rank 0: compute 0-10, 15-20 (and 9-9.5 inside); gloo 8-14: overlapped 8-10, exposed 10-14; idle 14-15
    assert (a0.compute_only_ns, a0.comm_overlapped_ns, a0.comm_exposed_ns, a0.idle_ns, a0.window_ns) == (13000, 2000, 4000, 1000, 20000)
    # rank 1: compute 0-12, 14-20; gloo 12-14, all exposed
    assert (a1.compute_only_ns, a1.comm_overlapped_ns, a1.comm_exposed_ns, a1.idle_ns) == (18000, 0, 2000, 0)
    (wait,) = collective_waits(merged)
    assert wait.last_rank == 1 and wait.waits_ns == {0: 4000, 1: 0}


DATA = Path(__file__).parent / "data"
# cpu_rank_activities on committed traces, as the function read them with its own json.load (captured before it read
# load_kineto's Trace): rows, collectives, pass ranges, the rows' summed ns, and a digest of both tables' every value
AS_READ_BEFORE = {
    "ranks_cpu/ddp_gloo_rank0.json.gz": (2522, 6, 6, 28123978, "4f891f5eeb978c44"),
    "ranks_cpu/ddp_gloo_rank1.json.gz": (2522, 6, 6, 29842405, "947c9e0582daa078"),
    "cpu_only.json.gz": (22, 0, 0, 63151505, "a9ab007defcb75e1"),
    "traces/train_step.json.gz": (213, 0, 0, 2374528, "a1cd1f266aa2d9f3"),
    "traces/by_module_lm_forward.json.gz": (6954, 0, 3, 165843641, "511249ccf6514fe9"),
    "run/nanogpt_ddp_rank0_h100.json.gz": (3591, 0, 0, 156287168, "d4c70b744842386e"),
}


@pytest.mark.parametrize("name", sorted(AS_READ_BEFORE))
def test_committed_traces_give_the_activities_they_gave_before(name):
    table, passes = cpu_rank_activities(DATA / name)
    digest = hashlib.sha256((table.to_csv(index=False) + "|" + passes.to_csv(index=False)).encode()).hexdigest()[:16]
    assert (len(table), int(table["comm"].sum()), len(passes), int((table["end_ns"] - table["start_ns"]).sum()), digest) == AS_READ_BEFORE[name]


def test_two_real_gloo_ranks_account_to_the_ns():
    # perflab profile --parallel ddp:bucket_cap_mb=0.1 --world-size 2 --device cpu of a 1-layer GPT, 2 profiled steps
    tables = {rank: cpu_rank_activities(DATA / "ranks_cpu" / f"ddp_gloo_rank{rank}.json.gz")[0] for rank in (0, 1)}
    passes = cpu_rank_activities(DATA / "ranks_cpu" / "ddp_gloo_rank0.json.gz")[1]
    assert list(passes["name"]) == ["forward", "backward", "optimizer"] * 2
    assert list(tables[0].loc[tables[0]["comm"], "name"]) == ["gloo:broadcast", "gloo:all_reduce", "gloo:all_reduce"] * 2  # DDP: buffers, then 2 buckets
    for account in account_ranks(merge_ranks(tables)):
        assert account.comm_ns > 0
        assert account.compute_only_ns + account.comm_overlapped_ns + account.comm_exposed_ns + account.idle_ns == account.window_ns


def test_a_truncated_or_gzipped_but_misnamed_rank_trace_is_read_as_every_trace_is(tmp_path):
    import gzip

    from perflab.errors import PerflabError

    text = gzip.decompress((DATA / "ranks_cpu" / "ddp_gloo_rank0.json.gz").read_bytes())
    misnamed = tmp_path / "rank0.json"  # gzip behind a .json name: told by its content
    misnamed.write_bytes(gzip.compress(text))
    assert len(cpu_rank_activities(misnamed)[0]) == AS_READ_BEFORE["ranks_cpu/ddp_gloo_rank0.json.gz"][0]
    truncated = tmp_path / "rank1.json"
    truncated.write_bytes(text[: len(text) // 2])
    with pytest.raises(PerflabError, match=r"rank1\.json: invalid JSON.*truncated"):
        cpu_rank_activities(truncated)
