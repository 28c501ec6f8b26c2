// Basic ids shared by every layer: 32-bit page, group and request ids, and the
// sentinel values (null page, no request). Flat arrays are indexed by these ids.
// Words (one meaning each): docs/glossary.md.
#pragma once

#include <cstdint>
#include <limits>

namespace kvmm {

using PageId = std::uint32_t;     // small or large page id, depending on context
using GroupId = std::uint32_t;    // index of a layer group in a KVLayout
using RequestId = std::uint32_t;  // a request: a row (< max_requests), or a manager's handle

// A page table entry that holds no memory: an out-of-window page that was freed, or
// padding in a dense table. Kernels skip it.
inline constexpr PageId kNullPage = std::numeric_limits<PageId>::max();
inline constexpr RequestId kNoRequest = std::numeric_limits<RequestId>::max();

}  // namespace kvmm
