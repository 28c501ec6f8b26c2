// The per-group TMA tensor map of the sm_90a prefill (issue 37 item 2): one 5-D map covers
// every layer, K and V, and every small page of a plain K/V layer group in kvmm's
// page-layer layout, so a kernel needs no per-layer maps and no tensormap.replace:
//   dims    {head_dim, kv_heads, tokens_per_page, 2 x layers, pages}   (innermost first)
//   strides {-, head_dim x e, row = kv_heads x head_dim x e, tokens_per_page x row,
//            small_page_bytes(g)}                                      (bytes)
//   box     {min(head_dim, 128 / e), 1, min(tokens_per_page, 64), 1, 1} under the 128-byte
//            swizzle: one head's 128-byte slice of up to 64 tokens of one page
// Layer l's K is coordinate 3 = 2 l, its V 2 l + 1 (KVLayout::k_offset / v_offset of a
// plain group), the page id coordinate 4. group_tensor_map_spec checks the layout is that
// regular and the spec within the driver's limits (check_tensor_map), raising kvmm::Error
// otherwise; group_map_coord gives a box's coordinates. Host code, O(1).
#pragma once

#include "hopper.cuh"
#include "kvmm/spec/kv_layout.hpp"

#include <algorithm>

namespace kvmm::kernels::device {

inline constexpr unsigned kTmaBoxTokens = 64;

// The coordinates of the box holding elements d0.. of `head` for tokens tok.. of `page`.
inline void group_map_coord(int (&c)[5], std::uint32_t d0, std::uint32_t head, std::uint32_t tok_in_page,
                            std::uint32_t layer, bool v, std::uint32_t page) {
  c[0] = static_cast<int>(d0);
  c[1] = static_cast<int>(head);
  c[2] = static_cast<int>(tok_in_page);
  c[3] = static_cast<int>(2 * layer + (v ? 1u : 0u));
  c[4] = static_cast<int>(page);
}

#if !defined(__CUDACC__)
// The map of group g over `num_pages` small pages starting at `arena` (small page s at
// arena + s x small_page_bytes(g)).
inline TensorMapSpec group_tensor_map_spec(const KVLayout& layout, GroupId g, const void* arena,
                                           std::uint64_t num_pages) {
  const LayerGroup& grp = layout.group(g);
  const std::uint64_t e = grp.dtype_bytes, row = std::uint64_t{grp.kv_heads} * grp.head_dim * e;
  const std::uint64_t slab = std::uint64_t{grp.tokens_per_page} * row;  // one layer's K (or V) in a page
  // The regular page-layer layout: K of layer l at 2 l slabs, its V one slab further.
  for (std::uint32_t l = 0; l < grp.num_layers; ++l)
    if (layout.k_offset(g, l) != 2 * l * slab || layout.v_offset(g, l) != (2 * l + 1) * slab)
      fail("group = {} ('{}'): layer {}'s K/V are not at {} / {} bytes: not a plain page-layer group", g, grp.name, l,
           2 * l * slab, (2 * l + 1) * slab);
  if (num_pages == 0) fail("num_pages = 0: a tensor map needs at least one page");
  TensorMapSpec s;
  s.base = arena;
  s.rank = 5;
  const std::uint64_t dims[5] = {grp.head_dim, grp.kv_heads, grp.tokens_per_page, 2ull * grp.num_layers, num_pages};
  const std::uint64_t strides[5] = {0, grp.head_dim * e, row, slab, layout.small_page_bytes(g)};
  const unsigned box[5] = {static_cast<unsigned>(std::min<std::uint64_t>(grp.head_dim, 128 / e)), 1,
                           std::min(grp.tokens_per_page, kTmaBoxTokens), 1, 1};
  for (int d = 0; d < 5; ++d) {
    s.dims[d] = dims[d];
    s.strides[d] = strides[d];
    s.box[d] = box[d];
  }
  s.elem_bytes = static_cast<unsigned>(e);
  s.swizzle128 = true;
  check_tensor_map(s);
  return s;
}
#endif

}  // namespace kvmm::kernels::device
