// Layer slicing (issue 34): cutting decoder attention groups into groups of equal layer
// counts, as vLLM's hybrid allocator does, so that their pages have one size. The planner
// pages each layer kind as one group in large pages of the LCM of their sizes; when one
// group's pages are many to a large page (Gemma-3-27B: 10 global layers, 26 1.25 MiB pages
// per 32.5 MiB large page, beside 52 local layers' 6.5 MiB pages), a cached page of it keeps
// its large page from the other group. KVLayout::plan cuts by default
// (LayoutOptions::slice_layers: at the smallest group's count when a group has more than
// slice_above_pages_per_large_page pages per large page); kvmm-sim's --slice-layers cuts at
// any width. Each sub-group keeps its group's kind, shape and tokens per page, is named
// "<group>.<k>" and holds the next n of its group's model layers (LayerGroup::layers, in
// slot order); the last holds the remainder when n does not divide the group. Cost: a
// request holds one page table per group (Gemma-3-27B cut at 10: 7 instead of 2) and every
// allocation, lookup and commit walks them all. O(groups + layers) plus one re-plan.
#pragma once

#include "kvmm/spec/kv_layout.hpp"

#include <cstdint>

namespace kvmm {

// slice_layers' n: the gcd of the layer counts of the groups slice_layers cuts, if their
// pages all have the same bytes per layer (then every sub-group's page is one size), else 0.
inline constexpr std::uint32_t kSliceAuto = 0xffffffffu;
// slice_layers' n: the fewest layers of a group slice_layers cuts, if their pages all have
// the same bytes per layer, else 0; the remainder of a group becomes one smaller page.
inline constexpr std::uint32_t kSliceSmallest = 0xfffffffeu;

// The groups slice_layers cuts: full attention, sliding window and chunked local groups of
// the decoder that are neither drafts, successor-keyed nor indexed by another group.
bool sliceable(const KVLayout& layout, GroupId g);

// The width kSliceAuto stands for in `layout` (0: slicing would not give equal pages).
std::uint32_t auto_slice_layers(const KVLayout& layout);
// The width kSliceSmallest stands for in `layout` (0: per-layer pages differ, or nothing to cut).
std::uint32_t smallest_slice_layers(const KVLayout& layout);
// The width SliceLayers::kSmallestWhenDense cuts `layout` at: smallest_slice_layers when a
// sliceable group has more than `above` small pages per large page and that width cuts a
// group, else 0 (the layout stays as planned).
std::uint32_t dense_slice_layers(const KVLayout& layout, std::uint32_t above);

// The layout with each sliceable group of more than n layers cut into num_layers / n groups
// of n layers, plus one of the num_layers % n left if that is not 0, in its place; the others
// as they are, each with the tokens per page it was planned with. n = kSliceAuto or
// kSliceSmallest: the widths above (the layout itself if 0); n = 0 or a cut of nothing: the
// layout itself, not re-planned. The cut layout is planned with `options` but never cut
// again (its slice_layers is taken as kOff); its source_group(g) is the group of `layout`'s
// source that g's layers came from.
KVLayout slice_layers(const KVLayout& layout, std::uint32_t n, const LayoutOptions& options = {});

}  // namespace kvmm
