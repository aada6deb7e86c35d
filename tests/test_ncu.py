"""Reading Nsight Compute CSVs (real ones from an H200) and the ncu command perflab builds."""

from pathlib import Path

import pytest

from perflab.errors import PerflabError
from perflab.trace.ncu import METRICS, OPTIONAL_METRICS, function_name, kernel_filter, kernel_library, ncu_command, ncu_summary, parse_ncu_csv, roofline_class

DATA = Path(__file__).parent / "data"


def test_parses_the_matmul_sample_with_prof_lines_units_row_and_thousands_separators():
    df = parse_ncu_csv((DATA / "ncu_matmul_h200.csv").read_text())
    assert len(df) == 4
    gemm = df[df["kernel_name"].str.contains("sgemm")].iloc[0]
    assert gemm["duration_ns"] == 343840  # "343,840" in the file
    assert gemm["sm_throughput_pct"] == 84.59
    assert gemm["memory_throughput_pct"] == 46.10
    assert gemm["dram_throughput_pct"] == 1.11
    assert gemm["achieved_occupancy_pct"] == 12.50
    assert gemm["l1_hit_rate_pct"] == 0.63
    assert gemm["l2_hit_rate_pct"] == 93.47
    assert gemm["roofline"] == "compute-bound"
    assert df[df["kernel_name"].str.contains("vectorized_elementwise")].iloc[0]["roofline"] == "latency-bound"
    assert not df[list(METRICS)].isna().any().any()


def test_a_csv_without_one_of_our_metrics_names_it():
    # The seed-style sample was made with another metric list: no gpu__compute_memory_throughput.
    with pytest.raises(PerflabError, match="gpu__compute_memory_throughput"):
        parse_ncu_csv((DATA / "ncu_raw_h200.csv").read_text())


def test_program_output_around_the_table_is_ignored():
    text = "hello from the program\n" + (DATA / "ncu_matmul_h200.csv").read_text() + "\nbye\n"
    assert len(parse_ncu_csv(text)) == 4


def test_no_table_is_a_clear_error():
    with pytest.raises(PerflabError, match="no ncu CSV table"):
        parse_ncu_csv("==PROF== Connected to process 1\n==PROF== Disconnected from process 1\n")


@pytest.mark.parametrize(
    "name,expected",
    [
        ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#1}>(int, float)", "vectorized_elementwise_kernel"),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"),
        ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false, false>(float*, float const*, int, int, int)", "softmax_warp_forward"),
        ("void at::<unnamed>::cunn_SoftMaxForwardReg<c10::BFloat16, float, c10::BFloat16, at::<unnamed>::SoftMaxForwardEpilogue>(c10::BFloat16*, int)", "cunn_SoftMaxForwardReg"),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)", "Kernel2"),
        ("triton_poi_fused_add_gelu_0", "triton_poi_fused_add_gelu_0"),
    ],
)
def test_function_names_as_ncu_matches_them(name, expected):
    assert function_name(name) == expected


def test_command_filters_by_nvtx_range_and_kernel_functions_with_clocks_untouched():
    cmd = ncu_command("ncu", "{}", ["void at::native::vectorized_elementwise_kernel<4>(int)", "nvjet_x"], launch_count=50)
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--nvtx-include") + 1] == "perflab_ncu/"
    assert cmd[cmd.index("-k") + 1] == kernel_filter(["nvjet_x", "vectorized_elementwise_kernel"]) == "regex:^(nvjet_x|vectorized_elementwise_kernel)$"
    assert set(cmd[cmd.index("--metrics") + 1].split(",")) == set(METRICS.values()) | set(OPTIONAL_METRICS.values())


@pytest.mark.parametrize("sm,mem,cls", [(90, 40, "compute-bound"), (30, 85, "memory-bound"), (70, 80, "memory-bound"), (20, 30, "latency-bound")])
def test_roofline_class(sm, mem, cls):
    assert roofline_class(sm, mem) == cls



