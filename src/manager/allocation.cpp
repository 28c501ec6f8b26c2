#include "allocation.hpp"

#include "kvmm/detail/debug_checks.hpp"
#include "kvmm/error.hpp"

#include <algorithm>
#include <numeric>

namespace kvmm::detail {

PageAllocation::PageAllocation(std::vector<Group>& groups, LargePagePool& pool, PageStore& store, bool pack)
    : groups_(groups),
      pool_(pool),
      store_(store),
      pack_(pack),
      ring_(store.num_sources()),
      sim_a_(groups.size(), 0),
      sim_f_(groups.size(), 0),
      sim_e_(groups.size(), 0),
      rpos_(store.num_sources(), kNoLargePage) {
  slot_units_ = 1;
  for (const Group& grp : groups_) {
    slot_units_ = std::lcm(slot_units_, std::uint64_t{grp.n});
    if (slot_units_ > (std::uint64_t{1} << 24)) {  // products must stay below 2^64
      slot_units_ = 0;
      break;
    }
  }
}

// The steps on the real allocator: each takes (and evicts) for real; `page` is the result.
class RealSteps {
 public:
  RealSteps(PageAllocation& a, Row r) : a_(a), r_(r) {}
  PageId page = kNullPage;

  bool associated(GroupId g) { return got(a_.groups_[g].alloc.try_associated(r_)); }
  bool fresh(GroupId g) { return got(a_.groups_[g].alloc.try_fresh(r_)); }
  bool evict_large(GroupId g) {
    std::uint32_t src;
    const LargePageId lp = a_.store_.large_front(src);
    if (lp == kNoLargePage) return false;
    a_.ring_.advance(a_.store_, lp, src, g);
    a_.store_.evict_large(lp);
    return got(a_.groups_[g].alloc.try_fresh(r_));
  }
  bool any_free(GroupId g) { return got(a_.groups_[g].alloc.try_any()); }
  // Evicting a small page frees a small page of the group (or, n = 1, its large page): served.
  bool evict_small(GroupId g) {
    Group& grp = a_.groups_[g];
    const PageId s = a_.store_.small_front(g);
    if (s == kNullPage) return false;
    if (const PageId next = grp.lru.after(s); next != kNullPage && grp.pg[next].hashed)
      if constexpr (kPrefetch) a_.store_.index().prefetch(g, grp.pg[next].hash);
    a_.store_.evict_small(g, s);
    page = grp.alloc.try_associated(r_);
    if (page == kNullPage) page = grp.alloc.try_any();
    if (page == kNullPage) page = grp.alloc.try_fresh(r_);
    return true;
  }
  // Step 4b: the LRU cached page of g, if its large page is live; the freed page is served.
  bool evict_in_live(GroupId g) {
    Group& grp = a_.groups_[g];
    const PageId s = a_.store_.small_front(g);
    if (s == kNullPage || !a_.live(g, grp.large_of(s))) return false;
    a_.store_.evict_small(g, s);
    page = grp.alloc.try_associated(r_);
    if (page == kNullPage) page = grp.alloc.try_any();
    return true;
  }
  bool reclaim_mixed(GroupId g) {
    const LargePageId lp = a_.store_.mixed_front();
    if (lp == kNoLargePage) return false;
    a_.store_.evict_large(lp);
    page = a_.groups_[g].alloc.try_fresh(r_);
    return true;
  }

 private:
  bool got(PageId p) {
    page = p;
    return p != kNullPage;
  }
  PageAllocation& a_;
  Row r_;
};

PageId PageAllocation::take_page(GroupId g, Row r) {
  RealSteps steps(*this, r);
  take_one(steps, g, pack_);
  return steps.page;
}

// The steps on counters (see replay_feasible). Per group: sim_a_ free small pages in r's
// associated large pages, sim_f_ free small pages, sim_e_ evictable pages.
class ReplaySteps {
 public:
  ReplaySteps(PageAllocation& a, Row r, std::uint64_t pool) : a_(a), r_(r), pool_(pool) {}

  // Step 1 serves first, from r's associated large pages; a mixed one it takes a free small page
  // of is no longer step 6's to reclaim.
  void begin_group(GroupId g, std::uint64_t need) {
    a_.replay_spoil(g, r_, a_.groups_[g].alloc.first_associated(r_), true, std::min(need, a_.sim_a_[g]));
    any_takes_ = 0;
    spoiled_any_ = false;
    lru_started_ = false;
  }
  // Step 4 took free small pages from the group's large pages in list order.
  void end_group(GroupId g) { spoil_any(g); }

