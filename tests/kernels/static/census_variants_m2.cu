// Census-only instantiations of the tensor-core prefill at 32 rows per warp (kMt 2; bf16,
// head dim 128, 16-token pages, both P numerics) with the soft-cap branch compiled out
// (KVMM_CENSUS_NO_SOFT_CAP): the benchmarks' path, whose main-loop counts feed the time
// model. Compiled with ptxas -O1 like their launched instances (kernels/tc_prefill_m2.cu),
// so a translation unit apart from census_variants.cu. Nothing links it.
#include "../../../kernels/tc_prefill.cuh"

namespace kvmm::kernels::device {

template __global__ void tc_prefill_kernel<BFloat, 128, TcPagedAddr, false, true, 2>(AttnArgs, TcPagedAddr);
template __global__ void tc_prefill_kernel<BFloat, 128, TcPagedAddr, false, false, 2>(AttnArgs, TcPagedAddr);

}  // namespace kvmm::kernels::device
