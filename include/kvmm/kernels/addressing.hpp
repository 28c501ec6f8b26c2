// Byte addressing of K/V token rows, written once and shared by the CUDA kernels
// (kernels/attention.cuh, kernels/cache_ops.cuh) and their CPU references
// (src/kernels/*_ref.cpp): where the row of (token, kv head 0) lies in a page-layer
// layout (page id x page stride + row in page x row bytes; -1 for a null page) or in a
// contiguous cache (slot x slot stride + position x row bytes). All O(1), host and
// device (no CUDA headers needed).
#pragma once

#include "kvmm/kernels/mask.hpp"  // KVMM_HOST_DEVICE

#include <cstdint>

namespace kvmm::kernels {

// The page id of a null page (kvmm::kNullPage): no storage, its tokens are skipped.
inline constexpr std::uint32_t kNullPageId = 0xffffffffu;

// Entry of a request's page-table row that holds token `tok`.
KVMM_HOST_DEVICE std::uint32_t page_of_token(std::uint32_t tok, std::uint32_t tokens_per_page) {
  return tok / tokens_per_page;
}

// Byte offset of row `row_in_page` of page `page`, or -1 for a null page.
KVMM_HOST_DEVICE std::int64_t page_row_offset(std::uint32_t page, std::uint32_t row_in_page, std::uint64_t page_stride,
                                              std::uint64_t row_bytes) {
  if (page == kNullPageId) return -1;
  return static_cast<std::int64_t>(page * page_stride + std::uint64_t{row_in_page} * row_bytes);
}

// Byte offset of token `tok` of a request whose page for it is `page`, or -1 (null page).
KVMM_HOST_DEVICE std::int64_t paged_token_offset(std::uint32_t page, std::uint32_t tok, std::uint32_t tokens_per_page,
                                                 std::uint64_t page_stride, std::uint64_t row_bytes) {
  return page_row_offset(page, tok % tokens_per_page, page_stride, row_bytes);
}

// Byte offset of position `pos` of contiguous slot `slot`.
KVMM_HOST_DEVICE std::int64_t slot_row_offset(std::uint64_t slot, std::uint64_t slot_stride, std::uint32_t pos,
                                              std::uint64_t row_bytes) {
  return static_cast<std::int64_t>(slot * slot_stride + std::uint64_t{pos} * row_bytes);
}

}  // namespace kvmm::kernels
