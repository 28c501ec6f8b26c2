// Launchers of the tensor-core prefill attention (tc_prefill.cuh): validation as the
// default prefill, the kernel with its dynamic shared memory (over 48 KiB: the attribute
// is raised once per instance), then the split merge. P is applied in two parts (kSplitP)
// so that results stay within a few units of roundoff of the references, unless the
// caller asks for FA2's one rounding (round_p_once: bf16, D 128). 16 rows per warp here;
// 32 (TcPrefillRows::k32, D 128) in tc_prefill_m2.cu.
#include "attention_dispatch.cuh"
#include "tc_prefill.cuh"
#include "tc_prefill_api.hpp"
#include "tc_prefill_m2.hpp"

#include <type_traits>

namespace kvmm::kernels::experimental {
namespace {

template <typename T, int D, typename Addr, bool kTileInPage, bool kSplitP>
void launch_instance(const device::AttnArgs& a, const Addr& kv, dim3 grid, cudaStream_t s) {
  constexpr std::uint32_t bytes = device::pf_smem_bytes<D>();
  auto* kernel = device::tc_prefill_kernel<T, D, Addr, kTileInPage, kSplitP>;
  static const bool raised = [kernel] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    return true;
  }();
  (void)raised;
  kernel<<<grid, device::kPfThreads, bytes, s>>>(a, kv);
}

template <typename T, int D, typename Addr, bool kSplitP>
void launch_pf(const device::AttnArgs& a, const Addr& kv, dim3 grid, cudaStream_t s) {
  if (device::pf_tile_in_page(kv))
    launch_instance<T, D, Addr, true, kSplitP>(a, kv, grid, s);
  else if constexpr (!std::is_same_v<Addr, device::ContiguousAddr>)
    launch_instance<T, D, Addr, false, kSplitP>(a, kv, grid, s);
}

template <typename T, typename Addr>
void launch_typed(const device::AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t rows, std::uint32_t d,
                  bool round_p_once, cudaStream_t s) {
  // The one-rounded-P instances are built for bf16 at D 128 only (the benchmarks' shape;
  // launch() refuses other requests).
  if constexpr (std::is_same_v<T, device::BFloat>) {
    if (round_p_once) {
      launch_pf<T, 128, Addr, false>(a, kv, grid, s);
      if (a.num_splits > 1) device::merge_kernel<T><<<dim3(rows, a.q_heads), d, 0, s>>>(a, d);
      return;
    }
  }
  if (d == 64)
    launch_pf<T, 64, Addr, true>(a, kv, grid, s);
  else
    launch_pf<T, 128, Addr, true>(a, kv, grid, s);
  if (a.num_splits > 1) device::merge_kernel<T><<<dim3(rows, a.q_heads), d, 0, s>>>(a, d);
}

template <typename Addr>
void launch(const QueryBatch& q, const AttentionOptions& opt, const SplitKV& split, std::uint32_t kv_heads,
            std::uint32_t d, DType dtype, const Addr& kv, Stream stream, const char* name, bool round_p_once,
            TcPrefillRows rows) {
  if (d != 64 && d != 128) detail::launch_failed(name, "head_dim 256 is not supported by the tensor-core prefill");
  if (round_p_once && (d != 128 || dtype != DType::kBF16))
    detail::launch_failed(name, "round_p_once is built for bf16 at head_dim 128 only");
  if (rows != TcPrefillRows::k16 && rows != TcPrefillRows::k32)
    detail::launch_failed(name, "rows per warp must be 16 or 32");
  if (rows == TcPrefillRows::k32 && d != 128)
    detail::launch_failed(name, "32 rows per warp is built for head_dim 128 only");
  if (rows == TcPrefillRows::k32 && std::is_same_v<Addr, device::ContiguousAddr>)
    detail::launch_failed(name, "32 rows per warp is built for paged caches only");
  if (q.rows == 0) return;
  const std::uint32_t qrows = device::kPfRows * (rows == TcPrefillRows::k32 ? 2u : 1u);
  const device::AttnArgs a = device::pf_args(device::make_args(q, opt, split, kv_heads, d), qrows);
  const dim3 grid(device::pf_grid_x(q.rows, q.batch, a.group, qrows), kv_heads * a.head_chunks, a.num_splits);
  if (rows == TcPrefillRows::k32) {
    if constexpr (std::is_same_v<Addr, device::TcPagedAddr>)
      detail_tc::launch_m2(a, kv, grid, dtype == DType::kF16, round_p_once, device::to_cuda(stream));
    if (a.num_splits > 1) {
      if (dtype == DType::kF16)
        device::merge_kernel<device::Half><<<dim3(q.rows, a.q_heads), d, 0, device::to_cuda(stream)>>>(a, d);
      else
        device::merge_kernel<device::BFloat><<<dim3(q.rows, a.q_heads), d, 0, device::to_cuda(stream)>>>(a, d);
    }
  } else if (dtype == DType::kF16)
    launch_typed<device::Half>(a, kv, grid, q.rows, d, round_p_once, device::to_cuda(stream));
  else {
    launch_typed<device::BFloat>(a, kv, grid, q.rows, d, round_p_once, device::to_cuda(stream));
  }
  device::check_launch(name);
}

}  // namespace

void paged_prefill_attention_tc(const PagedAttentionParams& p, Stream stream, bool round_p_once, TcPrefillRows rows) {
  check_params(p, true, true);
  launch(p.query, p.options, p.split, p.cache.kv_heads, p.cache.head_dim, p.cache.dtype, device::tc_paged_addr(p),
         stream, "paged_prefill_attention_tc", round_p_once, rows);
}

void contiguous_prefill_attention_tc(const ContiguousAttentionParams& p, Stream stream, bool round_p_once,
                                     TcPrefillRows rows) {
  check_params(p, true, true);
  launch(p.query, p.options, p.split, p.cache.kv_heads, p.cache.head_dim, p.cache.dtype, device::contiguous_addr(p),
         stream, "contiguous_prefill_attention_tc", round_p_once, rows);
}

}  // namespace kvmm::kernels::experimental
