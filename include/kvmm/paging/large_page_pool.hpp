// LargePagePool: the first level of Jenga's two-level allocator. Hands out large page
// ids [0, capacity) and records which layer group owns each one. allocate/free are
// O(1) (a LIFO stack in a flat array, so recently freed, cache-warm pages go out
// first) and never touch the heap after construction. Each large page carries one
// record (owner + the owning group's bookkeeping) in one shared array, so all groups'
// live pages sit densely together: one cache line per large page touched.
#pragma once

#include "kvmm/detail/prefetch.hpp"
#include "kvmm/error.hpp"
#include "kvmm/types.hpp"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

namespace kvmm {

inline constexpr GroupId kNoGroup = ~GroupId{0};

// A provider of large page ids that need backing first (memory/ArenaPagePool backs
// chunks of an elastic arena and prefers busy chunks). A pool built over a source asks
// it for every id; the hot path of a plain pool does not pay for this.
class LargePageSource {
 public:
  virtual ~LargePageSource() = default;
  virtual std::uint32_t capacity() const = 0;
  // Free ids, including ones whose memory must still be backed.
  virtual std::uint32_t num_free() const = 0;
  // std::nullopt when no id is free or no memory can be backed for one.
  virtual std::optional<LargePageId> acquire(GroupId owner) = 0;
  virtual void release(LargePageId id) = 0;
  // A page acquired for one owner (a reservation) now serves another. Default: nothing.
  virtual void reassign(LargePageId id, GroupId owner) {
    (void)id;
    (void)owner;
  }
};

// Per-large-page record. `owner` belongs to the pool; the other words belong to the
// owning group's SmallPageAllocator while it holds the page.
struct LargePageRecord {
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  GroupId owner = kNoGroup;
  std::uint32_t free_head = kNone;  // intrusive list of returned small pages
  std::uint32_t free_count = 0;     // free small pages (returned + never handed out)
  std::uint32_t bump = 0;           // slots [bump, n) never handed out yet
  Row assoc = kNoRow;               // the request row this large page is associated with
  std::uint32_t assoc_epoch = 0;
  std::uint32_t rprev = kNone, rnext = kNone;  // request's list of pages with free slots
  std::uint32_t gprev = kNone, gnext = kNone;  // group's list of pages with free slots
};

class LargePagePool {
 public:
  // Raises kvmm::Error, before allocating anything, for capacity = 2^32-1 (the null
  // page id) or a source of another capacity.
  explicit LargePagePool(std::uint32_t capacity, LargePageSource* source = nullptr)
      : free_(validated(capacity, source)), records_(capacity), source_(source) {
    // Low ids on top of the stack: a fresh pool hands out 0, 1, 2, ...
    for (std::uint32_t i = 0; i < capacity; ++i) free_[i] = LargePageId{capacity - 1 - i};
    top_ = source ? 0 : capacity;  // a source keeps its own free ids; the stack holds reservations
  }

  // O(1). std::nullopt when every large page is in use (not an error); kvmm::Error for
  // owner = kNoGroup (the page would read as free).
  std::optional<LargePageId> allocate(GroupId owner) {
    const LargePageId id = try_allocate(owner);
    if (id == kNoLargePage) return std::nullopt;
    return id;
  }
  // The same with kNoLargePage for none: hot paths return the id in a register (an optional
  // built in memory would wait behind the store to the page's record).
  LargePageId try_allocate(GroupId owner) {
    if (owner == kNoGroup) [[unlikely]]
      bad_owner();
    if (source_) [[unlikely]] {
      if (top_ == 0) return reserving_ ? kNoLargePage : allocate_from_source(owner).value_or(kNoLargePage);
      const LargePageId id = free_[--top_];  // a kept page, backed already
      records_[id.index].owner = owner;
      source_->reassign(id, owner);
      return id;
    }
    if (top_ == 0) return kNoLargePage;
    const LargePageId id = free_[--top_];
    records_[id.index].owner = owner;
    return id;
  }

  // O(1). Raises kvmm::Error for an id out of range or already free.
  void free(LargePageId id) {
    if (id.index >= records_.size()) fail("large page id = {}: pool capacity is {}", id.index, records_.size());
    if (records_[id.index].owner == kNoGroup) fail("large page id = {}: double free (page is already free)", id.index);
    records_[id.index].owner = kNoGroup;
    if (source_ && !reserving_ && !keep_freed_) {
      source_->release(id);
      return;
    }
    free_[top_++] = id;  // with a source: kept (backed) until release_kept()
  }

