// Basic ids shared by every layer: 32-bit small-page, large-page, group and request ids,
// page-table rows, and the sentinel values (null page, no large page, no request, no row). Flat arrays are indexed by
// these ids. Words (one meaning each): docs/glossary.md.
#pragma once

#include <cstdint>
#include <limits>

namespace kvmm {

using PageId = std::uint32_t;     // a small page id: what page tables hold and kernels read
using GroupId = std::uint32_t;    // index of a layer group in a KVLayout
using RequestId = std::uint32_t;  // a request's handle, as KVCacheManager or PagedKVAllocator issues it

// A page-table row: where a request's pages live in a PageTableSet and its association
// in a SmallPageAllocator (index < max_requests). Not a handle: KVCacheManager maps the
// handles it issues to rows (row(r)), and a handle is generation-checked where a row is
// a bare index. A distinct type, so that passing one where the other is meant does not
// compile. Costs nothing: a 4-byte aggregate passed in a register.
struct Row {
  std::uint32_t index = 0;
  friend constexpr bool operator==(Row, Row) = default;
};

// A large page of the LCM pool (LargePagePool's id; an arena's chunk index). Small page
// ids of a group are large id * per-large + slot, so the two are easy to mix up: a
// distinct type, so that a small page id passed where a large one is meant (or the
// reverse) does not compile. Costs nothing: a 4-byte aggregate passed in a register.
struct LargePageId {
  std::uint32_t index = 0;
  friend constexpr bool operator==(LargePageId, LargePageId) = default;
};

// A page table entry that holds no memory: an out-of-window page that was freed, or
// padding in a dense table. Kernels skip it.
inline constexpr PageId kNullPage = std::numeric_limits<PageId>::max();
inline constexpr RequestId kNoRequest = std::numeric_limits<RequestId>::max();
inline constexpr Row kNoRow{std::numeric_limits<std::uint32_t>::max()};
inline constexpr LargePageId kNoLargePage{std::numeric_limits<std::uint32_t>::max()};

}  // namespace kvmm
