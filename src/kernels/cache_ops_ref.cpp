// CPU references of write_kv, copy_pages and swap_pages: byte copies on host memory
// (write_kv: a token's [kv_heads][head_dim] row copied head by head to its cache order's
// positions, kv_strides).
#include "kvmm/error.hpp"
#include "kvmm/kernels/addressing.hpp"
#include "kvmm/kernels/cache_ops.hpp"

#include <cstring>

namespace kvmm::kernels::cpu {

namespace {

// Token i's K and V rows (row bytes each, kv_heads parts of head_bytes) to offset dst of
// the cache, head h at dst + h x head_stride.
template <class Cache>
void put_row(const Cache& c, const void* k_new, const void* v_new, std::uint32_t i, std::uint64_t dst) {
  const std::uint64_t row = token_row_bytes(c.kv_heads, c.head_dim, c.dtype);
  const std::uint64_t head_bytes = std::uint64_t{c.head_dim} * dtype_bytes(c.dtype), stride = kv_strides(c).head;
  for (std::uint32_t h = 0; h < c.kv_heads; ++h) {
    std::memcpy(static_cast<char*>(c.k) + dst + h * stride, static_cast<const char*>(k_new) + i * row + h * head_bytes,
                head_bytes);
    std::memcpy(static_cast<char*>(c.v) + dst + h * stride, static_cast<const char*>(v_new) + i * row + h * head_bytes,
                head_bytes);
  }
}

}  // namespace

void write_kv(const PagedWriteParams& p) {
  check_params(p);
  const std::uint64_t token = kv_strides(p.cache).token;
  for (std::uint32_t i = 0; i < p.num_tokens; ++i) {
    if (p.page_ids[i] == kNullPage) continue;
    if (p.page_offsets[i] >= p.cache.tokens_per_page)
      fail("page_offsets[{}] = {}: must be < tokens_per_page ({})", i, p.page_offsets[i], p.cache.tokens_per_page);
  }
  for (std::uint32_t i = 0; i < p.num_tokens; ++i) {
    const std::int64_t off = page_row_offset(p.page_ids[i], p.page_offsets[i], p.cache.page_stride_bytes, token);
    if (off < 0) continue;  // null page
    put_row(p.cache, p.k_new, p.v_new, i, static_cast<std::uint64_t>(off));
  }
}

void write_kv(const ContiguousWriteParams& p) {
  check_params(p);
  const std::uint64_t token = kv_strides(p.cache).token;
  for (std::uint32_t i = 0; i < p.num_tokens; ++i)
    if (p.positions[i] >= p.cache.max_ctx)
      fail("positions[{}] = {}: must be < max_ctx ({})", i, p.positions[i], p.cache.max_ctx);
  for (std::uint32_t i = 0; i < p.num_tokens; ++i) {
    put_row(
        p.cache, p.k_new, p.v_new, i,
        static_cast<std::uint64_t>(slot_row_offset(p.slot_idx[i], p.cache.slot_stride_bytes, p.positions[i], token)));
  }
}

void copy_pages(const PageCopyParams& p) {
  check_params(p);
  if (p.page_bytes == 0) return;
  for (std::uint32_t i = 0; i < p.num_pages; ++i)
    std::memmove(static_cast<char*>(p.dst_base) + p.dst_pages[i] * p.dst_page_stride,
                 static_cast<const char*>(p.src_base) + p.src_pages[i] * p.src_page_stride, p.page_bytes);
}

void swap_pages(const PageCopyParams& p) { copy_pages(p); }

}  // namespace kvmm::kernels::cpu
