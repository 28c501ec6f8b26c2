// Census-only instantiations of the tensor-core prefill (bf16, head dim 128, 16-token
// pages) compiled with KVMM_CENSUS_INTERIOR: the element-mask block and the rare path
// are compiled out, so the main loop's counts are those of an interior KV tile (every
// element visible to every row of the warp) in the steady state (no maxima: no row's
// weight over 2^kPfLazy against its lazy reference), the path all but a warp's boundary
// tiles and its first take (and the tiles where a maximum jumps). With census_variants.cu
// (the whole loop, mask block included) the time model (bench/kernels/model.py) charges
// boundary tiles the one and interior tiles the other. Built as a static library for the
// SASS census only; nothing links it.
#define KVMM_CENSUS_INTERIOR 1
#include "../../../kernels/tc_prefill.cuh"

namespace kvmm::kernels::device {

template __global__ void tc_prefill_kernel<BFloat, 128, TcPagedAddr, false, true, 1>(AttnArgs, TcPagedAddr);
template __global__ void tc_prefill_kernel<BFloat, 128, TcPagedAddr, false, false, 1>(AttnArgs, TcPagedAddr);

}  // namespace kvmm::kernels::device
