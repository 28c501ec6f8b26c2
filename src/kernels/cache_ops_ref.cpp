// CPU references of write_kv, copy_pages and swap_pages: byte copies on host memory.
#include "kvmm/error.hpp"
#include "kvmm/kernels/addressing.hpp"
#include "kvmm/kernels/cache_ops.hpp"

#include <cstring>

namespace kvmm::kernels::cpu {

void write_kv(const PagedWriteParams& p) {
  check_params(p);
  const std::uint64_t row = token_row_bytes(p.cache.kv_heads, p.cache.head_dim, p.cache.dtype);
  for (std::uint32_t i = 0; i < p.num_tokens; ++i) {
    if (p.page_ids[i] == kNullPage) continue;
    if (p.page_offsets[i] >= p.cache.tokens_per_page)
      fail("page_offsets[{}] = {}: must be < tokens_per_page ({})", i, p.page_offsets[i], p.cache.tokens_per_page);
  }
  for (std::uint32_t i = 0; i < p.num_tokens; ++i) {
    const std::int64_t off = page_row_offset(p.page_ids[i], p.page_offsets[i], p.cache.page_stride_bytes, row);
    if (off < 0) continue;  // null page
    const auto dst = static_cast<std::uint64_t>(off);
    std::memcpy(static_cast<char*>(p.cache.k) + dst, static_cast<const char*>(p.k_new) + i * row, row);
    std::memcpy(static_cast<char*>(p.cache.v) + dst, static_cast<const char*>(p.v_new) + i * row, row);
  }
}

void write_kv(const ContiguousWriteParams& p) {
  check_params(p);
  const std::uint64_t row = token_row_bytes(p.cache.kv_heads, p.cache.head_dim, p.cache.dtype);
  for (std::uint32_t i = 0; i < p.num_tokens; ++i)
    if (p.positions[i] >= p.cache.max_ctx)
      fail("positions[{}] = {}: must be < max_ctx ({})", i, p.positions[i], p.cache.max_ctx);
  for (std::uint32_t i = 0; i < p.num_tokens; ++i) {
    const auto dst =
        static_cast<std::uint64_t>(slot_row_offset(p.slot_idx[i], p.cache.slot_stride_bytes, p.positions[i], row));
    std::memcpy(static_cast<char*>(p.cache.k) + dst, static_cast<const char*>(p.k_new) + i * row, row);
    std::memcpy(static_cast<char*>(p.cache.v) + dst, static_cast<const char*>(p.v_new) + i * row, row);
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
