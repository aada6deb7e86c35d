"""FSDP on two gloo ranks (one launch): sharded parameters per rank, its communication bytes, the row's timing."""

import pytest

from perflab.spec import Case


def test_fsdp_two_ranks():
    from perflab.measure.parallel import run_parallel_case

    case = Case(model="gpt_small", workload="train_step", seq_len=16, batch_size=2, device="cpu", layers=1, warmup=1, iters=4, repeats=2,
                model_args=(("d_ff", 128), ("d_model", 64), ("n_heads", 2), ("vocab_size", 256)), parallel="fsdp:reshard=false", world_size=2)
    row = run_parallel_case(case, single=False)
    assert row["status"] == "ok", row.get("detail")
    assert row["parallel_mode"] == "fsdp" and row["parallel_options"] == {"reshard": False}
    assert row["median_ms"] == max(row["rank_median_ms"]) and "single_gpu_ms" not in row
    assert row["ranks_agree"] is None  # one copy of each shard: nothing to compare
    # every dimension is even, so the two ranks' shards are exact halves of the parameters
    assert sum(m["params_mb"] for m in row["rank_memory"]) * 2**20 == row["param_bytes"] == 4 * row["params"]
    # no reshard: one all-gather of the parameters and one reduce-scatter of the gradients, each (N-1)/N = 1/2 of their bytes
    assert row["comm_bus_bytes"] == (row["param_bytes"] + row["grad_bytes"]) // 2
    assert all(loss > 0 for loss in row["rank_loss"]) and row["rank_loss"][0] != row["rank_loss"][1]
