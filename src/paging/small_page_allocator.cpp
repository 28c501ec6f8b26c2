#include "kvmm/paging/small_page_allocator.hpp"

#include <limits>

namespace kvmm {

// The arguments, checked before anything is claimed or allocated; returns pages_per_large.
std::uint32_t SmallPageAllocator::validated(GroupId group, std::uint32_t pages_per_large, const LargePagePool& pool,
                                            std::uint32_t max_requests) {
  if (group == kNoGroup) fail("group = {} (kNoGroup): not a group id", group);
  if (pages_per_large == 0) fail("pages_per_large = 0: must be >= 1");
  if (max_requests == 0 || max_requests == kNoRequest) fail("max_requests = {}: must be in [1, 2^32-1)", max_requests);
  if (std::uint64_t{pool.capacity()} * pages_per_large >= kNullPage)
    fail("pages_per_large = {}: {} large pages x {} small pages overflow 32-bit page ids", pages_per_large,
         pool.capacity(), pages_per_large);
  return pages_per_large;
}

SmallPageAllocator::SmallPageAllocator(GroupId group, std::uint32_t pages_per_large, LargePagePool& pool,
                                       std::uint32_t max_requests, Placement placement)
    : group_(group),
      n_(validated(group, pages_per_large, pool, max_requests)),
      pool_(pool),
      placement_(placement),
      claim_(pool, group) {
  const std::uint64_t total = std::uint64_t{pool.capacity()} * pages_per_large;
  entry_.assign(total, kNone);
  req_head_.assign(max_requests, kNone);
  req_epoch_.assign(max_requests, 0);
}

PageId SmallPageAllocator::take_fresh(Row r) {
  const LargePageId large = pool_.try_allocate(group_);
  if (large == kNoLargePage) return kNullPage;
  const std::uint32_t lp = large.index;
  LargeRecord& L = rec(lp);
  L.free_head = kNone;
  L.free_count = n_ - 1;
  L.bump = 1;
  L.assoc = r;
  L.assoc_epoch = r == kNoRow ? 0 : req_epoch_[r.index];
  L.rprev = L.rnext = L.gprev = L.gnext = kNone;
  const PageId s = lp * n_;
  entry_[s] = kAllocated;
  num_free_ += n_ - 1;
  ++num_used_;
  ++num_large_;
  if (L.free_count > 0) link(lp);
  return s;
}

void SmallPageAllocator::link(std::uint32_t lp) {
  LargeRecord& L = rec(lp);
  L.gprev = kNone;
  L.gnext = group_head_;
  if (group_head_ != kNone) rec(group_head_).gprev = lp;
  group_head_ = lp;
  if (L.assoc != kNoRow && L.assoc_epoch != req_epoch_[L.assoc.index]) L.assoc = kNoRow;
  if (L.assoc != kNoRow) {
    std::uint32_t& head = req_head_[L.assoc.index];
    L.rprev = kNone;
    L.rnext = head;
    if (head != kNone) rec(head).rprev = lp;
    head = lp;
  }
}

void SmallPageAllocator::unlink(std::uint32_t lp) {
  LargeRecord& L = rec(lp);
  if (L.gprev != kNone)
    rec(L.gprev).gnext = L.gnext;
  else
    group_head_ = L.gnext;
  if (L.gnext != kNone) rec(L.gnext).gprev = L.gprev;
  L.gprev = L.gnext = kNone;
  if (L.assoc != kNoRow && L.assoc_epoch == req_epoch_[L.assoc.index]) {
    if (L.rprev != kNone)
      rec(L.rprev).rnext = L.rnext;
    else
      req_head_[L.assoc.index] = L.rnext;
    if (L.rnext != kNone) rec(L.rnext).rprev = L.rprev;
  }
  L.rprev = L.rnext = kNone;
}

void SmallPageAllocator::release_request(Row r) {
  if (r.index >= req_head_.size()) bad_request(r);
  for (std::uint32_t lp = req_head_[r.index]; lp != kNone;) {
    LargeRecord& L = rec(lp);
    const std::uint32_t next = L.rnext;
    L.rprev = L.rnext = kNone;
    L.assoc = kNoRow;
    lp = next;
  }
  req_head_[r.index] = kNone;
  // Full large pages still name r; the new epoch makes them forget it when they relink.
  ++req_epoch_[r.index];
}

Row SmallPageAllocator::associated_row(LargePageId large) const {
  if (large.index >= pool_.capacity()) fail("large page id = {}: pool capacity is {}", large.index, pool_.capacity());
  if (pool_.owner(large) != group_) return kNoRow;
  const LargeRecord& L = pool_.record(large);
  if (L.assoc == kNoRow || L.assoc_epoch != req_epoch_[L.assoc.index]) return kNoRow;
  return L.assoc;
}

std::uint32_t SmallPageAllocator::free_in_large(LargePageId large) const {
  if (large.index >= pool_.capacity()) fail("large page id = {}: pool capacity is {}", large.index, pool_.capacity());
  return pool_.owner(large) == group_ ? pool_.record(large).free_count : 0;
}

void SmallPageAllocator::bad_request(Row r) const {
  fail("request = {}: out of range, max_requests is {}", r, req_head_.size());
}

void SmallPageAllocator::bad_free(PageId s) const {
  if (s >= entry_.size()) fail("small page id = {}: group {} has {} small page ids", s, group_, entry_.size());
  fail("small page id = {}: double free or never allocated in group {}", s, group_);
}

// Long by design (lint): an invariant checker, a list of independent recounts read top to bottom.
// NOLINTBEGIN(readability-function-cognitive-complexity)
void SmallPageAllocator::check_invariants() const {
  // NOLINTEND(readability-function-cognitive-complexity)
  std::uint32_t used = 0, free = 0, held = 0, in_group_list = 0;
  for (std::uint32_t lp = 0; lp < pool_.capacity(); ++lp) {
    const bool mine = pool_.owner(LargePageId{lp}) == group_;
    std::uint32_t alloc_here = 0;
    for (std::uint32_t k = 0; k < n_; ++k) alloc_here += entry_[lp * n_ + k] == kAllocated;
    if (!mine) {
      if (alloc_here != 0) fail("invariant: large page {} not owned by group {} has small pages", lp, group_);
      continue;
    }
    ++held;
    const LargeRecord& L = rec(lp);
    if (alloc_here == 0) fail("invariant: large page {} of group {} is empty but held", lp, group_);
    if (alloc_here + L.free_count != n_)
      fail("invariant: large page {} counts {} used + {} free != {}", lp, alloc_here, L.free_count, n_);
    std::uint32_t listed = 0;
    for (std::uint32_t s = L.free_head; s != kNone; s = entry_[s]) {
      if (s / n_ != lp || entry_[s] == kAllocated)
        fail("invariant: free list of large page {} holds bad page {}", lp, s);
      if (++listed > n_) fail("invariant: free list of large page {} has a cycle", lp);
    }
    for (std::uint32_t k = L.bump; k < n_; ++k)
      if (entry_[lp * n_ + k] == kAllocated) fail("invariant: unhanded slot {} of large page {} is allocated", k, lp);
    if (listed + (n_ - L.bump) != L.free_count)
      fail("invariant: large page {} free_count {} != listed {} + unhanded {}", lp, L.free_count, listed, n_ - L.bump);
    used += alloc_here;
    free += L.free_count;
  }
  for (std::uint32_t lp = group_head_; lp != kNone; lp = rec(lp).gnext) {
    if (pool_.owner(LargePageId{lp}) != group_ || rec(lp).free_count == 0)
      fail("invariant: group list of group {} holds large page {} without free slots", group_, lp);
    if (++in_group_list > pool_.capacity()) fail("invariant: group list of group {} has a cycle", group_);
  }
  std::uint32_t with_free = 0;
  for (std::uint32_t lp = 0; lp < pool_.capacity(); ++lp)
    with_free += pool_.owner(LargePageId{lp}) == group_ && rec(lp).free_count > 0;
  if (with_free != in_group_list)
    fail("invariant: group {} lists {} large pages with free slots, has {}", group_, in_group_list, with_free);
  for (Row r{0}; r.index < req_head_.size(); ++r.index) {
    std::uint32_t steps = 0;
    for (std::uint32_t lp = req_head_[r.index]; lp != kNone; lp = rec(lp).rnext) {
      if (associated_row(LargePageId{lp}) != r || rec(lp).free_count == 0)
        fail("invariant: request {}'s list in group {} holds large page {} wrongly", r, group_, lp);
      if (++steps > pool_.capacity()) fail("invariant: request {}'s list has a cycle", r);
    }
  }
  if (used != num_used_ || free != num_free_ || held != num_large_)
    fail("invariant: group {} counters used {}/{} free {}/{} large {}/{}", group_, num_used_, used, num_free_, free,
         num_large_, held);
}

}  // namespace kvmm
