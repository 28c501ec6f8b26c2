// Byte addressing of K/V token rows, written once and shared by the CUDA kernels
// (kernels/attention.cuh, kernels/cache_ops.cuh, the tensor-core kernels) and their CPU
// references (src/kernels/*_ref.cpp): the two strides of a cache's order (KVOrder: bytes
// from one token to the next of a head, and from one kv head to the next), where the row
// of (token, kv head 0) lies in a page-layer layout (page id x page stride + row in page x
// token stride; -1 for a null page) or in a contiguous cache (slot x slot stride +
// position x token stride); kv head h is head stride x h further. All O(1), host and
// device (no CUDA headers needed).
#pragma once

#include "kvmm/kernels/kv_cache.hpp"
#include "kvmm/kernels/mask.hpp"  // KVMM_HOST_DEVICE

#include <cstdint>

namespace kvmm::kernels {

// The page id of a null page (kvmm::kNullPage): no storage, its tokens are skipped.
inline constexpr std::uint32_t kNullPageId = 0xffffffffu;

// The byte strides of a cache's order: K(token t, head h) = token row offset + h x head,
// where the token row offset steps by `token` per token (in a page, or a slot).
//   kTokenMajor: token = kv_heads x head_dim x e, head = head_dim x e.
//   kHeadMajor:  token = head_dim x e, head = tokens x head_dim x e, with tokens =
//                tokens_per_page (paged) or max_ctx (contiguous).
// Any other order value gives {0, 0} (check_params refuses it first).
struct KVStrides {
  std::uint64_t token;
  std::uint64_t head;
};
KVMM_HOST_DEVICE KVStrides kv_strides(KVOrder order, std::uint32_t tokens, std::uint32_t kv_heads,
                                      std::uint32_t head_dim, std::uint32_t elem_bytes) {
  const std::uint64_t head_row = std::uint64_t{head_dim} * elem_bytes;
  if (order == KVOrder::kTokenMajor) return KVStrides{kv_heads * head_row, head_row};
  if (order == KVOrder::kHeadMajor) return KVStrides{head_row, tokens * head_row};
  return KVStrides{0, 0};
}
inline KVStrides kv_strides(const PagedKVCache& c) {
  return kv_strides(c.order, c.tokens_per_page, c.kv_heads, c.head_dim, dtype_bytes(c.dtype));
}
inline KVStrides kv_strides(const ContiguousKVCache& c) {
  return kv_strides(c.order, c.max_ctx, c.kv_heads, c.head_dim, dtype_bytes(c.dtype));
}

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
