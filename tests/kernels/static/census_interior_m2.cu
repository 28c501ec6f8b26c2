// Census-only instantiations of the tensor-core prefill at 32 rows per warp (kMt 2; bf16,
// head dim 128, 16-token pages, both P numerics) compiled with KVMM_CENSUS_INTERIOR: the
// interior-tile path (census_interior.cu), with ptxas -O1 like the launched instances
// (kernels/tc_prefill_m2.cu). Nothing links it.
#define KVMM_CENSUS_INTERIOR 1
#include "../../../kernels/tc_prefill.cuh"

namespace kvmm::kernels::device {

template __global__ void tc_prefill_kernel<BFloat, 128, TcPagedAddr, false, true, 2>(AttnArgs, TcPagedAddr);
template __global__ void tc_prefill_kernel<BFloat, 128, TcPagedAddr, false, false, 2>(AttnArgs, TcPagedAddr);

}  // namespace kvmm::kernels::device
