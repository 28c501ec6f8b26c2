// Host-side parameter validation shared by the CUDA launchers and the CPU references,
// plus the split-KV sizing helpers.
#include "kvmm/error.hpp"
#include "kvmm/kernels/addressing.hpp"
#include "kvmm/kernels/attention.hpp"
#include "kvmm/kernels/cache_ops.hpp"

#include <algorithm>
#include <cmath>

namespace kvmm::kernels {
namespace {

constexpr std::uint32_t kMaxSplits = 1024;

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

void check_pointer(const void* p, const char* name, bool need_align) {
  if (p == nullptr) fail("{} = nullptr: must point to memory", name);
  if (need_align && !aligned16(p)) fail("{} = {}: must be 16-byte aligned", name, p);
}

void check_dtype(DType t, const char* name) {
  if (t != DType::kF16 && t != DType::kBF16) fail("{} = {}: not a DType", name, static_cast<int>(t));
}

void check_heads(std::uint32_t kv_heads, std::uint32_t head_dim, const char* prefix) {
  if (kv_heads == 0) fail("{}.kv_heads = 0: must be >= 1", prefix);
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    fail("{}.head_dim = {}: kernels support 64, 128 and 256", prefix, head_dim);
}

void check_order(KVOrder o, const char* prefix) {
  if (o != KVOrder::kTokenMajor && o != KVOrder::kHeadMajor)
    fail("{}.order = {}: not a KVOrder (0 token-major, 1 head-major)", prefix, static_cast<int>(o));
}

// The kernels hold a head's offset stride in 32 bits (h x stride in 64): head-major pages
// or slots of 2^32 bytes per head and more are refused.
void check_head_stride(KVStrides s, const char* prefix, const char* tokens, std::uint32_t n) {
  if (s.head >= (std::uint64_t{1} << 32))
    fail("{}.{} = {}: a head-major head of {} bytes; the kernels take < 2^32", prefix, tokens, n, s.head);
}

void check_cache(const PagedKVCache& c, const char* prefix) {
  check_dtype(c.dtype, "cache.dtype");
  check_order(c.order, prefix);
  check_head_stride(kv_strides(c), prefix, "tokens_per_page", c.tokens_per_page);
  check_heads(c.kv_heads, c.head_dim, prefix);
  if (c.tokens_per_page == 0) fail("{}.tokens_per_page = 0: must be >= 1", prefix);
  check_pointer(c.k, "cache.k", true);
  check_pointer(c.v, "cache.v", true);
  const std::uint64_t slice = c.tokens_per_page * token_row_bytes(c.kv_heads, c.head_dim, c.dtype);
  if (c.page_stride_bytes < slice)
    fail("{}.page_stride_bytes = {}: smaller than one layer's K slice ({} bytes)", prefix, c.page_stride_bytes, slice);
  if (c.page_stride_bytes % 16 != 0)
    fail("{}.page_stride_bytes = {}: must be a multiple of 16", prefix, c.page_stride_bytes);
}

void check_cache(const ContiguousKVCache& c, const char* prefix) {
  check_dtype(c.dtype, "cache.dtype");
  check_heads(c.kv_heads, c.head_dim, prefix);
  check_order(c.order, prefix);
  check_head_stride(kv_strides(c), prefix, "max_ctx", c.max_ctx);
  if (c.max_ctx == 0) fail("{}.max_ctx = 0: must be >= 1", prefix);
  check_pointer(c.k, "cache.k", true);
  check_pointer(c.v, "cache.v", true);
  const std::uint64_t slot = c.max_ctx * token_row_bytes(c.kv_heads, c.head_dim, c.dtype);
  if (c.slot_stride_bytes < slot)
    fail("{}.slot_stride_bytes = {}: smaller than max_ctx tokens ({} bytes)", prefix, c.slot_stride_bytes, slot);
  if (c.slot_stride_bytes % 16 != 0)
    fail("{}.slot_stride_bytes = {}: must be a multiple of 16", prefix, c.slot_stride_bytes);
}

void check_common(const QueryBatch& q, std::uint32_t kv_heads, const AttentionOptions& o, const SplitKV& s,
                  bool prefill, bool device) {
  if (q.q_heads == 0 || q.q_heads % kv_heads != 0)
    fail("query.q_heads = {}: must be a positive multiple of cache.kv_heads ({})", q.q_heads, kv_heads);
  if (q.rows > 0) {
    check_pointer(q.q, "query.q", true);
    check_pointer(q.o, "query.o", true);
    check_pointer(q.kv_lens, "query.kv_lens", false);
  }
  if (prefill) {
    check_pointer(q.q_indptr, "query.q_indptr", false);
  } else {
    if (q.q_indptr != nullptr)
      fail("query.q_indptr = {}: decode takes one token per request, pass nullptr",
           static_cast<const void*>(q.q_indptr));
    if (q.rows != q.batch) fail("query.rows = {}: decode needs rows == batch ({})", q.rows, q.batch);
  }
  if (o.mask != MaskKind::kCausal && o.mask != MaskKind::kSlidingWindow && o.mask != MaskKind::kChunkedLocal)
    fail("options.mask = {}: not a MaskKind", static_cast<int>(o.mask));
  if (o.mask == MaskKind::kSlidingWindow && o.window == 0) fail("options.window = 0: a sliding window needs >= 1");
  if (o.mask == MaskKind::kChunkedLocal && o.chunk == 0) fail("options.chunk = 0: chunked local needs >= 1");
  if (!(o.scale >= 0.0f) || !std::isfinite(o.scale)) fail("options.scale = {}: must be finite and >= 0", o.scale);
  if (!(o.soft_cap >= 0.0f) || !std::isfinite(o.soft_cap))
    fail("options.soft_cap = {}: must be finite and >= 0", o.soft_cap);
  if (s.num_splits == 0 || s.num_splits > kMaxSplits)
    fail("split.num_splits = {}: must be in [1, {}]", s.num_splits, kMaxSplits);
  if (device && s.num_splits > 1 && q.rows > 0) check_pointer(s.workspace, "split.workspace", true);
}

}  // namespace

std::size_t attention_workspace_bytes(std::uint32_t rows, std::uint32_t q_heads, std::uint32_t head_dim,
                                      std::uint32_t num_splits) {
  if (num_splits <= 1) return 0;
  const std::size_t parts = std::size_t{rows} * q_heads * num_splits;
  const std::size_t out = parts * head_dim * sizeof(float);
  return out + parts * sizeof(float);  // partial outputs, then their log-sum-exps
}

std::uint32_t choose_num_splits(std::uint32_t rows, std::uint32_t q_heads, std::uint32_t kv_heads,
                                std::uint32_t max_kv_len, std::uint32_t num_sms, std::uint32_t waves,
                                std::uint32_t min_keys_per_split) {
  if (kv_heads == 0 || q_heads % kv_heads != 0)
    fail("q_heads = {}: must be a multiple of kv_heads ({})", q_heads, kv_heads);
  const std::uint64_t group = q_heads / kv_heads;
  const std::uint64_t ctas = std::uint64_t{rows} * kv_heads * (group <= 4 ? 1 : (group + 7) / 8);
  const std::uint64_t target = std::uint64_t{num_sms} * std::max<std::uint32_t>(waves, 1);
  if (ctas == 0 || ctas >= target) return 1;
  std::uint64_t splits = (target + ctas - 1) / ctas;
  const std::uint64_t by_len = std::max<std::uint64_t>(1, max_kv_len / std::max<std::uint32_t>(min_keys_per_split, 1));
  splits = std::min({splits, by_len, std::uint64_t{kMaxSplits}});
  return static_cast<std::uint32_t>(std::max<std::uint64_t>(splits, 1));
}

void check_params(const PagedAttentionParams& p, bool prefill, bool device) {
  check_cache(p.cache, "cache");
  check_common(p.query, p.cache.kv_heads, p.options, p.split, prefill, device);
  if (p.query.rows > 0) check_pointer(p.table.pages, "table.pages", false);
  if (p.table.indptr == nullptr && p.table.dense_stride == 0)
    fail("table.dense_stride = 0: a dense table (indptr == nullptr) needs its row length");
}

void check_params(const ContiguousAttentionParams& p, bool prefill, bool device) {
  check_cache(p.cache, "cache");
  check_common(p.query, p.cache.kv_heads, p.options, p.split, prefill, device);
  if (p.query.rows > 0) check_pointer(p.slot_idx, "slot_idx", false);
}

void check_params(const PagedWriteParams& p) {
  check_cache(p.cache, "cache");
  if (p.num_tokens == 0) return;
  check_pointer(p.k_new, "k_new", true);
  check_pointer(p.v_new, "v_new", true);
  check_pointer(p.page_ids, "page_ids", false);
  check_pointer(p.page_offsets, "page_offsets", false);
}

void check_params(const ContiguousWriteParams& p) {
  check_cache(p.cache, "cache");
  if (p.num_tokens == 0) return;
  check_pointer(p.k_new, "k_new", true);
  check_pointer(p.v_new, "v_new", true);
  check_pointer(p.slot_idx, "slot_idx", false);
  check_pointer(p.positions, "positions", false);
}

void check_params(const PageCopyParams& p) {
  if (p.num_pages == 0 || p.page_bytes == 0) return;
  check_pointer(p.dst_base, "dst_base", false);
  check_pointer(p.src_base, "src_base", false);
  check_pointer(p.src_pages, "src_pages", false);
  check_pointer(p.dst_pages, "dst_pages", false);
  if (p.page_bytes > p.src_page_stride)
    fail("page_bytes = {}: larger than src_page_stride ({})", p.page_bytes, p.src_page_stride);
  if (p.page_bytes > p.dst_page_stride)
    fail("page_bytes = {}: larger than dst_page_stride ({})", p.page_bytes, p.dst_page_stride);
}

namespace detail {
void launch_failed(const char* kernel, const char* cuda_error) {
  fail("{}: CUDA launch failed: {}", kernel, cuda_error);
}
}  // namespace detail

}  // namespace kvmm::kernels