  bool associated(GroupId g) {
    if (a_.sim_a_[g] == 0) return false;
    --a_.sim_a_[g];
    --a_.sim_f_[g];
    return true;
  }
  bool fresh(GroupId g) {
    if (pool_ == 0) return false;
    --pool_;
    opened(g);
    return true;
  }
  // A wholly evictable large page: no free small page, not associated with a free one.
  bool evict_large(GroupId g) {
    const LargePageId lp = a_.store_.earliest([this](std::uint32_t s) { return a_.rpos_[s]; }, src3_);
    if (lp == kNoLargePage) return false;
    const GroupId h = a_.pool_.owner_unchecked(lp);
    a_.sim_e_[h] -= a_.groups_[h].n;
    a_.store_.replay_mark(lp);
    a_.rpos_[src3_] = a_.store_.replay_source_next(src3_, a_.store_.source_after(src3_, lp));
    opened(g);
    return true;
  }
  bool any_free(GroupId g) {
    if (a_.sim_f_[g] == 0) return false;
    --a_.sim_f_[g];
    ++any_takes_;
    return true;
  }
  // Step 4b walks g's LRU from the front as the real evictions would: past pages in use
  // (stale entries) and pages whose large page this replay evicted; it stops at the first
  // cached page whose large page is not live (a free small page this replay took in a
  // mixed large page made that one live, as the real take does).
  bool evict_in_live(GroupId g) {
    spoil_any(g);  // step 4's takes all come before the group's first step 4b
    const Group& grp = a_.groups_[g];
    if (!lru_started_) {
      lcur_ = a_.store_.small_front(g);
      lru_started_ = true;
    }
    for (;; lcur_ = grp.lru.after(lcur_)) {
      if (lcur_ == kNullPage) return false;
      const LargePageId lp = grp.large_of(lcur_);
      if (grp.pg[lcur_].ref > 0 || (a_.store_.replay_skips(lp) && !a_.store_.replay_taken(lp))) continue;
      if (!a_.store_.replay_taken(lp) && !a_.live(g, lp)) return false;
      break;
    }
    if (a_.sim_e_[g] == 0) return false;
    --a_.sim_e_[g];
    lcur_ = grp.lru.after(lcur_);
    return true;
  }
  bool evict_small(GroupId g) {
    if (a_.sim_e_[g] == 0) return false;
    --a_.sim_e_[g];
    return true;
  }
  // Another group's large page of cached and free small pages; its free small pages leave that group
  // (and r's associated ones there, for a later group).
  bool reclaim_mixed(GroupId g) {
    spoil_any(g);  // step 4's takes all come before the group's first step 6
    if (!mixed_started_) {
      mcursor_ = a_.store_.mixed_front();
      mixed_started_ = true;
    }
    mcursor_ = a_.store_.replay_mixed_next(mcursor_);
    if (mcursor_ == kNoLargePage) return false;
    const GroupId h = a_.pool_.owner_unchecked(mcursor_);
    const std::uint32_t empty = a_.pool_.free_small_unchecked(mcursor_);
    a_.sim_e_[h] -= a_.store_.evictable_in(mcursor_);
    a_.sim_f_[h] -= empty;
    if (h > g && a_.sim_a_[h] > 0 && a_.groups_[h].alloc.associated_row(mcursor_) == r_) a_.sim_a_[h] -= empty;
    a_.store_.replay_mark(mcursor_);
    mcursor_ = a_.store_.replay_mixed_next(a_.store_.mixed_after(mcursor_));
    opened(g);
    return true;
  }

 private:
  // A large page opened for g (steps 2, 3, 6): the page taken, its other small pages r's.
  void opened(GroupId g) {
    a_.sim_a_[g] += a_.groups_[g].n - 1;
    a_.sim_f_[g] += a_.groups_[g].n - 1;
  }
  void spoil_any(GroupId g) {
    if (spoiled_any_ || any_takes_ == 0) return;
    a_.replay_spoil(g, r_, a_.groups_[g].alloc.first_with_free(), false, any_takes_);
    spoiled_any_ = true;
  }