def test_launches_take_trace_names_by_order_when_functions_agree():
    import pandas as pd

    from perflab.trace.ncu import attach_trace_names, join_counters

    launches = parse_ncu_csv((DATA / "ncu_matmul_h200.csv").read_text())
    # The trace's names for the same step, Kineto's spelling, with a kernel ncu filtered out between them.
    trace_step = [
        "void at::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4>(long)",
        "void at::native::reduce_kernel<512, 1>(int)",  # not in the filter: skipped
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(Params)",
        "void at::vectorized_elementwise_kernel<4, clamp>(int)",
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(Params)",
    ]
    named = attach_trace_names(launches, trace_step)
    assert set(named["matched_by"]) == {"launch order"}
    assert named["full_name"].tolist() == [trace_step[0], trace_step[2], trace_step[3], trace_step[4]]
    kernels = pd.DataFrame({"name": ["gemm", "rand", "absent"], "full_name": [trace_step[2], trace_step[0], "never_profiled"]})
    joined = join_counters(kernels, named)
    assert joined.loc[0, "launches"] == 2
    assert joined.loc[0, "duration_ns"] == (343840 + 343616) / 2
    assert joined.loc[0, "roofline"] == "compute-bound"
    assert joined.loc[1, "duration_ns"] == 13568
    assert pd.isna(joined.loc[2, "duration_ns"])


def test_order_mismatch_falls_back_to_names():
    from perflab.trace.ncu import attach_trace_names

    launches = parse_ncu_csv((DATA / "ncu_matmul_h200.csv").read_text())
    named = attach_trace_names(launches, ["void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)"])
    assert set(named["matched_by"]) == {"name"}
    assert named["full_name"].notna().sum() == 2  # the two sgemm launches match by their exact name


def test_the_dram_bytes_metric_is_optional_and_requested():
    df = parse_ncu_csv((DATA / "ncu_matmul_h200.csv").read_text())  # made before perflab asked for dram__bytes
    assert df["dram_bytes"].isna().all()
    assert "dram__bytes.sum" in ncu_command("ncu", "{}", ["k"], 10)[ncu_command("ncu", "{}", ["k"], 10).index("--metrics") + 1]


@pytest.mark.parametrize("name, library", [
    ("triton_per_fused__to_copy_mul_0", "Triton"),
    ("triton_tem_fused_mm_3", "Triton"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false, false>(cublasGemvParamsEx<int>)", "cuBLAS"),
    ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", "cuBLAS"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "cuBLAS"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "cuDNN"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>(Flash_fwd_params)", "FlashAttention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, float, float)", "PyTorch"),
])
def test_kernel_library_from_the_name(name, library):
    assert kernel_library(name) == library


def test_ncu_summary_gives_achieved_bandwidth_from_dram_bytes_over_duration():
    import pandas as pd

    table = pd.DataFrame({
        "name": ["gemv2T_kernel_val", "triton_tem_fused_mm_3"], "full_name": ["void gemv2T_kernel_val<...>(cublasGemvParamsEx<int>)", "triton_tem_fused_mm_3"],
        "share": [0.6, 0.3], "duration_ns": [20_000.0, 10_000.0], "dram_throughput_pct": [91.5, float("nan")],
        "dram_bytes": [57_000_000.0, float("nan")], "sm_throughput_pct": [20.0, 30.0], "roofline": ["memory-bound", float("nan")],
    })
    gemv, triton = ncu_summary(table)["kernels"]
    assert gemv["library"] == "cuBLAS" and triton["library"] == "Triton"
    assert gemv["dram_gbps"] == pytest.approx(2850.0)  # 57 MB in 20 µs
    assert gemv["duration_us"] == 20.0 and gemv["dram_pct"] == 91.5 and gemv["time_share"] == 0.6
    assert triton["dram_gbps"] is None and triton["dram_pct"] is None and triton["roofline"] is None


def test_the_command_samples_each_launch_configuration_or_every_launch():
    sampled = ncu_command("ncu", "{}", ["nvjet_x"], launch_count=500, per_config=2)
    assert sampled[sampled.index("--filter-mode") + 1] == "per-launch-config" and sampled[sampled.index("--launch-count") + 1] == "2"
    every = ncu_command("ncu", "{}", ["nvjet_x"], launch_count=500, per_config=0)
    assert "--filter-mode" not in every and every[every.index("--launch-count") + 1] == "500"


def _launch(i, name, grid, block, dram, duration):
    return {"id": i, "kernel_name": name, "function": function_name(name), "grid": grid, "block": block, "stream": "7",
            **{c: float("nan") for c in METRICS}, "dram_throughput_pct": dram, "duration_ns": duration,
            "sm_throughput_pct": 10.0, "memory_throughput_pct": 80.0, "dram_bytes": float("nan")}


