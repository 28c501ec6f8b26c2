// Cache maintenance kernels: write_kv stores the K and V of new tokens into the paged
// page-layer layout (via a slot mapping: page id and offset per token) or into a
// contiguous virtual tensor (slot and position per token); copy_pages makes all
// copy-on-write copies of a step in one launch; swap_pages moves pages between device
// memory and pinned host memory in one launch. Each costs one pass over the bytes moved.
#pragma once

#include "kvmm/kernels/kv_cache.hpp"

#include <cstdint>

namespace kvmm::kernels {

// k_new, v_new: [num_tokens, kv_heads, head_dim] in the cache's dtype, 16-byte aligned.
// Token i goes to page page_ids[i], offset page_offsets[i] (< tokens_per_page); a token
// whose page is kNullPage is skipped (padding).
struct PagedWriteParams {
  PagedKVCache cache;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  const PageId* page_ids = nullptr;
  const std::uint32_t* page_offsets = nullptr;
  std::uint32_t num_tokens = 0;
};

// Token i goes to slot slot_idx[i], position positions[i] (< max_ctx).
struct ContiguousWriteParams {
  ContiguousKVCache cache;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  const std::uint32_t* slot_idx = nullptr;
  const std::uint32_t* positions = nullptr;
  std::uint32_t num_tokens = 0;
};

// Copy i moves page_bytes from src_base + src_pages[i] * src_page_stride to
// dst_base + dst_pages[i] * dst_page_stride. copy_pages: both in one arena (a small
// page's full size covers every layer of its group). swap_pages: one side is pinned host
// memory (cudaHostAlloc/cudaMallocHost, addressed through unified addressing). The id
// arrays must be readable by the device (device or pinned memory). Pages of one call
// must not overlap each other's destinations.
struct PageCopyParams {
  void* dst_base = nullptr;
  const void* src_base = nullptr;
  std::uint64_t dst_page_stride = 0;
  std::uint64_t src_page_stride = 0;
  std::uint64_t page_bytes = 0;
  const PageId* src_pages = nullptr;
  const PageId* dst_pages = nullptr;
  std::uint32_t num_pages = 0;
};

// Raise kvmm::Error naming the first bad field and its value.
void check_params(const PagedWriteParams& p);
void check_params(const ContiguousWriteParams& p);
void check_params(const PageCopyParams& p);

// CUDA launchers (kvmm::cuda); a call with nothing to do launches nothing.
void write_kv(const PagedWriteParams& p, Stream stream);
void write_kv(const ContiguousWriteParams& p, Stream stream);
void copy_pages(const PageCopyParams& p, Stream stream);
void swap_pages(const PageCopyParams& p, Stream stream);

namespace cpu {
// References on host memory; they also range-check the page offsets and positions the
// kernels trust.
void write_kv(const PagedWriteParams& p);
void write_kv(const ContiguousWriteParams& p);
void copy_pages(const PageCopyParams& p);
void swap_pages(const PageCopyParams& p);
}  // namespace cpu

}  // namespace kvmm::kernels