  PageAllocation& a_;
  Row r_;
  std::uint64_t pool_;
  std::uint32_t src3_ = 0;
  LargePageId mcursor_ = kNoLargePage;
  bool mixed_started_ = false;
  std::uint64_t any_takes_ = 0;
  bool spoiled_any_ = false;
  bool lru_started_ = false;
  PageId lcur_ = kNullPage;  // step 4b's cursor in g's LRU
};

bool PageAllocation::surely_infeasible(std::span<const std::uint64_t> need,
                                       std::span<const std::uint64_t> leaving) const {
  if (slot_units_ == 0) return false;
  std::uint64_t want = 0, have = std::uint64_t{pool_.num_free()} * slot_units_;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const std::uint64_t w = slot_units_ / groups_[g].n;
    const std::uint64_t evictable = groups_[g].evictable - (leaving.empty() ? 0 : leaving[g]);
    want += need[g] * w;
    have += (std::uint64_t{groups_[g].alloc.num_free_small()} + evictable) * w;
  }
  return want > have;
}

int PageAllocation::quick_feasible(std::span<const std::uint64_t> need) const {
  // Sufficient, O(groups): group g needs at most ceil(need / n) large pages from steps 2
  // and 3 (each one's other small pages then serve it by step 1), and step 3 comes before the
  // steps that could fail. Under memory pressure this answers almost every call.
  std::uint64_t large_needed = 0;
  for (GroupId g = 0; g < groups_.size(); ++g) large_needed += (need[g] + groups_[g].n - 1) / groups_[g].n;
  if (large_needed <= std::uint64_t{pool_.num_free()} + store_.num_full_evictable()) return 1;
  // Necessary: a blocked queue head, retried every step, is usually refused here.
  if (surely_infeasible(need)) return 0;
  return -1;
}

bool PageAllocation::feasible(Row r, std::span<const std::uint64_t> need) {
  const int quick = quick_feasible(need);
  if constexpr (kCheckInternal) {
    if (quick >= 0) {
      const bool was = store_.keep_stale(true);  // the check leaves the lists as release builds have them
      const bool replayed = replay_feasible(r, need);
      store_.keep_stale(was);
      if (replayed != (quick == 1))
        fail("debug check: quick feasibility answer {} differs from the replay for request row {}", quick, r);
    }
  }
  return quick >= 0 ? quick == 1 : replay_feasible(r, need);
}

// Exact, because allocate() has no rollback: steps 1 and 4 take free small pages from the
// request's and the group's large pages in list order, and replay_spoil walks those lists
// the same way, so a mixed page that loses a free small page to them is not counted for step
// 6, and a mixed page step 6 reclaims takes its free small pages away from the groups after it.
bool PageAllocation::replay_feasible(Row r, std::span<const std::uint64_t> need) {
  store_.replay_begin();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    sim_a_[g] = need[g] > 0 ? grp.alloc.associated_free_small(r) : 0;
    sim_f_[g] = grp.alloc.num_free_small();
    sim_e_[g] = grp.evictable;
  }
  for (std::uint32_t s = 0; s < store_.num_sources(); ++s) rpos_[s] = store_.source_front(s);
  ReplaySteps steps(*this, r, pool_.num_free());
  for (GroupId g = 0; g < groups_.size(); ++g) {
    if (need[g] == 0) continue;
    steps.begin_group(g, need[g]);
    for (std::uint64_t k = 0; k < need[g]; ++k)
      if (!take_one(steps, g, pack_)) return false;
    steps.end_group(g);
  }
  return true;
}

// Marks the mixed large pages that `takes` small-page takes of group g fill, walking the list the
// allocator takes them from (r's associated pages for step 1, the group's pages for step
// 4, where r's own are already full) in its order, each until full.
void PageAllocation::replay_spoil(GroupId g, Row r, LargePageId first, bool by_request, std::uint64_t takes) {
  const SmallPageAllocator& alloc = groups_[g].alloc;
  for (LargePageId lp = first; lp != kNoLargePage && takes > 0;) {
    const LargePageId next = by_request ? alloc.next_associated(lp) : alloc.next_with_free(lp);
    if (!store_.replay_skips(lp) && (by_request || alloc.associated_row(lp) != r)) {
      takes -= std::min<std::uint64_t>(takes, pool_.free_small_unchecked(lp));
      if (store_.mixed(lp)) store_.replay_mark_taken(lp);
    }
    lp = next;
  }
}

}  // namespace kvmm::detail
