// Heads across warps (issue 36, experimental::TcDecodeShape::warp_heads): the tensor-core
// decode's swapped form (groups of at most 8, head dims 64 and 128, 2 stages, 32-/64-token
// warp tiles) with one CTA per (request, 4 consecutive kv heads, split piece): warp w takes
// kv head 4 y + w and walks every tile of the piece in order, so at any moment the CTA's
// four warps copy the same tokens of four adjacent heads, 1 KiB contiguous of each token
// row at head dim 128 (pages are token-major: a row is kv_heads x D x 2 bytes). Each warp
// keeps its own ring, Q^T and softmax and writes its head's rows itself (tc_warp_out), no
// merge of warps; the in-kernel split merge counts arrivals per (request, 4-head chunk). A
// warp past the last kv head (kv_heads not a multiple of 4) idles. Device code only; the
// per-tile work of tc_decode_body's swapped form (kHw changes which tiles and heads a warp
// takes, not how a tile is computed).
#pragma once

#include "tc_decode.cuh"

namespace kvmm::kernels::device {

// Kv heads per CTA (one per warp) and the grid's kv-head extent.
inline constexpr std::uint32_t kTcHwHeads = kTcWarps;
inline std::uint32_t tc_hw_chunks(std::uint32_t kv_heads) { return (kv_heads + kTcHwHeads - 1) / kTcHwHeads; }

template <typename T, int D, typename Addr, bool kTileInPage>
__global__ void __launch_bounds__(kTcThreads, 4) tc_decode_hw_kernel(AttnArgs a, Addr kv) {
  tc_decode_body<T, D, Addr, kTileInPage, 2, true, tc_sub(D, 2), kTcProbeNone, true>(a, kv);
}

}  // namespace kvmm::kernels::device

#if !defined(KVMM_SIMT_HOST)
namespace kvmm::kernels::experimental::detail {
// The launches of tc_decode_hw_kernel (kernels/tc_decode_hw.cu, its own translation unit):
// bf16 or fp16 (`f16`), head dim 64 or 128, paged (one page entry per sub-tile when pages
// hold whole 16-token tiles, else per row) or contiguous; the grid as tc_decode.cu builds it.
void launch_tc_hw(const device::AttnArgs& a, const device::TcPagedAddr& kv, dim3 grid, std::uint32_t d, bool f16,
                  cudaStream_t s);
void launch_tc_hw(const device::AttnArgs& a, const device::ContiguousAddr& kv, dim3 grid, std::uint32_t d, bool f16,
                  cudaStream_t s);
}  // namespace kvmm::kernels::experimental::detail
#endif
