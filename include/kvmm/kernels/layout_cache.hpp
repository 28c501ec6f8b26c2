// The kernels' cache descriptor of one layer of one layer group, read off a planned
// KVLayout: paged_cache(layout, arena, g, layer) is the PagedKVCache an engine otherwise
// fills by hand (K and V bases at the layer's offsets in the arena, the group's small page
// as the stride, its tokens per page, heads, head size, element type and kv_order). O(1);
// host only (it reads the layout), the result is a plain struct to pass to the kernels.
#pragma once

#include "kvmm/kernels/kv_cache.hpp"
#include "kvmm/spec/kv_layout.hpp"
#include "kvmm/types.hpp"

#include <cstddef>
#include <cstdint>

namespace kvmm::kernels {

// Layer `layer` (page slot, as KVLayout::k_offset) of group `g`: k = arena + k_offset(g,
// layer), v = arena + v_offset(g, layer), page_stride_bytes = small_page_bytes(g), order =
// group(g).kv_order. dtype: a group with fp16 (bf16) K and V formats gives kF16 (kBF16); a
// plain group of dtype_bytes 2 (whose element type kvmm is not told) gives `plain_dtype`.
// kvmm::Error naming the argument and its value for: a group or layer out of range, a null
// arena, a group without K and V (state, vision embedding, MLA latent, indexer) or whose
// elements the paged kernels do not read (not 2 bytes, quantized, K and V apart).
PagedKVCache paged_cache(const KVLayout& layout, std::byte* arena, GroupId g, std::uint32_t layer,
                         DType plain_dtype = DType::kF16);

}  // namespace kvmm::kernels
