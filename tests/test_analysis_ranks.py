import pandas as pd
import pytest

from perflab.analysis.comm import busbw_all_reduce, ddp_bytes, fsdp_bytes
from perflab.analysis.ranks import account_rank, account_ranks, collective_waits, exposed_waiting_ns, is_comm, merge_ranks, wait_summary


def _t(rows):
    return pd.DataFrame(rows, columns=["name", "start_ns", "end_ns"])


# rank 0: compute 1000..5000 and 6000..7000; all-reduce 4000..6500 (1000 ns hidden, 1000+500 exposed... see below)
RANK0 = _t([
    ("ampere_sgemm_128x64_nn", 1000, 3000),
    ("elementwise_kernel", 3000, 5000),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 4000, 6500),
    ("vectorized_elementwise_kernel", 6000, 7000),
])
# rank 1 arrives at the collective 700 ns later than rank 0
RANK1 = _t([
    ("ampere_sgemm_128x64_nn", 1100, 4600),
    ("ncclKernel_AllReduce_RING_LL_Sum_float", 4700, 6500),
    ("vectorized_elementwise_kernel", 6600, 7500),
])


def test_comm_names():
    assert is_comm("ncclDevKernel_AllReduce_Sum_bf16_RING_LL")
    assert is_comm("ncclKernel_ReduceScatter_RING_LL_Sum_float")
    assert is_comm("ncclDevKernel_AllGather_RING_LL")
    assert not is_comm("ampere_sgemm_128x64_nn")
    assert not is_comm("reduce_kernel")


def test_merge_and_exact_accounting():
    merged = merge_ranks({1: RANK1, 0: RANK0})
    assert list(merged["rank"].value_counts().sort_index()) == [4, 3]
    assert merged["comm"].sum() == 2
    a0, a1 = account_ranks(merged)  # common window 1000..7500
    assert a0.window_ns == a1.window_ns == 6500
    # rank 0: compute 1000..5000 ∪ 6000..7000 = 5000; comm 4000..6500 = 2500; both 4000..5000 + 6000..6500 = 1500
    assert (a0.compute_only_ns, a0.comm_overlapped_ns, a0.comm_exposed_ns, a0.idle_ns) == (3500, 1500, 1000, 500)
    assert a0.busy_ns == 6000 and a0.comm_ns == 2500 and a0.overlap_fraction == pytest.approx(0.6)
    # rank 1: compute 1100..4600 ∪ 6600..7500 = 4400; comm 4700..6500 = 1800, none hidden; idle 100+100+100
    assert (a1.compute_only_ns, a1.comm_overlapped_ns, a1.comm_exposed_ns, a1.idle_ns) == (4400, 0, 1800, 300)
    assert a1.overlap_fraction == 0.0
    for a in (a0, a1):
        assert a.compute_only_ns + a.comm_overlapped_ns + a.comm_exposed_ns + a.idle_ns == a.window_ns


def test_window_clips_and_no_comm():
    a = account_rank(RANK0, window=(2000, 4500))
    assert (a.compute_only_ns, a.comm_overlapped_ns, a.comm_exposed_ns, a.idle_ns) == (2000, 500, 0, 0)
    b = account_rank(RANK0.iloc[[0]])
    assert b.comm_ns == 0 and b.overlap_fraction is None and b.idle_ns == 0


def test_who_waits_for_whom():
    merged = merge_ranks({0: RANK0, 1: RANK1})
    (w,) = collective_waits(merged)
    assert w.last_rank == 1 and w.waits_ns == {0: 700, 1: 0}
    assert wait_summary([w]) == {"last_to_arrive": {1: 1}, "waited_ns": {0: 700, 1: 0}}
    with pytest.raises(ValueError, match="different numbers of collectives"):
        collective_waits(merge_ranks({0: RANK0, 1: RANK1.iloc[[0]]}))


