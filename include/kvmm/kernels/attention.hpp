// Attention over the KV cache: paged and contiguous, decode (one query per request) and
// prefill (a causal chunk over cached context). A launcher enqueues one kernel (plus a
// merge when num_splits > 1) whose grid depends only on (rows, heads, num_splits), so it
// can be captured in a CUDA graph; K/V are read once per GQA group, O(KV bytes) per call.
// cpu:: holds the plain C++ references (kvmm::kvmm), same parameters, double accumulation.
#pragma once

#include "kvmm/kernels/kv_cache.hpp"
#include "kvmm/kernels/mask.hpp"

#include <cstddef>
#include <cstdint>

namespace kvmm::kernels {

// The query side of an attention call. q and o are [rows, q_heads, head_dim] in the
// cache's dtype (16-byte aligned). Request b has kv_lens[b] tokens in its cache,
// including the new ones (write_kv them first). Decode: q_indptr == nullptr, rows ==
// batch, row b is request b's last token (position kv_lens[b] - 1). Prefill: request b's
// q_indptr[b+1] - q_indptr[b] new tokens are rows q_indptr[b] ..; they sit at the last
// positions of its context; rows may be an upper bound of q_indptr[batch] (rows past it
// are left untouched), so one launch shape serves many steps.
struct QueryBatch {
  const void* q = nullptr;
  void* o = nullptr;
  std::uint32_t rows = 0;
  std::uint32_t batch = 0;
  std::uint32_t q_heads = 0;  // a multiple of the cache's kv_heads
  const std::uint32_t* kv_lens = nullptr;
  const std::uint32_t* q_indptr = nullptr;
};

// Split-KV: every (row, kv head) key range is cut into num_splits pieces computed by
// separate CTAs, then merged. workspace (device memory, attention_workspace_bytes())
// holds the partial outputs; it may be nullptr when num_splits == 1.
struct SplitKV {
  std::uint32_t num_splits = 1;
  void* workspace = nullptr;
};

struct PagedAttentionParams {
  QueryBatch query;
  PagedKVCache cache;
  PageTableView table;
  AttentionOptions options;
  SplitKV split;
};

struct ContiguousAttentionParams {
  QueryBatch query;
  ContiguousKVCache cache;
  const std::uint32_t* slot_idx = nullptr;  // [batch]: the cache slot of request b
  AttentionOptions options;
  SplitKV split;
};

// Bytes of workspace a launch with these sizes needs (0 when num_splits == 1).
std::size_t attention_workspace_bytes(std::uint32_t rows, std::uint32_t q_heads, std::uint32_t head_dim,
                                      std::uint32_t num_splits);

// A split count that gives about `waves` waves of CTAs on `num_sms` SMs while keeping
// each piece at least min_keys_per_split keys long (1 when the batch fills the GPU).
std::uint32_t choose_num_splits(std::uint32_t rows, std::uint32_t q_heads, std::uint32_t kv_heads,
                                std::uint32_t max_kv_len, std::uint32_t num_sms, std::uint32_t waves = 2,
                                std::uint32_t min_keys_per_split = 256);

// Host-side validation shared by the launchers and the references: raises kvmm::Error
// naming the first bad field and its value (head_dim not 64/128/256, q_heads not a
// multiple of kv_heads, a null or misaligned pointer, a page stride smaller than one
// layer's slice, a missing mask parameter, ...). Device contents are not read. `device`:
// a kernel launch, which also needs split.workspace when num_splits > 1.
void check_params(const PagedAttentionParams& p, bool prefill, bool device);
void check_params(const ContiguousAttentionParams& p, bool prefill, bool device);

// CUDA launchers (kvmm::cuda). Raise kvmm::Error on bad parameters or a failed launch.
void paged_decode_attention(const PagedAttentionParams& p, Stream stream);
void paged_prefill_attention(const PagedAttentionParams& p, Stream stream);
void contiguous_decode_attention(const ContiguousAttentionParams& p, Stream stream);
void contiguous_prefill_attention(const ContiguousAttentionParams& p, Stream stream);

namespace cpu {
// References on host memory (every pointer in p is a host pointer). They honour
// num_splits (pieces merged exactly as the kernels do) but need no workspace. They also
// check what the kernels cannot: kv_lens[b] <= max_ctx, q_len <= kv_len, page ids.
void paged_decode_attention(const PagedAttentionParams& p);
void paged_prefill_attention(const PagedAttentionParams& p);
void contiguous_decode_attention(const ContiguousAttentionParams& p);
void contiguous_prefill_attention(const ContiguousAttentionParams& p);
}  // namespace cpu

namespace detail {
// Raises kvmm::Error for a failed CUDA launch (kept out of the .cu files so that device
// code never includes fmt).
[[noreturn]] void launch_failed(const char* kernel, const char* cuda_error);
}  // namespace detail

}  // namespace kvmm::kernels
