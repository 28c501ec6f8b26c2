#include "kvmm/distributed/page_descriptors.hpp"

#include "fingerprint.hpp"
#include "kvmm/error.hpp"

#include <algorithm>

namespace kvmm {

std::size_t page_runs(const KVArena& arena, GroupId g, std::span<const PageId> pages, std::uint64_t device,
                      std::vector<PageRun>& out) {
  const std::uint64_t size = arena.layout().small_page_bytes(g);
  const std::uint64_t limit = std::uint64_t{arena.num_large_pages()} * arena.layout().small_pages_per_large_page(g);
  for (std::size_t i = 0; i < pages.size(); ++i)
    if (pages[i] != kNullPage && pages[i] >= limit)
      fail("pages[{}] = {}: group {} has {} small pages in this arena", i, pages[i], g, limit);
  const std::size_t before = out.size();
  PageId prev = kNullPage;
  for (const PageId p : pages) {
    if (p == kNullPage) continue;
    if (out.size() > before && prev != kNullPage && p == prev + 1) {
      out.back().bytes += size;
    } else {
      out.push_back(PageRun{arena.base() + std::uint64_t{p} * size, size, device});
    }
    prev = p;
  }
  return out.size() - before;
}

std::size_t pair_runs(std::span<const PageRun> src, std::span<const PageRun> dst, std::vector<TransferSpan>& out) {
  std::uint64_t src_bytes = 0, dst_bytes = 0;
  for (const PageRun& r : src) src_bytes += r.bytes;
  for (const PageRun& r : dst) dst_bytes += r.bytes;
  if (src_bytes != dst_bytes) fail("pair_runs: source runs cover {} bytes, destination runs {}", src_bytes, dst_bytes);
  const std::size_t before = out.size();
  std::size_t i = 0, j = 0;
  std::uint64_t si = 0, dj = 0;  // bytes of src[i] / dst[j] already paired
  while (i < src.size() && j < dst.size()) {
    const std::uint64_t n = std::min(src[i].bytes - si, dst[j].bytes - dj);
    if (n != 0) out.push_back(TransferSpan{src[i].addr + si, dst[j].addr + dj, n});
    si += n;
    dj += n;
    if (si == src[i].bytes) ++i, si = 0;
    if (j < dst.size() && dj == dst[j].bytes) ++j, dj = 0;
  }
  return out.size() - before;
}

std::uint64_t layout_fingerprint(const KVLayout& layout) {
  constexpr std::uint64_t kFormat = 2;  // raise when the page-layer layout changes meaning (2: the layer map)
  detail::Fingerprint f;
  f.str("kvmm.layout").u64(kFormat).u64(layout.num_groups());
  for (GroupId g = 0; g < layout.num_groups(); ++g) {
    const LayerGroup& grp = layout.group(g);
    f.u64(static_cast<std::uint64_t>(grp.kind)).u64(grp.num_layers).u64(grp.kv_heads).u64(grp.head_dim);
    f.u64(grp.dtype_bytes).u64(grp.tokens_per_page).u64(grp.window).u64(grp.chunk);
    f.u64(grp.state_bytes_per_layer).u64(grp.embedding_bytes_per_token);
    f.u64(layout.natural_page_bytes(g)).u64(layout.small_page_bytes(g));
    // Only a head-major order is hashed, so every token-major layout keeps the fingerprint
    // it had before LayerGroup::kv_order existed.
    if (grp.kv_order != KVOrder::kTokenMajor) f.str("kv_order").u64(static_cast<std::uint64_t>(grp.kv_order));
    // What the bytes of equal-sized pages mean: the storage (K and V, key only, an MLA
    // latent), the rope part, the element formats with their scales (fp8 e4m3 against e5m2,
    // scales inline or apart) and the state tensors' formats. Each only when the group sets
    // it, so a plain group keeps the fingerprint it had before these were hashed.
    if (grp.storage != KvStorage::kKeyValue) f.str("storage").u64(static_cast<std::uint64_t>(grp.storage));
    if (grp.rope_dim != 0) f.str("rope_dim").u64(grp.rope_dim);
    auto format = [&f](const char* what, const ElementFormat& e) {
      f.str(what).u64(static_cast<std::uint64_t>(e.type)).u64(static_cast<std::uint64_t>(e.scale.granularity));
      f.u64(e.scale.block)
          .u64(static_cast<std::uint64_t>(e.scale.type))
          .u64(static_cast<std::uint64_t>(e.scale.placement));
    };
    if (grp.k_format) format("k_format", *grp.k_format);
    if (grp.v_format) format("v_format", *grp.v_format);
    if (grp.rope_format) format("rope_format", *grp.rope_format);
    for (const StateTensor& t : grp.state_tensors) {
      f.str("state_tensor").u64(t.shape.size());
      for (const std::uint64_t d : t.shape) f.u64(d);
      format("state_format", t.format);
    }
    for (std::uint32_t l = 0; l < grp.num_layers; ++l) {
      if (l < grp.layers.size()) f.u64(grp.layers[l]);  // which model layer the slot holds
      if (grp.is_state())
        f.u64(layout.state_offset(g, l));
      else if (grp.kind != LayerKind::kVisionEmbedding)
        f.u64(layout.k_offset(g, l)).u64(layout.v_offset(g, l));
    }
  }
  return f.digest();
}

}  // namespace kvmm
