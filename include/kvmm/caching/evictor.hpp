// LruEvictor: evictable pages (small pages of a group, or large pages) in eviction order:
// retention priority, then last access step ascending, then prefix length descending
// (Jenga §5.1). Intrusive lists over 32-byte nodes (key, links, level); the two end nodes
// of a run of 2+ equal keys point at each other, so a walk skips a run in O(1).
// erase/front O(1), insert O(1) when it follows the previous insert (how the manager
// releases), else O(runs walked past). No heap use after construction.
// LruOrder is the same order over nodes the caller keeps inside its own per-page records
// (the manager's page record holds the node, so a page's state is one cache line).
#pragma once

#include "kvmm/error.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <utility>
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

// One id's entry. `other`: in a run of 2+ equal keys (contiguous in one list), the head's
// is the tail and the tail's is the head; stale in middle nodes and singletons, never read
// there. A listed node's key must not change (erase, change, insert). `tag` names the
// order that lists it, so two orders can share one node array (an id in at most one).
struct alignas(32) LruNode {
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  static constexpr std::uint8_t kOut = 0xff;
  EvictionKey key;
  std::uint32_t prev = kNone, next = kNone, other = kNone;
  std::uint8_t level = kOut;  // list (retention priority), kOut when not listed
  std::uint8_t tag = 0;
};

// The order over nodes found by node_of(id) -> LruNode&, ids in [0, capacity).
template <class NodeOf>
class LruOrder {
 public:
  static constexpr std::uint32_t kLevels = 4;  // retention priorities 0 (evicted first) .. 3

  LruOrder(std::uint32_t capacity, NodeOf node_of, std::uint8_t tag = 0)
      : node_(node_of), capacity_(capacity), tag_(tag) {}

  std::uint32_t size() const { return size_; }
  bool contains(PageId id) const { return id < capacity_ && node_(id).level != kOut && node_(id).tag == tag_; }
  const EvictionKey& key(PageId id) const { return node_(id).key; }

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
    const LruNode& x = node_(id);
    if (x.next != kNone) return x.next;
    for (std::uint32_t lv = x.level + 1u; lv < kLevels; ++lv)
      if (lists_[lv].head != kNone) return lists_[lv].head;
    return kNullPage;
  }

 private:
  static constexpr std::uint32_t kNone = LruNode::kNone;
  static constexpr std::uint8_t kOut = LruNode::kOut;
  struct List {
    std::uint32_t head = kNone, tail = kNone;
  };
  // Ends of x's run; x must be a run's head (run_tail) or tail (run_head), or alone.
  PageId run_tail(PageId x) const {
    const LruNode& nx = node_(x);
    return nx.next != kNone && node_(nx.next).key == nx.key ? nx.other : x;
  }
  PageId run_head(PageId x) const {
    const LruNode& nx = node_(x);
    return nx.prev != kNone && node_(nx.prev).key == nx.key ? nx.other : x;
  }

  NodeOf node_;
  std::uint32_t capacity_;
  std::uint8_t tag_;
  List lists_[kLevels];
  std::uint32_t size_ = 0;
  std::uint32_t hint_ = kNone;  // the last inserted page
};

// Every `after` below is the tail of its run (or alone): a walk steps from a run's tail to
// the next run's head and skips it with run_tail, or from a run's tail back to its head
// with run_head; the last insert is the tail of its run. So k never lands inside a run of
// another key, and a page of key k always joins the tail of k's run.
template <class NodeOf>
void LruOrder<NodeOf>::insert(PageId id, const EvictionKey& k, std::uint32_t level) {
  if (id >= capacity_) fail("page id = {}: evictor capacity is {}", id, capacity_);
  if (node_(id).level != kOut) fail("page id = {}: already listed", id);
  if (level >= kLevels) level = kLevels - 1;
  List& l = lists_[level];
  std::uint32_t after;
  if (hint_ != kNone && node_(hint_).level == level && !evicted_before(k, node_(hint_).key)) {
    // After the previous insert (a request's pages come last page first; other requests
    // of the same step interleave): walk forward over runs that stay before k.
    after = run_tail(hint_);
    while (node_(after).next != kNone && !evicted_before(k, node_(node_(after).next).key))
      after = run_tail(node_(after).next);
  } else {
    // Walk back from the tail over runs that must come after k.
    after = l.tail;
    while (after != kNone && evicted_before(k, node_(after).key)) after = node_(run_head(after)).prev;
  }
  LruNode& x = node_(id);
  x.key = k;
  x.level = static_cast<std::uint8_t>(level);
  x.tag = tag_;
  x.other = kNone;
  if (after != kNone && node_(after).key == k) {  // joins the run of `after` as its new tail
    const PageId head = run_head(after);
    node_(head).other = id;
    x.other = head;
  }
  x.prev = after;
  x.next = after == kNone ? l.head : node_(after).next;
  if (x.next != kNone)
    node_(x.next).prev = id;
  else
    l.tail = id;
  if (after != kNone)
    node_(after).next = id;
  else
    l.head = id;
  ++size_;
  hint_ = id;
}

template <class NodeOf>
void LruOrder<NodeOf>::erase(PageId id) {
  if (!contains(id)) fail("page id = {}: not evictable", id);
  LruNode& x = node_(id);
  const std::uint32_t p = x.prev, n = x.next;
  const bool same_prev = p != kNone && node_(p).key == x.key;
  const bool same_next = n != kNone && node_(n).key == x.key;
  if (same_prev && !same_next) {  // the tail of a run of >= 2: p is the new tail
    const PageId head = x.other;
    node_(head).other = p;
    node_(p).other = head;               // head == p: p is alone now and `other` is never read
  } else if (same_next && !same_prev) {  // the head: n is the new head
    const PageId tail = x.other;
    node_(tail).other = n;
    node_(n).other = tail;
  }
  List& l = lists_[x.level];
  if (p != kNone)
    node_(p).next = n;
  else
    l.head = n;
  if (n != kNone)
    node_(n).prev = p;
  else
    l.tail = p;
  x.prev = x.next = x.other = kNone;
  x.level = kOut;
  --size_;
  if (hint_ == id) hint_ = kNone;
}

// Node lookup into a flat array (LruEvictor's own, or the caller's records).
template <class Record, LruNode Record::*kMember>
struct MemberNodes {
  Record* base = nullptr;
  LruNode& operator()(PageId id) const { return base[id].*kMember; }
};
struct ArrayNodes {
  LruNode* base = nullptr;
  LruNode& operator()(PageId id) const { return base[id]; }
};

// The order with its own node array: one 32-byte node per id.
class LruEvictor : public LruOrder<ArrayNodes> {
 public:
  static constexpr std::uint32_t kLevels = LruOrder<ArrayNodes>::kLevels;
  explicit LruEvictor(std::uint32_t capacity) : LruEvictor(std::vector<LruNode>(capacity)) {}
  LruEvictor(const LruEvictor&) = delete;  // the order points into the node array
  LruEvictor& operator=(const LruEvictor&) = delete;
  LruEvictor(LruEvictor&&) = default;  // the array moves with its buffer

 private:
  explicit LruEvictor(std::vector<LruNode> nodes)
      : LruOrder<ArrayNodes>(static_cast<std::uint32_t>(nodes.size()), ArrayNodes{nodes.data()}),
        nodes_(std::move(nodes)) {}
  std::vector<LruNode> nodes_;
};

}  // namespace kvmm
