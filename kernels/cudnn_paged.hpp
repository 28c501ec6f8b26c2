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
// otherwise. Building the cuDNN graph itself is GPU-side work not done yet. Host code, O(layers).
#pragma once

#include "kvmm/error.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <cstdint>

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

}  // namespace kvmm::kernels
