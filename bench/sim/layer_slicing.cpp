// Layer slicing (see layer_slicing.hpp).
#include "sim/layer_slicing.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

namespace kvmm::sim {

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

}  // namespace

std::uint32_t auto_slice_layers(const KVLayout& layout) { return slice_width(layout, false); }
std::uint32_t smallest_slice_layers(const KVLayout& layout) { return slice_width(layout, true); }

KVLayout slice_layers(const KVLayout& layout, std::uint32_t n, const LayoutOptions& options) {
  if (n == kSliceAuto) n = auto_slice_layers(layout);
  if (n == kSliceSmallest) n = smallest_slice_layers(layout);
  bool cuts = false;
  for (GroupId g = 0; g < layout.num_groups() && n > 0; ++g)
    cuts |= sliceable(layout, g) && layout.group(g).num_layers > n;
  if (!cuts) return layout;  // as planned (its options kept: nothing to re-plan)
  std::vector<LayerGroup> groups;
  for (GroupId g = 0; g < layout.num_groups(); ++g) {
    LayerGroup grp = layout.group(g);
    grp.tokens_per_page = layout.group(g).tokens_per_page;  // as planned (fitted or not)
    if (n == 0 || !sliceable(layout, g) || grp.num_layers <= n) {
      groups.push_back(std::move(grp));
      continue;
    }
    const std::string name = grp.name;
    const std::uint32_t whole = grp.num_layers / n, rest = grp.num_layers % n;
    for (std::uint32_t k = 0; k < whole + (rest > 0 ? 1 : 0); ++k) {
      LayerGroup part = grp;
      part.name = fmt::format("{}.{}", name, k);
      part.num_layers = k < whole ? n : rest;
      groups.push_back(std::move(part));
    }
  }
  return KVLayout::plan(std::move(groups), options);
}

}  // namespace kvmm::sim
