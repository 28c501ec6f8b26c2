// Descriptors of one layer's KV cache as the kernels read it: the paged page-layer
// layout (K and V base pointers, explicit 64-bit page stride, page tables as CSR or
// dense) and the contiguous [slots, max_ctx, kv_heads, head_dim] layout with a slot
// index per batch row, each with the order of tokens and heads inside a page or slot
// (KVOrder). Plain structs of pointers and sizes; building one costs nothing.
#pragma once

#include "kvmm/kernels/dtype.hpp"
#include "kvmm/spec/kv_order.hpp"
#include "kvmm/types.hpp"

#include <cstdint>

namespace kvmm::kernels {

// A CUDA stream passed opaquely (a cudaStream_t cast to void*; nullptr = legacy default
// stream), so that these headers compile without CUDA.
using Stream = void*;

// The order of (token, kv head) inside a page or a contiguous slot: the spec layer's
// kvmm::KVOrder (kvmm/spec/kv_order.hpp says what each order costs), so a LayerGroup's
// kv_order goes into a cache descriptor as it is.
using kvmm::KVOrder;

// One layer of one layer group in the page-layer layout (Jenga Fig. 7b). Token t of
// small page p, kv head h starts at
//   k + p * page_stride_bytes + (t * kv_heads + h) * head_dim * dtype_bytes     (kTokenMajor)
//   k + p * page_stride_bytes + (h * tokens_per_page + t) * head_dim * dtype_bytes (kHeadMajor)
// (v likewise). With a KVLayout: k = arena + layout.k_offset(g, layer),
// v = arena + layout.v_offset(g, layer), page_stride_bytes = layout.small_page_bytes(g).
// The kernels need k, v and page_stride_bytes to be multiples of 16 bytes.
struct PagedKVCache {
  void* k = nullptr;
  void* v = nullptr;
  std::uint64_t page_stride_bytes = 0;
  std::uint32_t tokens_per_page = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  DType dtype = DType::kF16;
  KVOrder order = KVOrder::kTokenMajor;
};

// Page tables of a batch. CSR (indptr != nullptr): the pages of row b are
// pages[indptr[b] .. indptr[b+1]). Dense (indptr == nullptr): row b is
// pages[b * dense_stride ..]. A row may hold more pages than its tokens need
// (over-allocation is ignored); kNullPage entries are skipped (their tokens are masked).
struct PageTableView {
  const std::uint32_t* indptr = nullptr;
  const PageId* pages = nullptr;
  std::uint32_t dense_stride = 0;
};

// Virtual-tensor (non-paged) cache: K and V are [slots, max_ctx, kv_heads, head_dim]
// (kTokenMajor: the tokens of a slot are contiguous) or [slots, kv_heads, max_ctx,
// head_dim] (kHeadMajor: each head's tokens of a slot are contiguous); slot s starts at
// k + s * slot_stride_bytes.
struct ContiguousKVCache {
  void* k = nullptr;
  void* v = nullptr;
  std::uint64_t slot_stride_bytes = 0;
  std::uint32_t max_ctx = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  DType dtype = DType::kF16;
  KVOrder order = KVOrder::kTokenMajor;
};

// Bytes of one token's K (or V) row across all kv heads.
inline std::uint64_t token_row_bytes(std::uint32_t kv_heads, std::uint32_t head_dim, DType dtype) {
  return std::uint64_t{kv_heads} * head_dim * dtype_bytes(dtype);
}

}  // namespace kvmm::kernels
