// The sm_90a probe of kernels/hopper.cuh, compiled for sm_90a only and read by the SASS
// census (ctest kernels_static): every wrapper must compile to its instruction (HGMMA,
// UTMALDG, SYNCS for the mbarrier, no local memory). One CTA of one warpgroup: an
// mbarrier, a TMA load of A (64 x 16 bf16) and of B (16 x 16), one wgmma m64n16k16 and
// one m64n8k16 (fp16 path), the accumulators stored. Built as a static library; nothing
// links it (running it on a GPU is the GPU script's job).
#include "../../../kernels/hopper.cuh"

namespace kvmm::kernels::device {

__global__ void __launch_bounds__(128, 1)
    hopper_probe_kernel(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b, float* out) {
  __shared__ alignas(1024) std::uint16_t a[64 * 16];
  __shared__ alignas(1024) std::uint16_t b[16 * 16];
  __shared__ std::uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar, sizeof a + sizeof b);
    tma_load<2>(a, map_a, {0, 0}, &bar);
    tma_load<2>(b, map_b, {0, 0}, &bar);
  }
  mbar_wait(&bar, 0);
  float d[8] = {}, e[4] = {};
  wgmma_fence();
  // No swizzle, K-major: core matrices of 8 rows x 16 B packed row group after row group.
  wgmma_m64k16<BFloat, 16>(d, make_smem_desc(a, 128, 256, false), make_smem_desc(b, 128, 256, false), false);
  wgmma_m64k16<Half, 8>(e, make_smem_desc(a, 128, 256, false), make_smem_desc(b, 128, 256, false), false);
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < 8; ++i) out[threadIdx.x * 12 + i] = d[i];
  for (int i = 0; i < 4; ++i) out[threadIdx.x * 12 + 8 + i] = e[i];
}

}  // namespace kvmm::kernels::device
