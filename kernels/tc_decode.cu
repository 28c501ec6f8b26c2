// Launchers of the tensor-core decode attention (tc_decode.cuh): validation as the
// default decode, the kernel with its dynamic shared memory (over 48 KiB: the attribute
// is raised once per instance; swapped operands with 32-token warp tiles at 2 stages for
// groups of at most 8 at head dims 64 and 128 (64-token ones at 64), or 16-token ones when
// TcDecodeShape::tile_tokens is 16; the 16-row form otherwise), the grid in either order
// (TcDecodeShape::heads_first), then the split merge: a merge_kernel launch, or none when
// the last CTA merges (merge_counters). Heads across warps (TcDecodeShape::warp_heads):
// tc_decode_hw.cu's instances on a grid of 4 kv heads per CTA.
#include "attention_dispatch.cuh"
#include "tc_decode_api.hpp"
#include "tc_decode_hw.cuh"
#include "tc_decode_probe.cuh"

#include <type_traits>

namespace kvmm::kernels::experimental {
namespace {

template <typename T, int D, typename Addr, bool kTileInPage, int kStages, bool kSwap, int kSub>
void launch_instance(const device::AttnArgs& a, const Addr& kv, dim3 grid, cudaStream_t s) {
  constexpr std::uint32_t bytes = device::tc_smem_bytes<D, kStages, kSwap, kSub>();
  static const bool raised = [] {
    void (*kernel)(device::AttnArgs, Addr) = device::tc_decode_kernel<T, D, Addr, kTileInPage, kStages, kSwap, kSub>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    // The whole unified L1 as shared memory (228 KiB per SM on sm_90, 1 KiB of it reserved
    // per CTA), so that the CTAs per SM are what the ring allows, not the driver's default
    // split: at D 128, 32-token warp tiles at 2 stages (128 KiB per CTA, the default) and 4
    // stages of 16 (128 KiB) fit ONE CTA (4 warps) per SM whatever the carveout (the H200
    // run of 2026-11-28 measured 4 resident warps per SM); 3 stages of 16 (96 KiB) fit 2,
    // 16-token tiles at 2 stages (64 KiB, TcDecodeShape::tile_tokens 16) fit 3. The L1 cache
    // left over is unused by this kernel: its K/V loads are cp.async.cg, which bypass L1.
    cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    return true;
  }();
  (void)raised;
  device::tc_decode_kernel<T, D, Addr, kTileInPage, kStages, kSwap, kSub>
      <<<grid, device::kTcThreads, bytes, s>>>(a, kv);
}

template <int kProbe>
void launch_probe_instance(const device::AttnArgs& a, const device::TcPagedAddr& kv, dim3 grid, cudaStream_t s) {
  constexpr std::uint32_t bytes = device::tc_smem_bytes<128, 2, true, 2>();
  static const bool raised = [] {
    void (*kernel)(device::AttnArgs, device::TcPagedAddr) = device::tc_decode_probe_kernel<kProbe>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    return true;
  }();
  (void)raised;
  device::tc_decode_probe_kernel<kProbe><<<grid, device::kTcThreads, bytes, s>>>(a, kv);
}

// The limiter probes (TcDecodeShape::probe, issue 36): bf16, D 128, 2 stages, swapped form
// with 32-token warp tiles in pages of whole sub-tiles (launch() checks that).
void launch_probe(const device::AttnArgs& a, const device::TcPagedAddr& kv, dim3 grid, std::uint32_t probe,
                  cudaStream_t s) {
  if (probe == device::kTcProbeLoadOnly)
    launch_probe_instance<device::kTcProbeLoadOnly>(a, kv, grid, s);
  else if (probe == device::kTcProbeMathOnly)
    launch_probe_instance<device::kTcProbeMathOnly>(a, kv, grid, s);
  else
    launch_probe_instance<device::kTcProbePlainMap>(a, kv, grid, s);
  if (a.num_splits > 1 && a.merge_counters == nullptr)
    device::merge_kernel<device::BFloat><<<dim3(a.batch, a.q_heads), 128, 0, s>>>(a, 128);
}

template <typename T, int D, typename Addr, int kStages, bool kSwap, int kSub>
void launch_form(const device::AttnArgs& a, const Addr& kv, dim3 grid, cudaStream_t s) {
  if (device::tc_tile_in_page(kv))
    launch_instance<T, D, Addr, true, kStages, kSwap, kSub>(a, kv, grid, s);
  else if constexpr (!std::is_same_v<Addr, device::ContiguousAddr>)
    launch_instance<T, D, Addr, false, kStages, kSwap, kSub>(a, kv, grid, s);
}

// Swapped operands for groups of at most 8 at head dims 64 and 128 (device::tc_swap), with
// 32-token warp tiles (64 at head dim 64) at 2 stages (device::tc_sub), or 16-token ones
// (tile16); the 16-row form with 16-token tiles otherwise.
template <typename T, int D, typename Addr, int kStages = device::kTcStages>
void launch_tc(const device::AttnArgs& a, const Addr& kv, dim3 grid, bool tile16, cudaStream_t s) {
  if constexpr (D <= 128) {
    if (device::tc_swap(a, D)) {
      if constexpr (kStages == 2) {
        if (tile16) return launch_form<T, D, Addr, kStages, true, 1>(a, kv, grid, s);
      }
      return launch_form<T, D, Addr, kStages, true, device::tc_sub(D, kStages)>(a, kv, grid, s);
    }
  }
  launch_form<T, D, Addr, kStages, false, 1>(a, kv, grid, s);
}

template <typename T, typename Addr>
void launch_tc_typed(const device::AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t d, std::uint32_t stages,
                     bool tile16, cudaStream_t s) {
  if (d == 64)
    launch_tc<T, 64>(a, kv, grid, tile16, s);
  else if (d == 128 && stages == 3)
    launch_tc<T, 128, Addr, 3>(a, kv, grid, tile16, s);
  else if (d == 128 && stages == 4)
    launch_tc<T, 128, Addr, 4>(a, kv, grid, tile16, s);
  else if (d == 128)
    launch_tc<T, 128>(a, kv, grid, tile16, s);
  else
    launch_tc<T, 256>(a, kv, grid, tile16, s);
  if (a.num_splits > 1 && a.merge_counters == nullptr)
    device::merge_kernel<T><<<dim3(a.batch, a.q_heads), d, 0, s>>>(a, d);
}

template <typename Addr>
void launch(const QueryBatch& q, const AttentionOptions& opt, const SplitKV& split, std::uint32_t kv_heads,
            std::uint32_t d, DType dtype, const Addr& kv, std::uint32_t stages, std::uint32_t* counters,
            TcDecodeShape shape, Stream stream, const char* name) {
  check_tc_stages(name, stages, d);
  check_tc_shape(name, shape, q.batch, kv_heads * ((q.q_heads / kv_heads + device::kTcRows - 1) / device::kTcRows));
  if (q.rows == 0) return;
  device::AttnArgs a = device::make_tc_args(q, opt, split, kv_heads, d);
  if (a.num_splits > 1) a.merge_counters = counters;
  check_tc_warp_heads(name, shape, stages == 2 && shape.tile_tokens == 0 && shape.probe == 0 && device::tc_swap(a, d));
  if (shape.warp_heads) {  // one CTA per (request, 4 kv heads, piece); groups <= 8: one head chunk
    a.heads_first = shape.heads_first;
    const std::uint32_t c = device::tc_hw_chunks(kv_heads);
    const dim3 grid = a.heads_first ? dim3(c, q.batch, a.num_splits) : dim3(q.batch, c, a.num_splits);
    detail::launch_tc_hw(a, kv, grid, d, dtype == DType::kF16, device::to_cuda(stream));
    if (a.num_splits > 1 && a.merge_counters == nullptr) {
      if (dtype == DType::kF16)
        device::merge_kernel<device::Half><<<dim3(a.batch, a.q_heads), d, 0, device::to_cuda(stream)>>>(a, d);
      else
        device::merge_kernel<device::BFloat><<<dim3(a.batch, a.q_heads), d, 0, device::to_cuda(stream)>>>(a, d);
    }
    device::check_launch(name);
    return;
  }
  // kv heads along x for the swapped form only (tc_decode.cuh); the 16-row form and D 256
  // keep the request-major grid.
  a.heads_first = shape.heads_first && d <= 128 && device::tc_swap(a, d);
  const dim3 grid = a.heads_first ? dim3(kv_heads * a.head_chunks, q.batch, a.num_splits)
                                  : dim3(q.batch, kv_heads * a.head_chunks, a.num_splits);
  const bool tile16 = shape.tile_tokens == 16;
  if constexpr (std::is_same_v<Addr, device::TcPagedAddr>) {
    if (shape.probe != 0) {
      check_tc_probe(name, shape,
                     dtype == DType::kBF16 && d == 128 && stages == 2 && !tile16 && device::tc_swap(a, d) &&
                         device::tc_tile_in_page(kv));
      launch_probe(a, kv, grid, shape.probe, device::to_cuda(stream));
      device::check_launch(name);
      return;
    }
  } else {
    check_tc_probe(name, shape, false);
  }
  if (dtype == DType::kF16)
    launch_tc_typed<device::Half>(a, kv, grid, d, stages, tile16, device::to_cuda(stream));
  else
    launch_tc_typed<device::BFloat>(a, kv, grid, d, stages, tile16, device::to_cuda(stream));
  device::check_launch(name);
}

}  // namespace

void paged_decode_attention_tc(const PagedAttentionParams& p, Stream stream, std::uint32_t stages,
                               std::uint32_t* merge_counters, TcDecodeShape shape) {
  check_params(p, false, true);
  launch(p.query, p.options, p.split, p.cache.kv_heads, p.cache.head_dim, p.cache.dtype, device::tc_paged_addr(p),
         stages, merge_counters, shape, stream, "paged_decode_attention_tc");
}

void contiguous_decode_attention_tc(const ContiguousAttentionParams& p, Stream stream, std::uint32_t stages,
                                    std::uint32_t* merge_counters, TcDecodeShape shape) {
  check_params(p, false, true);
  launch(p.query, p.options, p.split, p.cache.kv_heads, p.cache.head_dim, p.cache.dtype, device::contiguous_addr(p),
         stages, merge_counters, shape, stream, "contiguous_decode_attention_tc");
}

}  // namespace kvmm::kernels::experimental
