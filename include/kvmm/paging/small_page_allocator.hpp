// SmallPageAllocator: the second level of Jenga's allocator, one per layer group. It
// carves large pages of its group into n = large/small small pages and places them
// request-aware (Jenga §4.3): (1) a free small page in a large page associated with
// the request, (2) a fresh large page, associated with the request, (3) any free small
// page of the group. A large page goes back to the pool the moment its last small page
// is freed. allocate/free are O(1) over intrusive lists in flat arrays; no heap use
// after construction. Small page id s lives in large page s / n at slot s % n.
#pragma once

#include "kvmm/detail/prefetch.hpp"
#include "kvmm/error.hpp"
#include "kvmm/paging/large_page_pool.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <optional>
#include <vector>

namespace kvmm {

enum class Placement : std::uint8_t {
  kRequestAware,  // Jenga §4.3 steps 1-3
  kInterleaved,   // naive first fit over the group (Jenga Fig. 8a), for comparison
};

class SmallPageAllocator {
 public:
  // Raises kvmm::Error, before allocating, for group = kNoGroup, pages_per_large = 0,
  // max_requests outside [1, 2^32-1), small page ids that would not fit below 2^32-1, or
  // a group that another live SmallPageAllocator of `pool` already serves.
  SmallPageAllocator(GroupId group, std::uint32_t pages_per_large, LargePagePool& pool, std::uint32_t max_requests,
                     Placement placement = Placement::kRequestAware);

  // O(1). A fresh large page (step 2) is taken only while the pool keeps more than
  // `pool_reserve` free pages, so a multi-group allocation can keep the large pages
  // other groups need; without a free small page the reserve is ignored.
  // std::nullopt when neither a free small page nor a free large page exists.
  std::optional<PageId> allocate(Row r, std::uint32_t pool_reserve = 0) {
    if (r.index >= req_head_.size()) bad_request(r);
    std::uint32_t lp = kNone;
    if (placement_ == Placement::kRequestAware) {
      lp = req_head_[r.index];
      if (lp != kNone) return take(lp);
      if (pool_.num_free() > pool_reserve)
        if (const PageId p = take_fresh(r); p != kNullPage) return p;
    }
    if (group_head_ != kNone) return take(group_head_);
    if (pool_.num_free() > 0)
      if (const PageId p = take_fresh(placement_ == Placement::kRequestAware ? r : kNoRow); p != kNullPage) return p;
    return std::nullopt;
  }

  // The three placement steps on their own, for callers that interleave other steps
  // (eviction, Jenga §5.4). Each is O(1) and returns kNullPage when it cannot serve.
  // Step 1: a free small page in a large page associated with r.
  PageId try_associated(Row r) {
    if (r.index >= req_head_.size()) bad_request(r);
    if (req_head_[r.index] == kNone) return kNullPage;
    return take(req_head_[r.index]);
  }
  // Step 2: a fresh large page from the pool, associated with r (kNoRow: none).
  PageId try_fresh(Row r) {
    if (r != kNoRow && r.index >= req_head_.size()) bad_request(r);
    if (pool_.num_free() == 0) return kNullPage;
    return take_fresh(r);
  }
  // The take order, for a caller that replays it (the manager's feasibility check): the
  // page after lp in its request's list (step 1) or in the group's list of pages with
  // free small pages (step 3); kNoLargePage at the end. O(1).
  LargePageId next_associated(LargePageId lp) const { return LargePageId{pool_.record(lp).rnext}; }
  LargePageId next_with_free(LargePageId lp) const { return LargePageId{pool_.record(lp).gnext}; }
  // Step 3: any free small page of the group.
  PageId try_any() {
    if (group_head_ == kNone) return kNullPage;
    return take(group_head_);
  }

  // O(1). Raises kvmm::Error for a page out of range or not allocated.
  void free(PageId s) {
    if (s >= entry_.size() || entry_[s] != kAllocated) bad_free(s);
    const std::uint32_t lp = s / n_;
    LargeRecord& L = rec(lp);
#if KVMM_DEBUG_CHECKS
    if (L.owner != group_ || L.free_count >= n_)
      fail("debug check: group {} frees page {} of large page {} (owner {}, {} free)", group_, s, lp, L.owner,
           L.free_count);
#endif
    entry_[s] = L.free_head;
    L.free_head = s;
    ++L.free_count;
    --num_used_;
    ++num_free_;
    if (L.free_count == n_) {
      if (n_ > 1) unlink(lp);
      num_free_ -= n_;
      --num_large_;
      L.assoc = kNoRow;
      pool_.free(LargePageId{lp});
    } else if (L.free_count == 1) {
      link(lp);
    }
  }

  // Ends request r's association with its large pages (they stay with the group and
  // serve step 3). O(large pages of r that have free small pages).
  void release_request(Row r);

