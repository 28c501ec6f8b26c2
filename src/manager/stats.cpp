// ManagerCore::stats(): the cache's counters (O(1) each) and each group's memory use: used,
// evictable and empty pages, and the bytes the used pages really hold (a page shared by a
// fork or a hit counted once, at its fullest), O(pages held by requests and pins); and
// what the kernel exports read of a request: its rows and kv lengths, O(1) per request.
#include "manager_core.hpp"

#include <algorithm>

namespace kvmm::detail {

// Long by design (lint): a list of independent sums over the groups, one per field of CacheStats.
// NOLINTBEGIN(readability-function-cognitive-complexity)
CacheStats ManagerCore::stats() const {
  // NOLINTEND(readability-function-cognitive-complexity)
  CacheStats s;
  s.free_large_pages = pool_.num_free();
  s.lookups = lookups_;
  s.lookup_tokens = lookup_tokens_;
  s.hit_tokens = hit_tokens_;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    GroupStats gs;
    gs.evictable_pages = grp.evictable;
    gs.used_pages = grp.alloc.num_used_small() - grp.evictable;
    gs.empty_pages = grp.alloc.num_free_small();
    gs.large_pages = grp.alloc.num_large_pages();
    gs.allocated_bytes = std::uint64_t{gs.used_pages} * layout_.small_page_bytes(g);
    gs.hit_pages = grp.hit_pages;
    gs.evicted_pages = grp.evicted;
    std::vector<std::uint32_t> held(grp.pg.size(), 0);
    for (Row r{0}; r.index < reqs_.capacity(); ++r.index) {
      const Request& q = reqs_[r];
      if (!q.active() || q.swapped()) continue;
      const std::span<const PageId> pages = grp.table.pages(r);
      for (std::size_t i = 0; i < pages.size(); ++i) {
        if (pages[i] == kNullPage) continue;
        std::uint64_t tok = grp.P;
        if (grp.decoder) {
          const std::uint64_t start = i * std::uint64_t{grp.P};
          tok = q.progress.computed > start ? std::min<std::uint64_t>(grp.P, q.progress.computed - start) : 0;
        }
        held[pages[i]] = std::max<std::uint32_t>(held[pages[i]], static_cast<std::uint32_t>(tok));
      }
    }
    for (const auto& pin : pins_)
      for (const auto& [pg, p] : pin)
        if (pg == g) held[p] = grp.P;
    for (Row r{0}; r.index < reqs_.capacity(); ++r.index)  // pages held for a cache boundary: full
      if (reqs_[r].active())
        for (const HeldPage& h : reqs_[r].keep.held)
          if (h.group == g) held[h.page] = grp.P;
    for (PageId p = 0; p < held.size(); ++p) {
      if (held[p] == 0) continue;
      gs.needed_bytes += grp.spec.is_state() ? layout_.natural_page_bytes(g) : held[p] * grp.spec.bytes_per_token();
    }
    gs.waste_bytes = gs.allocated_bytes > gs.needed_bytes ? gs.allocated_bytes - gs.needed_bytes : 0;
    s.groups.push_back(gs);
  }
  return s;
}

ManagerCounters ManagerCore::counters() const {
  ManagerCounters c = counts_;
  c.lookups = lookups_;
  c.lookup_tokens = lookup_tokens_;
  c.hit_tokens = hit_tokens_;
  c.misses = misses.counters();
  c.active_requests = reqs_.num_active();
  c.free_large_pages = pool_.num_free();
  c.large_pages = pool_.capacity();
  c.retention_bytes = retention.held_bytes();
  c.retention_released_pages = retention.released_pages();
  c.used_pages.clear();
  c.evictable_pages.clear();
  for (const Group& grp : groups_) {
    c.evicted_pages += grp.evicted;
    c.used_pages.push_back(grp.alloc.num_used_small() - grp.evictable);
    c.evictable_pages.push_back(grp.evictable);
  }
  return c;
}

}  // namespace kvmm::detail
