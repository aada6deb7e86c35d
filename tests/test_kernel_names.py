"""The short kernel-name rule (perflab.analysis.names) on the kernel names of the committed real traces."""

from __future__ import annotations

import pytest
from reference_trace import KINETO_TRACES, NSYS_FIXTURE

from perflab.analysis.names import MAX_SHORT_NAME, short_kernel_name, short_names
from perflab.trace import load_trace

TRACE_IDS = [p.name.split(".")[0] for p in KINETO_TRACES]


def _kernel_names(path) -> list[str]:
    kernels = load_trace(path).kernels
    return sorted({str(n) for n in kernels.loc[kernels["kind"] == "kernel", "name"]})


@pytest.mark.parametrize("path", KINETO_TRACES + [NSYS_FIXTURE], ids=TRACE_IDS + ["nsys_fixture"])
def test_short_names_of_a_real_trace_are_short_and_one_to_one(path):
    names = _kernel_names(path)
    mapping = short_names(names)
    assert set(mapping) == set(names)
    assert all(len(short) <= MAX_SHORT_NAME for short in mapping.values())
    assert len(set(mapping.values())) == len(names)  # one-to-one within the trace
    assert not any(s.startswith(("void ", "at::", "std::")) for s in mapping.values())


def test_every_committed_trace_has_long_names_and_they_shrink():
    names = sorted({n for p in KINETO_TRACES for n in _kernel_names(p)})
    assert len(names) == 155 and max(map(len, names)) > 900  # what the rule is for
    assert MAX_SHORT_NAME == 100  # so that a table cell of a name in backticks and its share stays within 120
    assert max(len(short_kernel_name(n)) for n in names) == MAX_SHORT_NAME  # the xmma names are cut to exactly that


# Each example of docs/traces.md ("Kernel names") / the module docstring, with its full name as the committed traces hold it.
EXAMPLES = [
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, "
     "at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, "
     "at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<"
     "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, "
     "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})",
     "elementwise_kernel<MulFunctor<float>>"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::masked_fill_kernel("
     "at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16, "
     "bool)#1}>(at::TensorIteratorBase&, at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::"
     "{lambda()#1}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16, bool)#1} const&)::{lambda(int)#1}>(int, "
     "at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::"
     "{lambda()#1}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16, bool)#1}>(at::TensorIteratorBase&, "
     "at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::"
     "{lambda()#12}::operator()() const::{lambda(c10::BFloat16, bool)#1} const&)::{lambda(int)#1})",
     "elementwise_kernel<masked_fill_kernel>"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)",
     "cutlass_80_simt_sgemm_256x128_8x4_nn_align1"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"),
    ("triton_red_fused__to_copy__unsafe_view_add_mul_sum_view_11", "triton_red_fused__to_copy__unsafe_view_add_mul_sum_view_11"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::"
     "{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, "
     "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::"
     "operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)", "vectorized_elementwise_kernel<GeluCUDAKernelImpl>"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, "
     "float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4>)",
     "reduce_kernel<MeanOps<float, float, float, float>>"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, "
     "at::native::(anonymous namespace)::UnaryOpFunctor<float, 2, 1, 1>, at::native::Sqrt<float> >(at::native::(anonymous namespace)::"
     "TensorListMetadata<2>, at::native::(anonymous namespace)::UnaryOpFunctor<float, 2, 1, 1>, at::native::Sqrt<float>)",
     "multi_tensor_apply_kernel<UnaryOpFunctor<float, 2, 1, 1>, Sqrt<float>>"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForwardSmem<8, c10::BFloat16, float, c10::BFloat16, at::native::(anonymous namespace)::"
     "LogSoftMaxForwardEpilogue, long>(c10::BFloat16*, c10::BFloat16 const*, long)", "cunn_SoftMaxForwardSmem<LogSoftMaxForwardEpilogue>"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 7, false, false>(float*, float const*, int, int, int, bool const*, int, bool)",
     "softmax_warp_forward"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float, false, true, "
     "true, false, 6, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<"
     "__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<"
     "__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, float>)",
     "gemvx::kernel"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
     "fmha_cutlassF_f32_aligned_64x64_rf_sm80"),
    ("Memcpy DtoH (Device -> Pinned)", "Memcpy DtoH (Device -> Pinned)"),
]


@pytest.mark.parametrize("full, short", EXAMPLES, ids=[s for _, s in EXAMPLES])
def test_documented_examples(full, short):
    assert short_kernel_name(full) == short


def test_the_examples_are_real_kernel_names():
    real = {n for p in KINETO_TRACES for n in _kernel_names(p)}
    assert all(full in real for full, _ in EXAMPLES if not full.startswith("Memcpy"))


def test_a_long_name_keeps_both_ends():
    full = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_split_k_kernel__5x_cublas"
    short = short_kernel_name(full)
    assert len(full) == 129 and len(short) == 100
    assert short == "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warps…execute_split_k_kernel__5x_cublas"
    assert short.count("…") == 1


def test_kernels_sharing_a_short_name_get_suffixes_in_the_order_given():
    names = [f"void (anonymous namespace)::softmax_warp_forward<float, float, float, {k}, false, false>(float*)" for k in (7, 4, 8)]
    mapping = short_names(names + names[:1])  # a repeated name counts once
    assert [mapping[n] for n in names] == ["softmax_warp_forward", "softmax_warp_forward #2", "softmax_warp_forward #3"]
    long_names = ["x" * 200 + "_a", "x" * 300 + "_a", "x" * 101]  # the first two are cut to the same 100 characters
    short = short_names(long_names)
    assert short["x" * 200 + "_a"] == "x" * 66 + "…" + "x" * 31 + "_a"
    assert short["x" * 300 + "_a"] == "x" * 64 + "…" + "x" * 30 + "_a #2" and len(short["x" * 300 + "_a"]) == MAX_SHORT_NAME
    assert short["x" * 101] == "x" * 66 + "…" + "x" * 33


def test_analyze_json_keeps_full_names_with_short_names_beside_them():
    from perflab.analysis import analyze_trace

    summary = analyze_trace(load_trace(KINETO_TRACES[TRACE_IDS.index("lm_train_step_explicit")]), top=15).to_dict()
    top = summary["top_kernels"]
    assert len({r["name"] for r in top}) == len({r["full_name"] for r in top}) == len(top) == 15
    assert all(len(r["name"]) <= MAX_SHORT_NAME for r in top) and any(len(r["full_name"]) > 300 for r in top)
    assert all(r["name"].split(" #")[0] == short_kernel_name(r["full_name"]) for r in top)
    passes = {p["pass"]: p for p in summary["passes"]}
    assert set(passes) == {"forward", "backward", "optimizer"}
    for p in passes.values():
        assert p["top_kernel_short"] == short_kernel_name(p["top_kernel"])
        assert p["top_non_gemm_kernel_short"] == short_kernel_name(p["top_non_gemm_kernel"])
    assert passes["optimizer"]["top_kernel_short"] == "multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4, (ADAM_MODE)1, false>>"
