// LruEvictor: evictable pages (small pages of one group, or large pages) in eviction
// order: retention priority ascending, then last access step ascending, then prefix
// length descending (Jenga §5.1: balanced and aligned eviction). Intrusive lists in flat
// arrays indexed by page id. pop/erase are O(1); insert walks back from the tail past
// entries that must stay after it, which is O(1) when pages are released in step order
// and, within one step, in descending prefix order (what the manager does: a request's
// pages are released last page first); never touches the heap after construction.
#pragma once

#include "kvmm/error.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <vector>

namespace kvmm {

struct EvictionKey {
  std::uint64_t time = 0;        // last access step
  std::uint64_t prefix_len = 0;  // set_prefix_length value; longer is evicted first
  // True when a is evicted before b.
  friend bool evicted_before(const EvictionKey& a, const EvictionKey& b) {
    return a.time < b.time || (a.time == b.time && a.prefix_len > b.prefix_len);
  }
};

class LruEvictor {
 public:
  static constexpr std::uint32_t kLevels = 4;  // retention priorities 0 (evicted first) .. 3

  explicit LruEvictor(std::uint32_t capacity)
      : prev_(capacity, kNone), next_(capacity, kNone), key_(capacity), level_(capacity, kOut) {}

  std::uint32_t size() const { return size_; }
  bool contains(PageId id) const { return id < level_.size() && level_[id] != kOut; }
  const EvictionKey& key(PageId id) const { return key_[id]; }

  void insert(PageId id, const EvictionKey& k, std::uint32_t level) {
    if (id >= level_.size()) fail("page id = {}: evictor capacity is {}", id, level_.size());
    if (level_[id] != kOut) fail("page id = {}: already evictable", id);
    if (level >= kLevels) level = kLevels - 1;
    key_[id] = k;
    level_[id] = static_cast<std::uint8_t>(level);
    List& l = lists_[level];
    std::uint32_t after = l.tail;
    while (after != kNone && evicted_before(k, key_[after])) after = prev_[after];
    prev_[id] = after;
    next_[id] = after == kNone ? l.head : next_[after];
    if (next_[id] != kNone) prev_[next_[id]] = id; else l.tail = id;
    if (after != kNone) next_[after] = id; else l.head = id;
    ++size_;
  }

  void erase(PageId id) {
    if (!contains(id)) fail("page id = {}: not evictable", id);
    List& l = lists_[level_[id]];
    if (prev_[id] != kNone) next_[prev_[id]] = next_[id]; else l.head = next_[id];
    if (next_[id] != kNone) prev_[next_[id]] = prev_[id]; else l.tail = prev_[id];
    prev_[id] = next_[id] = kNone;
    level_[id] = kOut;
    --size_;
  }

  // The next page to evict, kNullPage when empty. O(levels).
  PageId front() const {
    for (const List& l : lists_)
      if (l.head != kNone) return l.head;
    return kNullPage;
  }
  // Iteration in eviction order: first() then after(id) until kNullPage.
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
  List lists_[kLevels];
  std::vector<std::uint32_t> prev_, next_;
  std::vector<EvictionKey> key_;
  std::vector<std::uint8_t> level_;
  std::uint32_t size_ = 0;
};

}  // namespace kvmm