def test_exposed_communication_splits_into_waiting_for_a_peer_and_transfer():
    # the fixture: rank 0 waits 4000..4700 for rank 1, under its own elementwise kernel (to 5000): none of it exposed
    merged = merge_ranks({0: RANK0, 1: RANK1})
    assert exposed_waiting_ns(merged, collective_waits(merged)) == {0: 0, 1: 0}
    # rank 0 arrives at 3600 with nothing left to compute, rank 1 at 5000 (its GEMM runs to 4900); both finish at 6000,
    # then a second all-reduce where rank 1 waits 200 ns for rank 0, half of it under a kernel of its own
    r0 = _t([("ampere_sgemm_128x64_nn", 1000, 3500), ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 3600, 6000),
             ("elementwise_kernel", 6000, 6800), ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 7000, 7500)])
    r1 = _t([("ampere_sgemm_128x64_nn", 1000, 4900), ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 5000, 6000),
             ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 6800, 7500), ("elementwise_kernel", 6700, 6900)])
    merged = merge_ranks({0: r0, 1: r1})
    waits = collective_waits(merged)
    assert [w.waits_ns for w in waits] == [{0: 1400, 1: 0}, {0: 0, 1: 200}]
    waiting = exposed_waiting_ns(merged, waits)
    # rank 0: 3600..5000 spinning, no compute: 1400; rank 1: 6800..7000 spinning, 6800..6900 under its elementwise: 100
    assert waiting == {0: 1400, 1: 100}
    a0, a1 = account_ranks(merged)
    # rank 0 exposed: 3600..6000 (2400) + 7000..7500 (500) = 2900 = 1400 waiting + 1500 transfer
    assert a0.comm_exposed_ns == 2900 and a0.comm_exposed_ns - waiting[0] == 1500
    # rank 1 exposed: 5000..6000 + 6900..7500 = 1600 = 100 waiting + 1500 transfer (the same transfer as rank 0's)
    assert a1.comm_exposed_ns == 1600 and a1.comm_exposed_ns - waiting[1] == 1500


def test_ddp_bytes_hand_arithmetic():
    # 100 MiB of gradients, 2 ranks: ring all-reduce moves 2(2-1)/2 x 100 MiB = 100 MiB per rank
    c = ddp_bytes(100 * 2**20, 2)
    assert c.bus_bytes == 104857600
    assert c.calls == 4  # 25 MiB buckets, the first too (perflab always passes bucket_cap_mb, so torch drops its 1 MiB first bucket)
    assert ddp_bytes(100 * 2**20, 2, first_bucket_mb=1).calls == 1 + 4  # torch's default without bucket_cap_mb: 1 MiB, then 99 in 25s
    # 4 ranks: 2 x 3/4 x 100 MiB = 150 MiB
    assert ddp_bytes(100 * 2**20, 4).bus_bytes == 157286400
    assert ddp_bytes(100 * 2**20, 2, bucket_cap_mb=100).calls == 1
    assert ddp_bytes(100 * 2**20, 2, buckets=[60 * 2**20, 40 * 2**20]).calls == 2
    # floor at 100 GB/s busbw: 104857600 B / 1e11 B/s = 1.048576 ms
    assert c.floor_ms(100.0) == pytest.approx(1.048576)


def test_ddp_buckets_as_torch_rebuilds_them():
    from perflab.analysis.comm import ddp_buckets

    # the 1-layer d_model 64 GPT of the CPU tests, its fp32 gradients in the order DDP saw them ready (output, norm, w2, w3, w1,
    # ffn_norm, wo, wqkv, attention_norm, embeddings): at a 0.1 MiB cap torch's DDP rebuilt two buckets, 131328 and 164352 B
    ready = [65536, 256, 32768, 32768, 32768, 256, 16384, 49152, 256, 65536]
    assert ddp_buckets(ready, int(0.1 * 2**20)) == [131328, 164352]
    assert ddp_buckets(ready, 25 * 2**20) == [295680]  # one bucket under the cap
    # at 40000 B a bucket closes on the gradient that takes it to 40000 or more: the embeddings' 65536 alone, ...
    assert ddp_buckets(ready, 40000) == [65536, 256 + 32768 + 32768, 32768 + 256 + 16384, 49152, 256 + 65536]
    assert ddp_buckets(ready, 40000, first_cap_bytes=65792) == [65536 + 256, 32768 + 32768, 32768 + 256 + 16384, 49152, 256 + 65536]


