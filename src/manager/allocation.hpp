// PageAllocation (private to src/manager/): Jenga §5.4's allocation steps for one small
// page, and the all-or-nothing check that a request's pages can be had before any is
// taken. The steps are written once (take_one); the real allocator and the replay of the
// steps on counters both run them, so the check cannot drift from what allocate does.
// A page costs O(1) plus its evictions; the check O(groups) when a bound decides (almost
// always under pressure), else O(pages needed + large pages walked).
//
// The steps, in order: (1) a free small page in a large page associated with the
// request, (2) an empty large page, (3) evict the LRU evictable large page (the merged
// step-3 order, see PageStore), (4) any free small page of the group, (5) evict the
// group's LRU small page; then, where Jenga would fail, (6) reclaim the LRU large page of
// another group that holds cached and empty but no used small pages, so memory is never
// stranded in a group whose cached pages leave free small pages behind.
//
// With packing (KVCacheManagerOptions::pack_small_pages, the default) a group serves a
// page from its own large pages before it takes a whole one: (1), (4), then (4b) evict the
// group's LRU cached small page when its large page is live (holds a used small page: no
// other group could take that memory before the user is gone), then (2), (3), (5), (6).
// Jenga's order opens a large page per request at step 2, and with many small pages per
// large page (a hybrid's 201 attention pages beside one state page) most of each stays
// free, stranded for the groups that need whole large pages; packing without (4b) leaves
// the finished requests' cached pages stranded the same way in large pages still live.
#pragma once

#include "group.hpp"
#include "page_store.hpp"
#include "prefetch.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

// One page of group g through the steps, on an executor whose step functions return true
// when they served the page.
template <class Steps>
bool take_one(Steps& s, GroupId g, bool pack) {
  if (pack)
    return s.associated(g) || s.any_free(g) || s.evict_in_live(g) || s.fresh(g) || s.evict_large(g) ||
           s.evict_small(g) || s.reclaim_mixed(g);
  return s.associated(g) || s.fresh(g) || s.evict_large(g) || s.any_free(g) || s.evict_small(g) || s.reclaim_mixed(g);
}

class PageAllocation {
 public:
  // pack: the packing order (above) instead of Jenga's.
  PageAllocation(std::vector<Group>& groups, LargePagePool& pool, PageStore& store, bool pack = true);

  // One page of group g for request row r, kNullPage when the steps find none (never
  // after feasible() said yes for the pages being taken).
  PageId take_page(GroupId g, Row r);
  // Whether need[g] pages of every group g can be had, taken in group order as allocate()
  // and swap_in() take them. Exact (allocation has no rollback). Changes nothing but
  // dropping stale list entries.
  bool feasible(Row r, std::span<const std::uint64_t> need);
  // Necessary, O(groups): more pages than every free small page, evictable page and free large
  // page together cannot be had. Holds whatever is pinned later, so allocate asks it before
  // pinning a hit.
  // `leaving[g]` (optional): evictable pages of g a pin is about to take out of the counts.
  bool surely_infeasible(std::span<const std::uint64_t> need, std::span<const std::uint64_t> leaving = {}) const;

 private:
  friend class RealSteps;
  friend class ReplaySteps;
  int quick_feasible(std::span<const std::uint64_t> need) const;  // 1, 0, or -1: undecided
  bool replay_feasible(Row r, std::span<const std::uint64_t> need);
  void replay_spoil(GroupId g, Row r, LargePageId first, bool by_request, std::uint64_t takes);
  // Whether large page lp of group g holds a used small page (neither evictable nor free). O(1).
  bool live(GroupId g, LargePageId lp) const {
    return groups_[g].n > store_.evictable_in(lp) + pool_.free_small_unchecked(lp);
  }

  std::vector<Group>& groups_;
  LargePagePool& pool_;
  PageStore& store_;
  bool pack_;
  VictimRing ring_;
  std::uint64_t slot_units_ = 0;  // lcm of the groups' n (0: too large for the bound)
  // The replay's counters per group: free small pages in r's associated large pages, free small pages,
  // evictable pages; and its cursor per step-3 source.
  std::vector<std::uint64_t> sim_a_, sim_f_, sim_e_;
  std::vector<LargePageId> rpos_;
};

}  // namespace kvmm::detail
