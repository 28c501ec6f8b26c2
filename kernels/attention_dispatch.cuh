// Launch configuration and dispatch of the attention kernels (attention.cuh holds the
// device code only): the kernel arguments of one launch from the validated parameters,
// the grid (rows, kv heads x head chunks, splits), the slots per CTA (G), and on the
// device build the choice of template instance by dtype, head dim and G plus the merge
// launch. Host code only; costs one kernel launch (two with split-KV) per call. The
// host emulation (KVMM_SIMT_HOST) uses make_args/attention_grid/heads_per_cta and runs
// the kernels itself.
#pragma once

#include "attention.cuh"
#include "launch.cuh"
#include "tc_decode.cuh"

#include <cmath>

namespace kvmm::kernels::device {

// Slots per CTA (the kernel's G): 4 for decode with groups up to 4, else 8.
inline int heads_per_cta(std::uint32_t group, bool prefill) { return !prefill && group <= 4 ? 4 : 8; }

// Kernel arguments and grid of one launch; parameters already validated by check_params.
inline AttnArgs make_args(const QueryBatch& q, const AttentionOptions& opt, const SplitKV& split,
                          std::uint32_t kv_heads, std::uint32_t head_dim) {
  AttnArgs a{};
  a.q = static_cast<const std::uint16_t*>(q.q);
  a.o = static_cast<std::uint16_t*>(q.o);
  a.kv_lens = q.kv_lens;
  a.q_indptr = q.q_indptr;
  a.batch = q.batch;
  a.q_heads = q.q_heads;
  a.group = q.q_heads / kv_heads;
  const auto g = static_cast<std::uint32_t>(heads_per_cta(a.group, q.q_indptr != nullptr));
  a.head_chunks = (a.group + g - 1) / g;
  a.rows_per_cta = q.q_indptr != nullptr && a.group < g ? g / a.group : 1;
  a.num_splits = split.num_splits;
  if (split.num_splits > 1) {
    a.ws_o = static_cast<float*>(split.workspace);
    a.ws_lse = a.ws_o + std::uint64_t{q.rows} * q.q_heads * split.num_splits * head_dim;
  }
  a.mask = opt.mask;
  a.window = opt.window;
  a.chunk = opt.chunk;
  const float scale = opt.scale > 0.0f ? opt.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  a.soft_cap = opt.soft_cap > 0.0f;
  a.scale_log2 = scale * kLog2e;
  a.scale_div_cap = a.soft_cap ? scale / opt.soft_cap : 0.0f;
  a.cap_log2 = opt.soft_cap * kLog2e;
  return a;
}

// The tensor-core decode kernel's arguments (tc_decode.cuh): 16 q heads per CTA.
inline AttnArgs make_tc_args(const QueryBatch& q, const AttentionOptions& opt, const SplitKV& split,
                             std::uint32_t kv_heads, std::uint32_t head_dim) {
  AttnArgs a = make_args(q, opt, split, kv_heads, head_dim);
  a.head_chunks = (a.group + kTcRows - 1) / kTcRows;
  a.rows_per_cta = 1;
  return a;
}

inline dim3 attention_grid(const AttnArgs& a, std::uint32_t rows, std::uint32_t kv_heads) {
  return dim3(rows, kv_heads * a.head_chunks, a.num_splits);
}

#if !defined(KVMM_SIMT_HOST)
template <typename T, int G, typename Addr>
void launch_heads(const AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t head_dim, cudaStream_t s) {
  switch (head_dim) {
    case 64:
      attention_kernel<T, 64, G, Addr><<<grid, kThreads, 0, s>>>(a, kv);
      break;
    case 128:
      attention_kernel<T, 128, G, Addr><<<grid, kThreads, 0, s>>>(a, kv);
      break;
    default:
      attention_kernel<T, 256, G, Addr><<<grid, kThreads, 0, s>>>(a, kv);
      break;
  }
}

template <typename T, typename Addr>
void launch_typed(const AttnArgs& a, const Addr& kv, dim3 grid, std::uint32_t head_dim, cudaStream_t s) {
  if (heads_per_cta(a.group, a.q_indptr != nullptr) == 4) {
    launch_heads<T, 4>(a, kv, grid, head_dim, s);
  } else {
    launch_heads<T, 8>(a, kv, grid, head_dim, s);
  }
  if (a.num_splits > 1) merge_kernel<T><<<dim3(grid.x, a.q_heads), head_dim, 0, s>>>(a, head_dim);
}

template <typename Addr>
void launch_attention(const QueryBatch& q, const AttentionOptions& opt, const SplitKV& split, std::uint32_t kv_heads,
                      std::uint32_t head_dim, DType dtype, const Addr& kv, Stream stream, const char* name) {
  if (q.rows == 0) return;
  const AttnArgs a = make_args(q, opt, split, kv_heads, head_dim);
  const dim3 grid = attention_grid(a, q.rows, kv_heads);
  if (dtype == DType::kF16) {
    launch_typed<Half>(a, kv, grid, head_dim, to_cuda(stream));
  } else {
    launch_typed<BFloat>(a, kv, grid, head_dim, to_cuda(stream));
  }
  check_launch(name);
}
#endif

}  // namespace kvmm::kernels::device
