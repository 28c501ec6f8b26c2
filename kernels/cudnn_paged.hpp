// The tensors cuDNN's paged scaled-dot-product attention (cuDNN >= 9.5, the SDPA forward
// operation with K/V page tables) would read for one layer of a kvmm layer group, in
// kvmm's page-layer layout (issue 37 item 3, host part). cuDNN takes the paged K and V as
// "containers" of dims [pages, kv_heads, page_size, head_dim] with arbitrary element
// strides, and a dense int32 page table [batch, 1, pages per sequence, 1]; kvmm's layout
// gives, for layer l of a plain group g,
//   K container at arena + k_offset(g, l), V at arena + v_offset(g, l),
//   strides {small_page_bytes(g) / e, head_dim, kv_heads x head_dim, 1} elements
// and its dense page-table export (PageTableSet::export_dense) is the page table, with
// kvmm::kNullPage (-1 as int32) only in pages no query sees. cudnn_paged_kv checks what
// cuDNN needs of these (2-byte elements, head_dim <= 256, an element-aligned page stride,
// page ids and strides within int32 / int64) and raises kvmm::Error naming the value
// otherwise. cudnn_container_strides gives the same strides from a kernel's PagedKVCache
// (any page stride), and those of the head-major packed container cuDNN's own samples use;
// cudnn_prefill_index turns kvmm's q_indptr / kv_lens into the int32 sequence lengths and
// ragged Q/O offsets the graph reads. The graph itself: kernels/cudnn_prefill.hpp.
// Host code, O(layers) / O(batch).
#pragma once

#include "kvmm/error.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kvmm::kernels {

struct CudnnPagedTensor {
  std::uint64_t offset = 0;      // bytes from the arena base (small page 0)
  std::int64_t dims[4] = {};     // pages, kv_heads, page_size, head_dim
  std::int64_t strides[4] = {};  // elements
};

struct CudnnPagedKV {
  CudnnPagedTensor k, v;
  std::int64_t page_table_dims[4] = {};  // batch, 1, pages per sequence, 1 (int32, dense)
};

inline CudnnPagedKV cudnn_paged_kv(const KVLayout& layout, GroupId g, std::uint32_t layer, std::uint64_t num_pages,
                                   std::uint32_t batch, std::uint32_t pages_per_seq) {
  const LayerGroup& grp = layout.group(g);
  const std::uint64_t e = grp.dtype_bytes, row = std::uint64_t{grp.kv_heads} * grp.head_dim * e;
  const std::uint64_t slab = std::uint64_t{grp.tokens_per_page} * row;
  const std::uint64_t k_off = layout.k_offset(g, layer), v_off = layout.v_offset(g, layer);
  if (v_off != k_off + slab)
    fail("group = {} ('{}'): layer {}'s V is not the {} bytes after its K: not a plain page-layer group", g, grp.name,
         layer, slab);
  if (e != 2) fail("group = {} ('{}'): dtype_bytes = {}: cuDNN's paged SDPA takes fp16/bf16", g, grp.name, e);
  if (grp.head_dim > 256)
    fail("group = {} ('{}'): head_dim = {}: cuDNN's SDPA takes <= 256", g, grp.name, grp.head_dim);
  const std::uint64_t page_bytes = layout.small_page_bytes(g);
  if (page_bytes % e != 0) fail("small_page_bytes = {}: not a whole number of {}-byte elements", page_bytes, e);
  if (num_pages == 0 || num_pages > 0x7fffffffu)
    fail("num_pages = {}: cuDNN's int32 page table holds ids 0 .. 2^31 - 2", num_pages);
  if (batch == 0 || pages_per_seq == 0) fail("batch = {}, pages_per_seq = {}: both must be >= 1", batch, pages_per_seq);
  CudnnPagedKV out;
  const std::int64_t dims[4] = {static_cast<std::int64_t>(num_pages), grp.kv_heads, grp.tokens_per_page, grp.head_dim};
  const std::int64_t strides[4] = {static_cast<std::int64_t>(page_bytes / e), grp.head_dim,
                                   static_cast<std::int64_t>(grp.kv_heads) * grp.head_dim, 1};
  for (int i = 0; i < 4; ++i) {
    out.k.dims[i] = out.v.dims[i] = dims[i];
    out.k.strides[i] = out.v.strides[i] = strides[i];
  }
  out.k.offset = k_off;
  out.v.offset = v_off;
  out.page_table_dims[0] = batch;
  out.page_table_dims[1] = 1;
  out.page_table_dims[2] = pages_per_seq;
  out.page_table_dims[3] = 1;
  return out;
}

