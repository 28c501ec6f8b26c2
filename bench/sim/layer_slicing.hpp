// Layer slicing (issue 34, the Gemma-3 steps gap): vLLM's hybrid allocator cuts a model's
// layers into groups of equal layer count, so every group's page has one size and memory
// is one pool. kvmm's planner instead pages each layer kind as one group and fits them in
// large pages of the LCM of their sizes (Gemma-3-27B: 10 global and 52 local layers, a
// 32.5 MiB large page holding 26 global or 5 local pages), where a cached small page of
// one group keeps its large page from the other. slice_layers gives kvmm the equal pages:
// each attention group of the decoder is cut into sub-groups of n layers (same kind,
// shape and tokens per page; named "<group>.<k>"), the last one holding the remainder when
// n does not divide the group. Cost: a request holds one page table per sub-group (Gemma-3
// at n = 2: 31 tables instead of 2; at n = 10, the smallest group's count: 7, six 1.25 MiB
// pages and one 0.25 MiB remainder page) and every allocation, lookup and commit walks them
// all; hits keep their page granularity. O(groups) to plan.
#pragma once

#include "kvmm/spec/kv_layout.hpp"

#include <cstdint>

namespace kvmm::sim {

// Slice width chosen by the layout (slice_layers' n): the gcd of the layer counts of the
// groups slice_layers cuts, if they all have the same page bytes per layer (then every
// sub-group's page is one size), else 0 (no slicing).
inline constexpr std::uint32_t kSliceAuto = 0xffffffffu;
// Slice width of the smallest group (slice_layers' n): the fewest layers of a group
// slice_layers cuts, if they all have the same page bytes per layer, else 0. Every group is
// then cut into pages of that group's size, the remainder of a group into one smaller page.
inline constexpr std::uint32_t kSliceSmallest = 0xfffffffeu;

// The groups slice_layers cuts: full attention, sliding window and chunked local groups
// of the decoder that are neither drafts, successor-keyed nor indexed by another group.
bool sliceable(const KVLayout& layout, GroupId g);

// The width kSliceAuto stands for in `layout` (0: slicing would not give equal pages).
std::uint32_t auto_slice_layers(const KVLayout& layout);
// The width kSliceSmallest stands for in `layout` (0: per-layer pages differ, or nothing to cut).
std::uint32_t smallest_slice_layers(const KVLayout& layout);

// The layout with each sliceable group of more than n layers cut into num_layers / n
// groups of n layers, plus one group of the num_layers % n left if that is not 0, in place
// of the group; the others as they are. n = kSliceAuto: auto_slice_layers, kSliceSmallest:
// smallest_slice_layers (the layout unchanged if 0); n = 0 or a cut of nothing: the layout
// itself, not re-planned. The sliced layout is planned with `options`.
KVLayout slice_layers(const KVLayout& layout, std::uint32_t n, const LayoutOptions& options = {});

}  // namespace kvmm::sim
