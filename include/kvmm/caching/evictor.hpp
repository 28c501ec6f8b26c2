// LruEvictor: evictable pages (small pages of one group, or large pages) in eviction
// order: retention priority ascending, then last access step ascending, then prefix
// length descending (Jenga §5.1: balanced and aligned eviction). Intrusive lists in flat
// arrays indexed by page id, plus a table of runs (pages with equal keys are contiguous).
// pop/erase are O(1); insert is O(1) when a run with the same key exists (requests
// released in the same step) or when it follows the previous insert (a request's pages,
// released last page first); otherwise it walks back over runs (distinct keys) newer than
// the new page. Never touches the heap after construction.
#pragma once

#include "kvmm/error.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <vector>

namespace kvmm {

struct EvictionKey {
  std::uint64_t time = 0;        // last access step
  std::uint64_t prefix_len = 0;  // set_prefix_length value; longer is evicted first
  friend bool operator==(const EvictionKey&, const EvictionKey&) = default;
  // True when a is evicted before b.
  friend bool evicted_before(const EvictionKey& a, const EvictionKey& b) {
    return a.time < b.time || (a.time == b.time && a.prefix_len > b.prefix_len);
  }
};

class LruEvictor {
 public:
  static constexpr std::uint32_t kLevels = 4;  // retention priorities 0 (evicted first) .. 3

  explicit LruEvictor(std::uint32_t capacity);

  std::uint32_t size() const { return size_; }
  bool contains(PageId id) const { return id < level_.size() && level_[id] != kOut; }
  const EvictionKey& key(PageId id) const { return key_[id]; }

  // Raises kvmm::Error for an id out of range or already present.
  void insert(PageId id, const EvictionKey& k, std::uint32_t level);
  // Raises kvmm::Error for an id not present.
  void erase(PageId id);

  // The next page to evict, kNullPage when empty. O(levels).
  PageId front() const {
    for (const List& l : lists_)
      if (l.head != kNone) return l.head;
    return kNullPage;
  }
  // Iteration in eviction order: front() then after(id) until kNullPage.
  PageId after(PageId id) const {
    if (next_[id] != kNone) return next_[id];
    for (std::uint32_t lv = level_[id] + 1u; lv < kLevels; ++lv)
      if (lists_[lv].head != kNone) return lists_[lv].head;
    return kNullPage;
  }

 private:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  static constexpr std::uint8_t kOut = 0xff;
  struct List {
    std::uint32_t head = kNone, tail = kNone;
  };
  struct Run {
    std::uint64_t time = 0;
    std::uint64_t len = 0;
    std::uint32_t level = kNone;  // kNone: empty slot
    std::uint32_t head = kNone, tail = kNone;
  };
  std::uint64_t home(std::uint32_t level, const EvictionKey& k) const {
    std::uint64_t h = k.time * 0x9e3779b97f4a7c15ULL ^ (k.prefix_len + level) * 0xc2b2ae3d27d4eb4fULL;
    h ^= h >> 29;
    return (h * 0xbf58476d1ce4e5b9ULL >> 17) & run_mask_;
  }
  std::uint64_t find_run(std::uint32_t level, const EvictionKey& k) const;
  void add_run(std::uint32_t level, const EvictionKey& k, PageId id);
  void drop_run(std::uint64_t slot);

  List lists_[kLevels];
  std::vector<std::uint32_t> prev_, next_;
  std::vector<EvictionKey> key_;
  std::vector<std::uint8_t> level_;
  std::vector<Run> runs_;
  std::uint64_t run_mask_ = 0;
  std::uint32_t size_ = 0;
  std::uint32_t hint_ = kNone;  // the last inserted page
};

}  // namespace kvmm
