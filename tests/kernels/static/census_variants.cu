// Census-only instantiations of the attention kernels (bf16, head dim 128; 64 for the
// tensor-core decode's 64-token tiles) with the
// soft-cap branch compiled out (KVMM_CENSUS_NO_SOFT_CAP): the path the benchmarks run,
// whose main-loop instruction counts feed the time model (bench/kernels/model.py). Built
// as a static library for the SASS census only; nothing links it.
#include "../../../kernels/attention.cuh"
#include "../../../kernels/tc_decode.cuh"
#include "../../../kernels/tc_decode_hw.cuh"
#include "../../../kernels/tc_prefill.cuh"

namespace kvmm::kernels::device {

template __global__ void attention_kernel<BFloat, 128, 4, PagedAddr>(AttnArgs, PagedAddr);
template __global__ void attention_kernel<BFloat, 128, 4, ContiguousAddr>(AttnArgs, ContiguousAddr);
template __global__ void attention_kernel<BFloat, 128, 8, PagedAddr>(AttnArgs, PagedAddr);
template __global__ void attention_kernel<BFloat, 128, 8, ContiguousAddr>(AttnArgs, ContiguousAddr);
template __global__ void tc_decode_kernel<BFloat, 128, TcPagedAddr, true>(AttnArgs, TcPagedAddr);
template __global__ void tc_decode_kernel<BFloat, 128, TcPagedAddr, false>(AttnArgs, TcPagedAddr);
template __global__ void tc_decode_kernel<BFloat, 128, ContiguousAddr, true>(AttnArgs, ContiguousAddr);
// The form the launchers run at groups of at most 8 (the bench's 4): swapped operands,
// 32-token warp tiles, 2 stages; its loop counts feed the time model.
template __global__ void tc_decode_kernel<BFloat, 128, TcPagedAddr, true, 2, true, 2>(AttnArgs, TcPagedAddr);
template __global__ void tc_decode_kernel<BFloat, 128, TcPagedAddr, false, 2, true, 2>(AttnArgs, TcPagedAddr);
template __global__ void tc_decode_kernel<BFloat, 128, ContiguousAddr, true, 2, true, 2>(AttnArgs, ContiguousAddr);
// Head dim 64: 64-token warp tiles (kSub 4, tc_sub), the form the launchers run there.
template __global__ void tc_decode_kernel<BFloat, 64, TcPagedAddr, true, 2, true, 4>(AttnArgs, TcPagedAddr);
template __global__ void tc_decode_kernel<BFloat, 64, TcPagedAddr, false, 2, true, 4>(AttnArgs, TcPagedAddr);
template __global__ void tc_decode_kernel<BFloat, 64, ContiguousAddr, true, 2, true, 4>(AttnArgs, ContiguousAddr);
// Heads across warps (tc_decode_hw.cuh, TcDecodeShape::warp_heads): the same swapped form, one
// kv head per warp, every tile; paged `tile` and `row`, contiguous, D 128 and 64.
template __global__ void tc_decode_hw_kernel<BFloat, 128, TcPagedAddr, true>(AttnArgs, TcPagedAddr);
template __global__ void tc_decode_hw_kernel<BFloat, 128, TcPagedAddr, false>(AttnArgs, TcPagedAddr);
template __global__ void tc_decode_hw_kernel<BFloat, 128, ContiguousAddr, true>(AttnArgs, ContiguousAddr);
template __global__ void tc_decode_hw_kernel<BFloat, 64, TcPagedAddr, true>(AttnArgs, TcPagedAddr);
template __global__ void tc_decode_hw_kernel<BFloat, 64, TcPagedAddr, false>(AttnArgs, TcPagedAddr);
template __global__ void tc_decode_hw_kernel<BFloat, 64, ContiguousAddr, true>(AttnArgs, ContiguousAddr);
// The tensor-core prefill (issue 37): 16-token pages (row lookups), both P numerics, 16
// rows per warp (32: census_variants_m2.cu, built with ptxas -O1 as the launched ones).
template __global__ void tc_prefill_kernel<BFloat, 128, TcPagedAddr, false, true, 1>(AttnArgs, TcPagedAddr);
template __global__ void tc_prefill_kernel<BFloat, 128, TcPagedAddr, false, false, 1>(AttnArgs, TcPagedAddr);

}  // namespace kvmm::kernels::device