  // Over a source whose acquire may fail to back a page, the pool can keep pages: kept
  // pages are backed and free, allocations take them first, and release_kept() gives them
  // back to the source. reserve(n) keeps up to n pages (it stops at the first the source
  // cannot back) and returns how many; until end_reservation() the pool offers only kept
  // pages (num_free() counts them, allocations never ask the source) and freed pages are
  // kept: a run of allocations and evictions decided on num_free() cannot fail half way.
  // keep_freed(true) keeps every freed page, so memory a plan of this step still reads
  // (a swap-out copy) stays backed until release_kept(). A source that raises in reserve
  // leaves the pages kept so far kept. Without a source: reserve is min(n, num_free()) and
  // the rest does nothing. O(n).
  std::uint32_t reserve(std::uint32_t n) {
    if (!source_) return std::min(n, top_);
    reserving_ = true;
    try {
      while (top_ < n) {
        const std::optional<LargePageId> id = source_->acquire(0);
        if (!id) break;
        free_[top_++] = *id;
      }
    } catch (...) {
      reserving_ = false;
      throw;
    }
    return top_;
  }
  void end_reservation() { reserving_ = false; }
  void keep_freed(bool on) { keep_freed_ = on; }
  void release_kept() {
    if (!source_) return;
    std::exception_ptr first;
    while (top_ > 0) {
      try {
        source_->release(free_[--top_]);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }
  bool has_source() const { return source_ != nullptr; }

  // One SmallPageAllocator serves a group of a pool: a second one for the same group id
  // would carve the same large pages under one owner id and corrupt both. claim_group
  // raises kvmm::Error for a group already claimed; the allocator's destructor releases
  // its claim (GroupClaim). O(groups claimed).
  void claim_group(GroupId g) {
    for (const GroupId c : claimed_)
      if (c == g) fail("group = {}: another SmallPageAllocator already serves group {} of this pool", g, g);
    claimed_.push_back(g);
  }
  void release_group(GroupId g) noexcept {
    for (std::size_t i = 0; i < claimed_.size(); ++i)
      if (claimed_[i] == g) {
        claimed_[i] = claimed_.back();
        claimed_.pop_back();
        return;
      }
  }

  std::uint32_t capacity() const { return static_cast<std::uint32_t>(records_.size()); }
  std::uint32_t num_free() const { return source_ && !reserving_ ? source_->num_free() + top_ : top_; }
  std::uint32_t num_used() const { return capacity() - num_free(); }
  // kNoGroup while the page is free.
  GroupId owner(LargePageId id) const {
    if (id.index >= records_.size()) fail("large page id = {}: pool capacity is {}", id.index, records_.size());
    return records_[id.index].owner;
  }
  // Recomputes the counts: every id on the free stack is in range, free (owner kNoGroup)
  // and listed once; the owned pages number capacity - num_free(). Raises kvmm::Error on
  // a mismatch. O(capacity): for tests and KVMM_DEBUG_CHECKS.
  void check_invariants() const {
    std::uint32_t owned = 0;
    for (const LargePageRecord& s : records_) owned += s.owner != kNoGroup;
    if (owned != num_used()) fail("invariant: {} large pages have an owner, {} are in use", owned, num_used());
    if (source_ && top_ == 0) return;  // the source keeps its own free list
    std::vector<std::uint8_t> seen(records_.size(), 0);
    for (std::uint32_t i = 0; i < top_; ++i) {
      const std::uint32_t id = free_[i].index;
      if (id >= records_.size() || records_[id].owner != kNoGroup || seen[id]++)
        fail("invariant: free stack entry {} holds large page {} (out of range, owned or listed twice)", i, id);
    }
  }

  // Unchecked reads for hot paths (id < capacity()): the owner, and how many free small
  // pages its group has in the page. O(1), one cache line.
  GroupId owner_unchecked(LargePageId id) const { return records_[id.index].owner; }
  std::uint32_t free_small_unchecked(LargePageId id) const { return records_[id.index].free_count; }
  // Requests the record's line ahead of those reads (kvmm/detail/prefetch.hpp's switch).
  void prefetch(LargePageId id) const { detail::prefetch_read(&records_[id.index]); }

 private:
  // The record of large page `id`, unchecked: the owning SmallPageAllocator's alone.
  friend class SmallPageAllocator;
  LargePageRecord& record(LargePageId id) { return records_[id.index]; }
  const LargePageRecord& record(LargePageId id) const { return records_[id.index]; }

  static std::uint32_t validated(std::uint32_t capacity, const LargePageSource* source) {
    if (capacity == kNullPage) fail("capacity = {}: must be below 2^32-1 (the null page id)", capacity);
    if (source && source->capacity() != capacity)
      fail("capacity = {}: the large page source holds {} pages", capacity, source->capacity());
    return capacity;
  }
  [[noreturn, gnu::cold]] static void bad_owner() {
    fail("owner = {} (kNoGroup): a large page must be allocated to a group", kNoGroup);
  }

  std::vector<LargePageId> free_;  // stack of free ids, [0, top_)
  std::optional<LargePageId> allocate_from_source(GroupId owner) {
    const std::optional<LargePageId> id = source_->acquire(owner);
    if (id) records_[id->index].owner = owner;
    return id;
  }

  std::vector<LargePageRecord> records_;
  LargePageSource* source_ = nullptr;
  std::uint32_t top_ = 0;  // free stack; with a source, the reserved pages
  bool reserving_ = false;
  bool keep_freed_ = false;
  std::vector<GroupId> claimed_;  // groups a SmallPageAllocator serves
};

// A SmallPageAllocator's claim on its group of a pool (LargePagePool::claim_group), given
// back when it is destroyed; a moved-from claim gives back nothing.
class GroupClaim {
 public:
  GroupClaim(LargePagePool& pool, GroupId g) : pool_(&pool), group_(g) { pool.claim_group(g); }
  GroupClaim(GroupClaim&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), group_(o.group_) {}
  GroupClaim(const GroupClaim&) = delete;
  GroupClaim& operator=(const GroupClaim&) = delete;
  GroupClaim& operator=(GroupClaim&&) = delete;
  ~GroupClaim() {
    if (pool_) pool_->release_group(group_);
  }

 private:
  LargePagePool* pool_;
  GroupId group_;
};

}  // namespace kvmm
