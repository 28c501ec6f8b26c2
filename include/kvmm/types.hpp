// Basic ids shared by every layer: 32-bit page, group and request ids, page-table rows,
// and the sentinel values (null page, no request, no row). Flat arrays are indexed by these ids.
// Words (one meaning each): docs/glossary.md.
#pragma once

#include <cstdint>
#include <limits>

namespace kvmm {

using PageId = std::uint32_t;     // small or large page id, depending on context
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

// A page table entry that holds no memory: an out-of-window page that was freed, or
// padding in a dense table. Kernels skip it.
inline constexpr PageId kNullPage = std::numeric_limits<PageId>::max();
inline constexpr RequestId kNoRequest = std::numeric_limits<RequestId>::max();
inline constexpr Row kNoRow{std::numeric_limits<std::uint32_t>::max()};

}  // namespace kvmm
