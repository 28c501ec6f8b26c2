// The (group, hash) blocks a KVCacheManager holds cached in its decoder groups, read page
// by page through testing::ManagerInspector (O(pages)): what a router's index of this
// replica must equal (the KV event tests compare the events' set against it).
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <cstdint>
#include <set>
#include <utility>

namespace kvmm::test {

// (group, (hash.lo, hash.hi)) of a cached page.
using CachedBlock = std::pair<GroupId, std::pair<std::uint64_t, std::uint64_t>>;

// The manager's cached (group, hash) blocks of its decoder groups, page by page.
inline std::set<CachedBlock> cached_blocks(const KVCacheManager& kv) {
  testing::ManagerInspector in(kv);
  std::set<CachedBlock> out;
  for (GroupId g = 0; g < kv.layout().num_groups(); ++g) {
    if (!kv.layout().group(g).is_decoder()) continue;
    const std::uint64_t pages = std::uint64_t{kv.layout().small_pages_per_large_page(g)} * kv.large_pages().capacity();
    for (PageId p = 0; p < pages; ++p)
      if (const auto h = in.page_hash(g, p)) out.insert({g, {h->lo, h->hi}});
  }
  return out;
}

}  // namespace kvmm::test
