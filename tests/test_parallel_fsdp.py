"""FSDP on two gloo ranks (one launch): sharded parameters per rank, its communication bytes, the row's timing. The launch
is the FSDP fix of the CPU `perflab explain --parallel` run (conftest's ``explain_ddp_run``: the same
``measure.parallel.run_parallel_case``, then the DDP base timed again in it), so the suite starts its processes once."""


def test_fsdp_two_ranks(explain_ddp_run):
    data = explain_ddp_run[0]
    (fix,) = data["fix_predictions"]
    row = fix["row"]
    assert row["status"] == "ok", row.get("detail")
    assert row["case"]["parallel"] == "fsdp:reshard=false" and row["case"]["world_size"] == 2 and row["case"]["device"] == "cpu"
    assert row["parallel_mode"] == "fsdp" and row["parallel_options"] == {"reshard": False}
    assert row["median_ms"] == max(row["rank_median_ms"]) and "single_gpu_ms" not in row
    assert row["ranks_agree"] is None  # one copy of each shard: nothing to compare
    # every dimension is even, so the two ranks' shards are exact halves of the parameters
    assert sum(m["params_mb"] for m in row["rank_memory"]) * 2**20 == row["param_bytes"] == 4 * row["params"]
    # no reshard: one all-gather of the parameters and one reduce-scatter of the gradients, each (N-1)/N = 1/2 of their bytes
    assert row["comm_bus_bytes"] == (row["param_bytes"] + row["grad_bytes"]) // 2
    assert row["comm_calls"] == 2 * 2  # per unit (the block, the root) one all-gather and one reduce-scatter
    assert all(loss > 0 for loss in row["rank_loss"]) and row["rank_loss"][0] != row["rank_loss"][1]
