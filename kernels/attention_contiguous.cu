// Launchers of the contiguous (virtual tensor) decode and prefill attention over
// [slots, max_ctx, kv_heads, head_dim] with a slot index per request.
#include "attention_dispatch.cuh"

namespace kvmm::kernels {
namespace {

void contiguous(const ContiguousAttentionParams& p, bool prefill, Stream stream, const char* name) {
  check_params(p, prefill, true);
  const device::ContiguousAddr kv{
      static_cast<const char*>(p.cache.k), static_cast<const char*>(p.cache.v), p.cache.slot_stride_bytes,
      static_cast<std::uint32_t>(token_row_bytes(p.cache.kv_heads, p.cache.head_dim, p.cache.dtype)), p.slot_idx};
  device::launch_attention(p.query, p.options, p.split, p.cache.kv_heads, p.cache.head_dim, p.cache.dtype, kv, stream,
                           name);
}

}  // namespace

void contiguous_decode_attention(const ContiguousAttentionParams& p, Stream stream) {
  contiguous(p, false, stream, "contiguous_decode_attention");
}
void contiguous_prefill_attention(const ContiguousAttentionParams& p, Stream stream) {
  contiguous(p, true, stream, "contiguous_prefill_attention");
}

}  // namespace kvmm::kernels
