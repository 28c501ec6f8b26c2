// Layer slicing (issue 34, the Gemma-3 steps gap): vLLM's hybrid allocator cuts a model's
// layers into groups of equal layer count, so every group's page has one size and memory
// is one pool. kvmm's planner instead pages each layer kind as one group and fits them in
// large pages of the LCM of their sizes (Gemma-3-27B: 10 global and 52 local layers, a
// 32.5 MiB large page holding 26 global or 5 local pages), where a cached small page of
// one group keeps its large page from the other. slice_layers gives kvmm the equal pages:
// each attention group of the decoder is cut into sub-groups of n layers (same kind,
// shape and tokens per page; named "<group>.<k>"). Cost: a request holds one page table
// per sub-group (Gemma-3 at n = 2: 31 tables instead of 2) and every allocation, lookup
// and commit walks them all; hits keep their page granularity. O(groups) to plan.
#pragma once

#include "kvmm/spec/kv_layout.hpp"

#include <cstdint>

namespace kvmm::sim {

// Slice width chosen by the layout (slice_layers' n): the gcd of the layer counts of the
// groups slice_layers cuts, if they all have the same page bytes per layer (then every
// sub-group's page is one size), else 0 (no slicing).
inline constexpr std::uint32_t kSliceAuto = 0xffffffffu;

// The groups slice_layers cuts: full attention, sliding window and chunked local groups
// of the decoder that are neither drafts, successor-keyed nor indexed by another group.
bool sliceable(const KVLayout& layout, GroupId g);

// The width kSliceAuto stands for in `layout` (0: slicing would not give equal pages).
std::uint32_t auto_slice_layers(const KVLayout& layout);

// The layout with each sliceable group of more than n layers cut into num_layers / n
// groups of n layers, in place of the group; the others as they are. n = kSliceAuto:
// auto_slice_layers (the layout unchanged if 0); n = 0 or a cut of nothing: the layout
// itself, not re-planned. The sliced layout is planned with `options`. Raises kvmm::Error
// naming n and the group when a sliceable group's layer count is not a multiple of n.
KVLayout slice_layers(const KVLayout& layout, std::uint32_t n, const LayoutOptions& options = {});

}  // namespace kvmm::sim
