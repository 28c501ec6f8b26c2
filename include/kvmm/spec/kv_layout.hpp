// KVLayout: where every byte of a model's KV memory lives. Per group: the small page
// size in the page-layer layout (Jenga Fig. 7b: per layer K then V, each
// [tokens_per_page][kv_heads][head_dim]) and each layer's K/V byte offset inside it;
// for the model: large_page_bytes = LCM of the small page sizes. When that LCM is over
// LayoutOptions::max_large_page_bytes the planner, if fit_tokens_per_page allows, first
// divides the token groups' tokens_per_page by the smallest common divisor that brings the
// natural LCM under the limit (exact pages, no padding); otherwise it pads small pages
// (never tokens_per_page) to sizes whose LCM fits, picking the padding that wastes least.
// Planning is a one-off search (milliseconds); every accessor afterwards is O(1). Groups with element formats,
// latents (MLA), indexers and recurrent-state tensors are sized by LayerGroup; an indexer's
// tied_to must name an attention group with the same kind, window, chunk and layers.
// The planner also maps model layers to groups (LayerGroup::layers; layer_group(i): group
// and page slot of model layer i) and, by default, cuts a decoder attention group whose
// pages would be more than 8 to a large page into groups of the smallest group's layer
// count (LayoutOptions::slice_layers, layer_slicing.hpp): the map says where each layer went.
#pragma once

#include "kvmm/spec/layer_group.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvmm {

// LayoutOptions::slice_layers: may the planner cut attention groups into groups of equal
// layer counts (layer_slicing.hpp)?
enum class SliceLayers : std::uint8_t {
  kOff,                // every group as given
  kSmallestWhenDense,  // cut at the smallest group's count when a group is dense (below)
};

