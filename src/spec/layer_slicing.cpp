// Layer slicing (see kvmm/spec/layer_slicing.hpp).
#include "kvmm/spec/layer_slicing.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

namespace kvmm {

bool sliceable(const KVLayout& layout, GroupId g) {
  const LayerGroup& grp = layout.group(g);
  const bool attention = grp.kind == LayerKind::kFullAttention || grp.kind == LayerKind::kSlidingWindow ||
                         grp.kind == LayerKind::kChunkedLocal;
  if (!attention || grp.draft || grp.successor_tokens > 0 || !grp.tied_to.empty()) return false;
  for (GroupId x = 0; x < layout.num_groups(); ++x)
    if (layout.group(x).tied_to == grp.name) return false;
  return true;
}

namespace {

// The gcd (smallest = false) or the least (true) of the sliceable groups' layer counts, 0
// when their pages' bytes per layer differ.
std::uint32_t slice_width(const KVLayout& layout, bool smallest) {
  std::uint32_t n = 0;
  std::uint64_t per_layer = 0;
  for (GroupId g = 0; g < layout.num_groups(); ++g) {
    if (!sliceable(layout, g)) continue;
    const LayerGroup& grp = layout.group(g);
    const std::uint64_t b = layout.small_page_bytes(g) / grp.num_layers;
    if (b * grp.num_layers != layout.small_page_bytes(g) || (per_layer != 0 && b != per_layer)) return 0;
    per_layer = b;
    n = smallest ? (n == 0 ? grp.num_layers : std::min(n, grp.num_layers)) : std::gcd(n, grp.num_layers);
  }
  return n;
}

bool cuts(const KVLayout& layout, std::uint32_t n) {
  for (GroupId g = 0; g < layout.num_groups() && n > 0; ++g)
    if (sliceable(layout, g) && layout.group(g).num_layers > n) return true;
  return false;
}

}  // namespace

std::uint32_t auto_slice_layers(const KVLayout& layout) { return slice_width(layout, false); }
std::uint32_t smallest_slice_layers(const KVLayout& layout) { return slice_width(layout, true); }

std::uint32_t dense_slice_layers(const KVLayout& layout, std::uint32_t above) {
  bool dense = false;
  for (GroupId g = 0; g < layout.num_groups(); ++g)
    dense |= sliceable(layout, g) && layout.small_pages_per_large_page(g) > above;
  const std::uint32_t n = dense ? smallest_slice_layers(layout) : 0;
  return cuts(layout, n) ? n : 0;
}

KVLayout slice_layers(const KVLayout& layout, std::uint32_t n, const LayoutOptions& options) {
  if (n == kSliceAuto) n = auto_slice_layers(layout);
  if (n == kSliceSmallest) n = smallest_slice_layers(layout);
  if (!cuts(layout, n)) return layout;  // as planned (its options kept: nothing to re-plan)
  std::vector<LayerGroup> groups;
  std::vector<std::size_t> sources;
  std::vector<std::uint32_t> requested;
  for (GroupId g = 0; g < layout.num_groups(); ++g) {
    const LayerGroup& grp = layout.group(g);  // its tokens_per_page as planned (fitted or not)
    const std::uint32_t whole = grp.num_layers / n, rest = grp.num_layers % n;
    const std::uint32_t parts = !sliceable(layout, g) || grp.num_layers <= n ? 1 : whole + (rest > 0 ? 1 : 0);
    for (std::uint32_t k = 0; k < parts; ++k) {
      LayerGroup part = grp;
      if (parts > 1) {
        part.name = fmt::format("{}.{}", grp.name, k);
        part.num_layers = k < whole ? n : rest;
        const auto first = grp.layers.begin() + std::ptrdiff_t{k} * n;
        part.layers.assign(first, first + part.num_layers);
      }
      groups.push_back(std::move(part));
      sources.push_back(layout.source_group(g));
      requested.push_back(layout.requested_tokens_per_page(g));
    }
  }
  LayoutOptions once = options;
  once.slice_layers = SliceLayers::kOff;
  KVLayout out = KVLayout::plan_groups(std::move(groups), once);
  for (std::size_t g = 0; g < out.sizes_.size(); ++g) out.sizes_[g].requested_tokens = requested[g];
  out.sources_ = std::move(sources);
  out.num_sources_ = layout.num_sources_;
  return out;
}

}  // namespace kvmm
