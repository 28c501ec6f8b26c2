// LruEvictor: evictable pages (small pages of a group, or large pages) in eviction order:
// retention priority, then last access step ascending, then prefix length descending
// (Jenga §5.1). Intrusive lists in one flat array of 32-byte nodes (key, links, level:
// what one insert/erase reads together, one cache line per page touched) plus a table of
// runs of 2+ equal keys; erase/front O(1), insert O(1) when it follows the previous insert
// (how the manager releases), else O(runs walked past). No heap use after construction.
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
  struct alignas(32) Node {
    EvictionKey key;
    std::uint32_t prev = kNone, next = kNone;
    std::uint8_t level = kOut;
  };
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
  std::uint64_t add_run(std::uint32_t level, const EvictionKey& k, PageId id);  // its slot
  void drop_run(std::uint64_t slot);
  PageId run_tail(PageId x) const;
  PageId run_head(PageId x) const;

  List lists_[kLevels];
  std::vector<Node> node_;
  std::vector<Run> runs_;
  std::uint64_t run_mask_ = 0;
  std::uint32_t size_ = 0;
  std::uint32_t hint_ = kNone;  // the last inserted page
};

}  // namespace kvmm