struct LayoutOptions {
  // The largest max_large_page_bytes accepted: 1 TiB, more than one device holds. It also
  // bounds the padding search (about 10^4 candidate sizes, each factorized in 2^20 steps).
  static constexpr std::uint64_t kMaxLargePageBytes = std::uint64_t{1} << 40;
  // Largest large page the planner accepts before it pads small pages, in [1, 2^40].
  // 64 MiB holds the unpadded LCM of every preset (Jamba's is 133 attention pages, about
  // 33 MiB).
  std::uint64_t max_large_page_bytes = std::uint64_t{64} << 20;
  // A padded small page is a multiple of this, so kernels keep 16-byte aligned loads.
  std::uint64_t padded_page_alignment = 256;
  // When the natural LCM passes max_large_page_bytes: may the planner shrink the pages of
  // the token groups (every group but recurrent states, whose tokens_per_page is a
  // checkpoint interval) instead of padding? It divides all their tokens_per_page by the
  // smallest common divisor d > 1 that brings the natural LCM under the limit, keeping
  // each >= min_fitted_tokens_per_page; a group whose format rejects the new size rules
  // d out. With no such d it pads as before; off, it always pads. On by default: exact
  // pages and no padding (as vLLM picks a hybrid's attention block size itself); whenever
  // the LCM fits, nothing changes. The engine reads the chosen size from
  // group(g).tokens_per_page (its kernels must take it); requested_tokens_per_page(g)
  // keeps the caller's.
  bool fit_tokens_per_page = true;
  // The smallest tokens_per_page fitting may choose (8: vLLM's smallest CUDA block size
  // but 1), >= 1.
  std::uint32_t min_fitted_tokens_per_page = 8;
  // Recurrent-state groups (Mamba, linear attention): when a large page would hold more
  // than this many of a state group's pages, the planner fits the token groups'
  // tokens_per_page as above (exact pages, never padding, each >= min_fitted_tokens_per_page)
  // to the smallest common divisor that brings it to this many or fewer; with no such
  // divisor the layout stays as planned. A cached checkpoint in a large page whose other
  // state pages running requests use is memory only the state group can take, so fewer
  // states per large page strand less (issue 34: Jamba-1.5-Mini's 133 16-token attention
  // pages = 4 states per 33.25 MiB large page; at 2, 8-token pages and 16.6 MiB: kvmm-sim's
  // ShareGPT 4 GiB 7,257 -> 7,149 steps, chat 4 GiB 7,196 -> 6,952). 2 by default (issue
  // 34): on the presets only Jamba's plan changes. What it costs: smaller attention pages,
  // so twice the page-table entries and block-table width per token on Jamba, and uncached
  // ShareGPT 0.9% more steps (free attention slots inside attention large pages). 0: off
  // (the plan as without the option).
  std::uint32_t max_state_pages_per_large_page = 2;
  // kSmallestWhenDense (the default, issue 34): when a sliceable group (decoder full,
  // sliding or chunked attention, not a draft, successor-keyed or indexed group) would have
  // more than slice_above_pages_per_large_page small pages per large page, and every
  // sliceable group's page has the same bytes per layer, each sliceable group is cut into
  // groups of the smallest one's layer count (the remainder as one smaller group; names
  // "<group>.<k>", layers in slot order), and the cut groups are planned instead. A cached
  // page of a group with many pages per large page keeps its large page from the other
  // groups (Gemma-3-27B: 10 global layers, 26 1.25 MiB pages per 32.5 MiB large page); cut
  // at 10 layers, every page but a 0.25 MiB remainder is 1.25 MiB, one to a large page
  // (kvmm-sim: chat, agentic and multi-turn 1.05x / 1.02x / 1.04x vLLM 0.33's steps ->
  // 1.005x / 1.010x / 1.005x). Of the presets only Gemma-3-27B is cut: where else a group is
  // dense it is the only sliceable one (Jamba, Qwen3-Next, the state-heavy presets) or the
  // per-layer bytes differ (spec-70b-1b); Ministral-8B's full group has 3 pages per large
  // page and stays whole (cut, it costs 1.7% steps on arXiv-QA with 400-1,000-token
  // questions). The threshold 8 lies between those two measured points, nothing between
  // them was measured. Cost: one page table per group per request (Gemma-3-27B: 7, not 2).
  // kOff: the groups as given.
  SliceLayers slice_layers = SliceLayers::kSmallestWhenDense;
  // Small pages per large page above which a sliceable group is dense, >= 1.
  std::uint32_t slice_above_pages_per_large_page = 8;
};

// Where one model layer lives: its group and its slot in the group's page-layer layout.
struct LayerSlot {
  GroupId group = 0;
  std::uint32_t slot = 0;
  bool operator==(const LayerSlot&) const = default;
};

class KVLayout;
// layer_slicing.hpp: the layout with its sliceable groups cut into groups of n layers.
KVLayout slice_layers(const KVLayout& layout, std::uint32_t n, const LayoutOptions& options);

class KVLayout {
 public:
  // Validates every group (kvmm::Error naming the field and value) and plans the sizes.
  static KVLayout plan(std::vector<LayerGroup> groups, const LayoutOptions& options = {});

  std::size_t num_groups() const { return groups_.size(); }
  const LayerGroup& group(GroupId g) const { return groups_[check(g)]; }
  const std::vector<LayerGroup>& groups() const { return groups_; }
  std::optional<GroupId> find_group(std::string_view name) const;

  std::uint64_t large_page_bytes() const { return large_page_bytes_; }
  // Small page size actually used (padded if the planner had to).
  std::uint64_t small_page_bytes(GroupId g) const { return sizes_[check(g)].padded; }
  std::uint64_t natural_page_bytes(GroupId g) const { return sizes_[check(g)].natural; }
  std::uint32_t small_pages_per_large_page(GroupId g) const { return sizes_[check(g)].per_large; }
  // (padded - natural) / padded for one group; the largest over groups for the model.
  double padding_fraction(GroupId g) const;
  double padding_fraction() const;
  bool padded() const;
  // The LCM of the natural sizes of the planned groups (after any tokens_per_page fitting),
  // before any padding (may exceed the limit; saturates at 2^64-1 when it does not fit 64
  // bits).
  std::uint64_t natural_lcm_bytes() const { return natural_lcm_; }
  // The tokens_per_page group g was given; group(g).tokens_per_page differs from it only
  // when LayoutOptions::fit_tokens_per_page shrank the group's pages.
  std::uint32_t requested_tokens_per_page(GroupId g) const { return sizes_[check(g)].requested_tokens; }
  bool tokens_per_page_fitted() const;

