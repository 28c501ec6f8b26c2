// LruEvictor: evictable pages (small pages of a group, or large pages) in eviction order:
// retention priority, then last access step ascending, then prefix length descending
// (Jenga §5.1). Intrusive lists in one flat array of 32-byte nodes (key, links, level:
// one cache line per page touched); the two end nodes of a run of 2+ equal keys point at
// each other, so a walk skips a run in O(1). erase/front O(1), insert O(1) when it follows
// the previous insert (how the manager releases), else O(runs walked past). No heap use
// after construction.
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
  bool contains(PageId id) const { return id < node_.size() && node_[id].level != kOut; }
  const EvictionKey& key(PageId id) const { return node_[id].key; }
  // Starts loading id's entry (no effect on the order).
  void prefetch(PageId id) const { __builtin_prefetch(&node_[id]); }

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
    const Node& x = node_[id];
    if (x.next != kNone) return x.next;
    for (std::uint32_t lv = x.level + 1u; lv < kLevels; ++lv)
      if (lists_[lv].head != kNone) return lists_[lv].head;
    return kNullPage;
  }

 private:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  static constexpr std::uint8_t kOut = 0xff;
  // One page's entry: 32 bytes, so one insert/erase touches one cache line per page.
  // `other`: in a run of 2+ equal keys (contiguous in one list), the head's is the tail
  // and the tail's is the head; stale in middle nodes and singletons, never read there.
  struct alignas(32) Node {
    EvictionKey key;
    std::uint32_t prev = kNone, next = kNone, other = kNone;
    std::uint8_t level = kOut;
  };
  struct List {
    std::uint32_t head = kNone, tail = kNone;
  };
  // Ends of x's run; x must be a run's head (run_tail) or tail (run_head), or alone.
  PageId run_tail(PageId x) const {
    const Node& nx = node_[x];
    return nx.next != kNone && node_[nx.next].key == nx.key ? nx.other : x;
  }
  PageId run_head(PageId x) const {
    const Node& nx = node_[x];
    return nx.prev != kNone && node_[nx.prev].key == nx.key ? nx.other : x;
  }

  List lists_[kLevels];
  std::vector<Node> node_;
  std::uint32_t size_ = 0;
  std::uint32_t hint_ = kNone;  // the last inserted page
};

}  // namespace kvmm
