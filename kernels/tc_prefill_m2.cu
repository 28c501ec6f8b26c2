// The tensor-core prefill at 32 rows per warp (tc_prefill.cuh, kMt 2: 128-row Q tiles,
// each K/V fragment feeding two m-tiles), its instances and launch: D 128, bf16 and fp16
// with the split P, bf16 with one rounded P; paged caches. A translation unit of its own
// because it is compiled with ptxas -O1 (CMakeLists.txt): at ptxas's default -O3 the
// scheduler hoists enough to need more than 255 registers (16-136 bytes of spills, nvcc
// 13.0); at -O1 the paged instances take 249-254 registers, no stack (the contiguous ones
// would spill 8-56 bytes: not built, the launcher refuses them). Costs one launch.
#include "tc_prefill_m2.hpp"

#include "tc_prefill.cuh"

namespace kvmm::kernels::experimental::detail_tc {
namespace {

template <typename T, typename Addr, bool kTileInPage, bool kSplitP>
void launch_instance(const device::AttnArgs& a, const Addr& kv, dim3 grid, cudaStream_t s) {
  constexpr std::uint32_t bytes = device::pf_smem_bytes<128, 2>();
  auto* kernel = device::tc_prefill_kernel<T, 128, Addr, kTileInPage, kSplitP, 2>;
  static const bool raised = [kernel] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    return true;
  }();
  (void)raised;
  kernel<<<grid, device::kPfThreads, bytes, s>>>(a, kv);
}

template <typename T, typename Addr, bool kSplitP>
void launch_addr(const device::AttnArgs& a, const Addr& kv, dim3 grid, cudaStream_t s) {
  if (device::pf_tile_in_page(kv))
    launch_instance<T, Addr, true, kSplitP>(a, kv, grid, s);
  else
    launch_instance<T, Addr, false, kSplitP>(a, kv, grid, s);
}

}  // namespace

void launch_m2(const device::AttnArgs& a, const device::TcPagedAddr& kv, dim3 grid, bool half, bool round_p_once,
               cudaStream_t s) {
  if (round_p_once)
    launch_addr<device::BFloat, device::TcPagedAddr, false>(a, kv, grid, s);
  else if (half)
    launch_addr<device::Half, device::TcPagedAddr, true>(a, kv, grid, s);
  else
    launch_addr<device::BFloat, device::TcPagedAddr, true>(a, kv, grid, s);
}

}  // namespace kvmm::kernels::experimental::detail_tc