  // Byte offsets inside a small page of group g (attention-like groups). A latent (MLA)
  // group's V is a view of its latent: v_offset equals k_offset. An indexer (key-only)
  // group has no values; its v_offset is k_offset too, so code that walks every group's K
  // and V rows reads its keys and never past its page.
  std::uint64_t k_offset(GroupId g, std::uint32_t layer) const;
  std::uint64_t v_offset(GroupId g, std::uint32_t layer) const;
  // Offset and bytes of any part of a layer (data, rope, scales; LayerGroup::part).
  LayerGroup::Span part(GroupId g, std::uint32_t layer, KvPart part) const;
  // The distance between two layers' K in a page (what a kernel adds per layer).
  std::uint64_t layer_stride_bytes(GroupId g) const;
  // Byte offset of one layer's state inside a state (Mamba) page.
  std::uint64_t state_offset(GroupId g, std::uint32_t layer) const;
  // Byte offset of tensor `tensor` of one layer's state (a group with state_tensors).
  std::uint64_t state_tensor_offset(GroupId g, std::uint32_t layer, std::size_t tensor) const;
  // Bytes a page holds beyond its parts' data and scales: the 16-byte alignment of
  // scale regions (0 for a group without in-page scales). Never LCM padding.
  std::uint64_t alignment_bytes(GroupId g) const;

  // The layer map (O(1) each). num_model_layers: 1 + the largest model layer index a group
  // holds (0 when none). layer_group(i): the first group, in group order, holding model
  // layer i and its slot; kvmm::Error naming i when i is past the map or held by no group (a
  // shared-KV or MLP-only layer). layer_slots(i): every group holding it (an attention group
  // and its indexer, or a hybrid layer's attention and state), empty when none.
  // model_layer(g, slot) = group(g).layers[slot].
  std::uint32_t num_model_layers() const { return static_cast<std::uint32_t>(layer_begin_.size()) - 1; }
  bool holds_layer(std::uint32_t model_layer) const { return !layer_slots(model_layer).empty(); }
  LayerSlot layer_group(std::uint32_t model_layer) const;
  std::span<const LayerSlot> layer_slots(std::uint32_t model_layer) const;
  std::uint32_t model_layer(GroupId g, std::uint32_t slot) const;
  // The index, in the groups plan() was given, of the group whose layers group g holds
  // (g itself unless the planner sliced); sliced() says whether it did.
  std::size_t source_group(GroupId g) const { return sources_[check(g)]; }
  bool sliced() const { return groups_.size() != num_sources_; }

  // Multi-line human-readable summary (sizes, pages per large page, padding).
  std::string describe() const;

 private:
  struct Sizes {
    std::uint64_t natural = 0;
    std::uint64_t padded = 0;
    std::uint32_t per_large = 0;
    std::uint32_t requested_tokens = 0;
  };
  friend KVLayout slice_layers(const KVLayout& layout, std::uint32_t n, const LayoutOptions& options);
  static KVLayout plan_groups(std::vector<LayerGroup> groups, const LayoutOptions& options);
  void map_layers();
  GroupId check(GroupId g) const;
  std::vector<LayerGroup> groups_;
  std::vector<std::size_t> sources_;
  std::size_t num_sources_ = 0;
  std::vector<std::uint32_t> layer_begin_ = {0};  // CSR over model layers into layer_slots_
  std::vector<LayerSlot> layer_slots_;
  std::vector<Sizes> sizes_;
  std::uint64_t large_page_bytes_ = 0;
  std::uint64_t natural_lcm_ = 0;
};

}  // namespace kvmm