  bool is_allocated(PageId s) const { return s < entry_.size() && entry_[s] == kAllocated; }
  // Starts loading what free(s) reads of s (a hint; s must be a page id of this group).
  void prefetch(PageId s) const { detail::prefetch_read(&entry_[s]); }
  GroupId group() const { return group_; }
  std::uint32_t pages_per_large() const { return n_; }
  LargePageId large_page_of(PageId s) const { return LargePageId{s / n_}; }
  // The request a large page of this group is associated with (kNoRow if none).
  Row associated_row(LargePageId large) const;
  std::uint32_t num_used_small() const { return num_used_; }
  // Free small pages inside large pages this group holds.
  std::uint32_t num_free_small() const { return num_free_; }
  std::uint32_t num_large_pages() const { return num_large_; }
  // Free small pages in large page `large` (0 if the group does not hold it).
  std::uint32_t free_in_large(LargePageId large) const;
  // Free small pages in large pages associated with r (what step 1 can serve).
  // O(associated large pages that have a free slot).
  // The first large page associated with r that has a free slot (kNoLargePage: none);
  // the next one is next_associated(lp). Step 1 fills them in this order, each until full.
  LargePageId first_associated(Row r) const {
    if (r.index >= req_head_.size()) bad_request(r);
    return LargePageId{req_head_[r.index]};  // kNone is kNoLargePage's index
  }
  // The first large page of the group with a free slot (kNoLargePage: none); the next one
  // is next_with_free(lp). Step 3 (try_any) fills them in this order.
  LargePageId first_with_free() const { return LargePageId{group_head_}; }
  std::uint32_t associated_free_small(Row r) const {
    if (r.index >= req_head_.size()) bad_request(r);
    std::uint32_t n = 0;
    for (std::uint32_t lp = req_head_[r.index]; lp != kNone; lp = rec(lp).rnext) n += rec(lp).free_count;
    return n;
  }

  // Recomputes every count and list from scratch; raises kvmm::Error on a mismatch.
  // O(capacity * n): for tests and KVMM_DEBUG_CHECKS.
  void check_invariants() const;

 private:
  static std::uint32_t validated(GroupId group, std::uint32_t pages_per_large, const LargePagePool& pool,
                                 std::uint32_t max_requests);
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  static_assert(kNone == kNoLargePage.index, "the intrusive lists' end is the no-large-page id");
  static constexpr std::uint32_t kAllocated = kNone - 1;
  using LargeRecord = LargePageRecord;
  // The intrusive lists (LargePageRecord's links, req_head_, group_head_) hold bare large
  // page indices: they are this allocator's and the pool's private words. rec() names one.
  LargeRecord& rec(std::uint32_t lp) { return pool_.record(LargePageId{lp}); }
  const LargeRecord& rec(std::uint32_t lp) const { return pool_.record(LargePageId{lp}); }

  PageId take(std::uint32_t lp) {
    LargeRecord& L = rec(lp);
#if KVMM_DEBUG_CHECKS
    if (L.owner != group_ || L.free_count == 0 || L.free_count > n_)
      fail("debug check: group {} takes from large page {} (owner {}, {} free)", group_, lp, L.owner, L.free_count);
#endif
    PageId s;
    if (L.free_head != kNone) {
      s = L.free_head;
      L.free_head = entry_[s];
    } else {
      s = lp * n_ + L.bump++;
    }
    entry_[s] = kAllocated;
    ++num_used_;
    --num_free_;
    if (--L.free_count == 0) unlink(lp);
    return s;
  }

  static std::optional<PageId> optional(PageId p) {
    if (p == kNullPage) return std::nullopt;
    return p;
  }
  // Opens a large page from the pool for r and hands out its first slot; it joins the
  // free lists only if slots remain (never for n = 1). kNullPage if the pool has none
  // (or its LargePageSource cannot back one).
  PageId take_fresh(Row r);
  void link(std::uint32_t lp);
  void unlink(std::uint32_t lp);
  [[noreturn, gnu::cold]] void bad_request(Row r) const;
  [[noreturn, gnu::cold]] void bad_free(PageId s) const;

  GroupId group_;
  std::uint32_t n_;
  LargePagePool& pool_;
  Placement placement_;
  GroupClaim claim_;  // one allocator per group of a pool
  // Per small page: kAllocated, or the next free page of its large page (kNone: last).
  // One array, so an allocation or a free touches one cache line of it.
  std::vector<std::uint32_t> entry_;
  std::vector<std::uint32_t> req_head_;
  std::vector<std::uint32_t> req_epoch_;
  std::uint32_t group_head_ = kNone;
  std::uint32_t num_used_ = 0;
  std::uint32_t num_free_ = 0;
  std::uint32_t num_large_ = 0;
};

}  // namespace kvmm