def test_call_latency_and_comm_time():
    from perflab.analysis.comm import all_reduce_bus_bytes, call_latency_us, comm_ms

    # 1 MiB in 20 us, 4 MiB in 35 us: 15 us per 3 MiB, so 5 us per MiB, and 20 - 5 = 15 us at 0 bytes
    sweep = {"sizes": [{"bytes": 4 * 2**20, "time_us": 35.0}, {"bytes": 2**20, "time_us": 20.0}, {"bytes": 2**30, "time_us": 5000.0}]}
    assert call_latency_us(sweep) == pytest.approx(15.0)
    assert call_latency_us({"sizes": [{"bytes": 1, "time_us": 9.0}, {"bytes": 2, "time_us": 8.0}]}) == 8.0  # never above either time
    assert call_latency_us({"sizes": [{"bytes": 1, "time_us": 1.0}, {"bytes": 2, "time_us": 5.0}]}) == 0.0  # nor below 0
    # 100 MB of bus bytes at 100 GB/s = 1 ms, plus 4 calls x 15 us = 0.06 ms
    assert comm_ms(100e6, 4, 100.0, 15.0) == pytest.approx(1.06)
    assert all_reduce_bus_bytes(1000, 4) == 1500 and all_reduce_bus_bytes(1001, 3) == 1335  # 2 x 2/3 x 1001 = 1334.67, ceil


def test_fsdp_bytes_hand_arithmetic():
    p = g = 1000 * 2**20
    c = fsdp_bytes(p, g, 2)  # all-gather fwd + bwd + reduce-scatter, each (N-1)/N x S = S/2
    assert c.bus_bytes == 3 * 500 * 2**20 and c.collectives == {"all_gather": 2 * p, "reduce_scatter": g}
    assert fsdp_bytes(p, g, 2, reshard_after_forward=False).bus_bytes == 2 * 500 * 2**20
    assert fsdp_bytes(p, g, 8).bus_bytes == 3 * 7 * 125 * 2**20
    # FSDP moves 1.5x DDP's bytes at 2 ranks (3 x S/2 against 2 x S/2)
    assert c.bus_bytes == 3 * ddp_bytes(g, 2).bus_bytes // 2


def test_busbw_definition():
    algbw, busbw = busbw_all_reduce(2**30, 0.01, 2)
    assert algbw == pytest.approx(107.3741824) and busbw == pytest.approx(algbw)
    assert busbw_all_reduce(2**30, 0.01, 8)[1] == pytest.approx(107.3741824 * 14 / 8)
    with pytest.raises(ValueError):
        ddp_bytes(10, 1)


def test_waits_per_step():
    from perflab.analysis.ranks import waits_per_step

    # two steps of one collective each: rank 1 late in step 0 (by 700 ns), rank 0 late in step 1 (by 300 ns)
    r0 = _t([("ncclDevKernel_AllReduce", 100, 200), ("ncclDevKernel_AllReduce", 1300, 1400)])
    r1 = _t([("ncclDevKernel_AllReduce", 800, 900), ("ncclDevKernel_AllReduce", 1000, 1400)])
    steps = waits_per_step(collective_waits(merge_ranks({0: r0, 1: r1})), 2)
    assert steps == [{"step": 0, "collectives": 1, "waited_for": 1, "waited_ns": {0: 700, 1: 0}},
                     {"step": 1, "collectives": 1, "waited_for": 0, "waited_ns": {0: 0, 1: 300}}]
    with pytest.raises(ValueError):
        waits_per_step(collective_waits(merge_ranks({0: r0, 1: r1})), 3)