// How the K (or V) container is laid out in memory for cuDNN: kvmm's page-layer arena as
// it is (token-major inside a page, pages page_stride bytes apart), or the head-major packed
// container of cuDNN's samples ([pages, kv_heads, tokens, head_dim], no gaps).
enum class CudnnKVLayout : std::uint8_t { kPageLayer, kHeadMajor };

// Element strides of a [pages, kv_heads, page_size, head_dim] container of e-byte elements.
inline void cudnn_container_strides(CudnnKVLayout layout, std::uint64_t page_stride_bytes, std::uint32_t kv_heads,
                                    std::uint32_t tokens_per_page, std::uint32_t head_dim, std::uint32_t e,
                                    std::int64_t (&strides)[4]) {
  if (e == 0) fail("dtype bytes = 0");
  const std::int64_t hd = head_dim, tok = std::int64_t{kv_heads} * head_dim;
  if (layout == CudnnKVLayout::kPageLayer) {
    if (page_stride_bytes % e != 0)
      fail("page_stride = {} bytes: not a whole number of {}-byte elements", page_stride_bytes, e);
    if (page_stride_bytes / e < std::uint64_t(tok) * tokens_per_page)
      fail("page_stride = {} bytes: smaller than a page's {} tokens of {} bytes", page_stride_bytes, tokens_per_page,
           tok * e);
    strides[0] = static_cast<std::int64_t>(page_stride_bytes / e);
    strides[1] = hd;
    strides[2] = tok;
  } else {
    strides[0] = tok * tokens_per_page;
    strides[1] = std::int64_t{tokens_per_page} * hd;
    strides[2] = hd;
  }
  strides[3] = 1;
}

// The int32 index arrays of cuDNN's padded / ragged SDPA from kvmm's query batch: per
// request its chunk length (q_indptr[b+1] - q_indptr[b]) and context length (kv_lens[b],
// chunk included), and q_offsets[b] = q_indptr[b] x q_heads x head_dim, the element offset
// of request b's first row in kvmm's packed [rows, q_heads, head_dim] Q and O.
struct CudnnPrefillIndex {
  std::vector<std::int32_t> seq_len_q, seq_len_kv, q_offsets;
  std::uint32_t max_q_len = 0, max_kv_len = 0;
};

inline CudnnPrefillIndex cudnn_prefill_index(const std::vector<std::uint32_t>& q_indptr,
                                             const std::vector<std::uint32_t>& kv_lens, std::uint32_t q_heads,
                                             std::uint32_t head_dim) {
  if (q_indptr.size() != kv_lens.size() + 1)
    fail("q_indptr.size() = {}: must be kv_lens.size() + 1 = {}", q_indptr.size(), kv_lens.size() + 1);
  if (q_indptr.empty() || q_indptr[0] != 0) fail("q_indptr[0] must be 0");
  CudnnPrefillIndex x;
  const std::uint64_t row = std::uint64_t{q_heads} * head_dim;
  for (std::size_t b = 0; b < kv_lens.size(); ++b) {
    if (q_indptr[b + 1] < q_indptr[b])
      fail("q_indptr[{}] = {} < q_indptr[{}] = {}", b + 1, q_indptr[b + 1], b, q_indptr[b]);
    const std::uint32_t q_len = q_indptr[b + 1] - q_indptr[b];
    if (q_len > kv_lens[b])
      fail("request {}: chunk of {} tokens longer than its context kv_lens = {}", b, q_len, kv_lens[b]);
    if (kv_lens[b] > 0x7fffffffu) fail("kv_lens[{}] = {}: over int32", b, kv_lens[b]);
    x.seq_len_q.push_back(static_cast<std::int32_t>(q_len));
    x.seq_len_kv.push_back(static_cast<std::int32_t>(kv_lens[b]));
    x.max_q_len = std::max(x.max_q_len, q_len);
    x.max_kv_len = std::max(x.max_kv_len, kv_lens[b]);
  }
  for (const std::uint32_t start : q_indptr) {
    const std::uint64_t off = start * row;
    if (off > 0x7fffffffu) fail("q_offsets: {} rows x {} elements = {}: over int32", start, row, off);
    x.q_offsets.push_back(static_cast<std::int32_t>(off));
  }
  return x;
}

}  // namespace kvmm::kernels