def test_a_sampled_launch_stands_for_the_steps_launches_of_its_configuration():
    """Per-config sampling weighed by the step's launch counts gives the means a pass over every launch gives, where
    a configuration's launches read alike; ground truth: the every-launch list, expanded and averaged by hand."""
    import pandas as pd

    from perflab.trace.ncu import attach_step_configs, join_counters

    gemv = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"
    mul = "void at::native::elementwise_kernel<128, 2, MulFunctor<float>>(int)"
    add = "void at::native::elementwise_kernel<128, 2, AddFunctor<float>>(int)"  # same function, grid and block as mul
    configs = {  # (name, grid, block): (launches in the step, DRAM %, duration ns)
        (gemv, "(132, 1, 1)", "(128, 1, 1)"): (96, 80.0, 40_000),
        (gemv, "(64, 1, 1)", "(128, 1, 1)"): (32, 60.0, 90_000),
        (mul, "(8, 1, 1)", "(128, 1, 1)"): (65, 1.0, 2_000),
        (add, "(8, 1, 1)", "(128, 1, 1)"): (64, 3.0, 2_500),
    }
    step = pd.DataFrame([{"name": n, "grid": g, "block": b} for (n, g, b), (count, _, _) in configs.items() for _ in range(count)]
                        + [{"name": "void other_kernel(int)", "grid": "(1, 1, 1)", "block": "(32, 1, 1)"}])
    # ncu's rows: two launches of each configuration (one of mul's), in ncu's demangling, and one configuration the
    # step never launched (a launch of warm-up code inside the range, say), which must not count
    rows, i = [], 0
    for (name, grid, block), (_, dram, duration) in configs.items():
        for _ in range(1 if name == mul else 2):
            rows.append(_launch(i, name.replace("<128, 2, ", "<128,2,"), grid, block, dram, duration))
            i += 1
    rows.append(_launch(i, gemv, "(999, 1, 1)", "(128, 1, 1)", 5.0, 1_000))
    named = attach_step_configs(pd.DataFrame(rows), step)
    assert set(named["matched_by"]) == {"launch config"}
    assert named["full_name"].tolist()[:-1] == [gemv] * 4 + [mul] + [add] * 2 and pd.isna(named["full_name"].iloc[-1])
    assert named["weight"].tolist() == [48, 48, 16, 16, 65, 32, 32, 0]
    kernels = pd.DataFrame({"name": ["gemv", "mul", "add"], "full_name": [gemv, mul, add]})
    joined = join_counters(kernels, named).set_index("name")
    every_gemv = [80.0] * 96 + [60.0] * 32
    assert joined.loc["gemv", "dram_throughput_pct"] == pytest.approx(sum(every_gemv) / len(every_gemv))  # 75.0, not 70.0
    assert joined.loc["gemv", "duration_ns"] == pytest.approx((96 * 40_000 + 32 * 90_000) / 128)
    assert (joined.loc["gemv", "launches"], joined.loc["gemv", "profiled"]) == (128, 4)
    assert (joined.loc["mul", "launches"], joined.loc["add", "launches"]) == (65, 64)
    assert joined.loc["mul", "dram_throughput_pct"] == 1.0 and joined.loc["add", "dram_throughput_pct"] == 3.0


def test_every_launch_mode_still_counts_each_launch_once():
    from perflab.trace.ncu import attach_trace_names, join_counters
    import pandas as pd

    launches = parse_ncu_csv((DATA / "ncu_matmul_h200.csv").read_text())
    named = attach_trace_names(launches, ["void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)"])
    joined = join_counters(pd.DataFrame({"name": ["g"], "full_name": [named["full_name"].dropna().iloc[0]]}), named)
    assert (joined.loc[0, "launches"], joined.loc[0, "profiled"]) == (2, 2)


def test_sampled_launches_without_a_launch_configuration_fall_back_to_names():
    import pandas as pd

    from perflab.trace.ncu import attach_step_configs

    launches = parse_ncu_csv((DATA / "ncu_matmul_h200.csv").read_text()).assign(grid="", block="")
    sgemm = "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)"
    named = attach_step_configs(launches, pd.DataFrame({"name": [sgemm] * 3, "grid": ["(128, 1, 1)"] * 3, "block": ["(256, 1, 1)"] * 3}))
    assert set(named["matched_by"]) == {"name"} and named["full_name"].notna().sum() == 2 and "weight" not in named.columns
