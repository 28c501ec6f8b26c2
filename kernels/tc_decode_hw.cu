// Launches of the tensor-core decode with heads across warps (kernels/tc_decode_hw.cuh,
// experimental::TcDecodeShape::warp_heads), in a translation unit of their own so that
// nvcc builds them beside tc_decode.cu: 12 kernel instances (bf16/fp16 x head dim 64/128 x
// paged tile/row, contiguous), the dynamic shared memory attribute raised once per instance.
// Host code plus the kernels; costs one launch per call (the split merge: tc_decode.cu).
#include "tc_decode_hw.cuh"

#include <type_traits>

namespace kvmm::kernels::experimental::detail {
namespace {

template <typename T, int D, typename Addr, bool kTileInPage>
void launch_instance(const device::AttnArgs& a, const Addr& kv, dim3 grid, cudaStream_t s) {
  constexpr std::uint32_t bytes = device::tc_smem_bytes<D, 2, true, device::tc_sub(D, 2)>();
  static const bool raised = [] {
    void (*kernel)(device::AttnArgs, Addr) = device::tc_decode_hw_kernel<T, D, Addr, kTileInPage>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    return true;
  }();
  (void)raised;
  device::tc_decode_hw_kernel<T, D, Addr, kTileInPage><<<grid, device::kTcThreads, bytes, s>>>(a, kv);
}

template <typename T, int D, typename Addr>
void launch_form(const device::AttnArgs& a, const Addr& kv, dim3 grid, cudaStream_t s) {
  if (device::tc_tile_in_page(kv))
    launch_instance<T, D, Addr, true>(a, kv, grid, s);
  else if constexpr (!std::is_same_v<Addr, device::ContiguousAddr>)
    launch_instance<T, D, Addr, false>(a, kv, grid, s);
}

template <typename Addr>
void launch_any(const device::AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t d, bool f16, cudaStream_t s) {
  if (f16 && d == 64)
    launch_form<device::Half, 64>(a, kv, grid, s);
  else if (f16)
    launch_form<device::Half, 128>(a, kv, grid, s);
  else if (d == 64)
    launch_form<device::BFloat, 64>(a, kv, grid, s);
  else
    launch_form<device::BFloat, 128>(a, kv, grid, s);
}

}  // namespace

void launch_tc_hw(const device::AttnArgs& a, const device::TcPagedAddr& kv, dim3 grid, std::uint32_t d, bool f16,
                  cudaStream_t s) {
  launch_any(a, kv, grid, d, f16, s);
}
void launch_tc_hw(const device::AttnArgs& a, const device::ContiguousAddr& kv, dim3 grid, std::uint32_t d, bool f16,
                  cudaStream_t s) {
  launch_any(a, kv, grid, d, f16, s);
}

}  // namespace kvmm::kernels::experimental::detail
