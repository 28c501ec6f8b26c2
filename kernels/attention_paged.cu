// Launchers of the paged decode and prefill attention (page-layer layout, CSR or dense
// page tables, null pages skipped).
#include "attention_dispatch.cuh"

namespace kvmm::kernels {
namespace {

void paged(const PagedAttentionParams& p, bool prefill, Stream stream, const char* name) {
  check_params(p, prefill, true);
  device::launch_attention(p.query, p.options, p.split, p.cache.kv_heads, p.cache.head_dim, p.cache.dtype,
                           device::paged_addr(p), stream, name);
}

}  // namespace

void paged_decode_attention(const PagedAttentionParams& p, Stream stream) {
  paged(p, false, stream, "paged_decode_attention");
}
void paged_prefill_attention(const PagedAttentionParams& p, Stream stream) {
  paged(p, true, stream, "paged_prefill_attention");
}

}  // namespace kvmm::kernels
