"""The kernel-category rule table (the short kernel names: test_kernel_names.py)."""

from __future__ import annotations

import pytest
from reference_trace import KINETO_TRACES, NSYS_FIXTURE

from perflab.trace import load_trace
from perflab.trace.categories import CATEGORIES, RULES, categorize


@pytest.mark.parametrize("name, category", [
    ("nvjet_sm90_tst_16x64_64x16_4x2_h_bz_bias_TNN", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, float, float, float, true, false, false, false>(cublasLt::cublasSplitKParams<float>)", "gemm"),
    ("void implicit_convolve_sgemm<__nv_bfloat16, __nv_bfloat16, 128, 5, 5, 3, 3, 3, 1, false, false, true>(int, int)", "gemm"),
    ("triton_tem_fused_addmm_relu_0", "gemm"),
    ("triton_tem_fused_mm_3", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t> >(Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "attention"),
    ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4> >(Flash_fwd_params)", "attention"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 7, false, false>(float*, float const*, int, int, int, bool const*, int, bool)", "softmax"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float, float const*)", "norm"),
    ("void at::native::batch_norm_collect_statistics_kernel<float, float, float, int>(int)", "norm"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 1, false>(at::cuda::detail::TensorInfo<float const, unsigned int>)", "sort_topk_index"),
    ("void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long, at::native::LTOp<float, true>, unsigned int>(int)", "sort_topk_index"),
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)", "sort_topk_index"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl<at::native::OpaqueType<2> > > >(long)", "sort_topk_index"),
    ("void at::native::_scatter_gather_elementwise_kernel<128, 4, at::native::_cuda_scatter_gather_internal_kernel<true, float> >(int)", "sort_topk_index"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int)", "copy"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}> >(int)", "copy"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<at::native::(anonymous namespace)::OpaqueType<4u>, unsigned int, 2, 128, 1, 16, 4>(char*)", "copy"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float>)", "reduction"),
    ("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>, 4, TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<2>, at::native::memory::StoreWithCast<1> >(int)", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}>(int)", "elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::UnaryOpFunctor<float, 2, 1, 1>, at::native::Sqrt<float> >(int)", "elementwise"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("triton_poi_fused__scaled_dot_product_efficient_attention__unsafe_view_add_clone_view_3", "triton_fused"),
    ("triton_per_fused_native_layer_norm_0", "triton_fused"),
    ("triton_red_fused_sum_1", "triton_fused"),
    ("some_custom_kernel", "other"),
])
def test_rule_table(name, category):
    assert categorize(name) == category


def test_memcpy_and_memset_come_from_the_kind():
    assert categorize("Memcpy DtoH (Device -> Pinned)", "memcpy") == "memcpy"
    assert categorize("Memset (Device)", "memset") == "memset"


def test_every_rule_names_a_known_category():
    assert {category for category, _ in RULES} <= set(CATEGORIES)


@pytest.mark.parametrize("path", KINETO_TRACES + [NSYS_FIXTURE], ids=lambda p: p.name)
def test_at_least_98_percent_of_kernel_time_is_categorized(path):
    kernels = load_trace(path).kernels
    other = kernels.loc[kernels["category"] == "other", "dur_ns"].sum()
    assert other / kernels["dur_ns"].sum() <= 0.02
