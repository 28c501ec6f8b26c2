#include "kvmm/kernels/layout_cache.hpp"

#include "kvmm/error.hpp"

namespace kvmm::kernels {

namespace {

// The kernels' element type of a group's K and V, or a kvmm::Error naming the group.
DType kernel_dtype(const LayerGroup& grp, GroupId g, DType plain_dtype) {
  if (grp.is_plain()) {
    if (grp.dtype_bytes != 2)
      fail("group = {} ('{}'): dtype_bytes = {}: the paged kernels read 2-byte (fp16, bf16) K and V", g, grp.name,
           grp.dtype_bytes);
    return plain_dtype;
  }
  if (grp.storage != KvStorage::kKeyValue)
    fail("group = {} ('{}'): storage {}: the paged kernels read separate K and V", g, grp.name, to_string(grp.storage));
  const ElementFormat k = grp.k_element();
  const ElementFormat v = grp.v_element();
  if (k == v && k == ElementFormat::of(ElementType::kFp16)) return DType::kF16;
  if (k == v && k == ElementFormat::of(ElementType::kBf16)) return DType::kBF16;
  fail("group = {} ('{}'): K {} / V {}: the paged kernels read unscaled fp16 or bf16 K and V alike", g, grp.name,
       k.describe(), v.describe());
}

}  // namespace

PagedKVCache paged_cache(const KVLayout& layout, std::byte* arena, GroupId g, std::uint32_t layer, DType plain_dtype) {
  if (g >= layout.num_groups()) fail("group = {}: the layout has {} groups", g, layout.num_groups());
  const LayerGroup& grp = layout.group(g);
  if (grp.is_state() || grp.kind == LayerKind::kVisionEmbedding)
    fail("group = {} ('{}'): a {} group has no K/V pages", g, grp.name, to_string(grp.kind));
  if (layer >= grp.num_layers) fail("layer = {}: group = {} ('{}') has {} layers", layer, g, grp.name, grp.num_layers);
  if (plain_dtype != DType::kF16 && plain_dtype != DType::kBF16)
    fail("plain_dtype = {}: not a DType (0 f16, 1 bf16)", static_cast<unsigned>(plain_dtype));
  if (arena == nullptr) fail("arena = null: group = {} layer = {} needs the arena's base", g, layer);
  PagedKVCache c;
  c.dtype = kernel_dtype(grp, g, plain_dtype);
  c.k = arena + layout.k_offset(g, layer);
  c.v = arena + layout.v_offset(g, layer);
  c.page_stride_bytes = layout.small_page_bytes(g);
  c.tokens_per_page = grp.tokens_per_page;
  c.kv_heads = grp.kv_heads;
  c.head_dim = grp.head_dim;
  c.order = grp.kv_order;
  return c;
}

}  // namespace kvmm::kernels
