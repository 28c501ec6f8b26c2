// Launchers of the contiguous (virtual tensor) decode and prefill attention over
// [slots, max_ctx, kv_heads, head_dim] (or [slots, kv_heads, max_ctx, head_dim]: KVOrder)
// with a slot index per request.
#include "attention_dispatch.cuh"

namespace kvmm::kernels {
namespace {

void contiguous(const ContiguousAttentionParams& p, bool prefill, Stream stream, const char* name) {
  check_params(p, prefill, true);
  device::launch_attention(p.query, p.options, p.split, p.cache.kv_heads, p.cache.head_dim, p.cache.dtype,
                           device::contiguous_addr(p), stream, name);
}

}  // namespace

void contiguous_decode_attention(const ContiguousAttentionParams& p, Stream stream) {
  contiguous(p, false, stream, "contiguous_decode_attention");
}
void contiguous_prefill_attention(const ContiguousAttentionParams& p, Stream stream) {
  contiguous(p, true, stream, "contiguous_prefill_attention");
}

}  // namespace kvmm::kernels
