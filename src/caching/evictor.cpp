#include "kvmm/caching/evictor.hpp"

namespace kvmm {

LruEvictor::LruEvictor(std::uint32_t capacity) : node_(capacity) {}

// Every `after` below is the tail of its run (or alone): a walk steps from a run's tail to
// the next run's head and skips it with run_tail, or from a run's tail back to its head
// with run_head; the last insert is the tail of its run. So k never lands inside a run of
// another key, and a page of key k always joins the tail of k's run.
void LruEvictor::insert(PageId id, const EvictionKey& k, std::uint32_t level) {
  if (id >= node_.size()) fail("page id = {}: evictor capacity is {}", id, node_.size());
  if (node_[id].level != kOut) fail("page id = {}: already evictable", id);
  if (level >= kLevels) level = kLevels - 1;
  List& l = lists_[level];
  std::uint32_t after;
  if (hint_ != kNone && node_[hint_].level == level && !evicted_before(k, node_[hint_].key)) {
    // After the previous insert (a request's pages come last page first; other requests
    // of the same step interleave): walk forward over runs that stay before k.
    after = run_tail(hint_);
    while (node_[after].next != kNone && !evicted_before(k, node_[node_[after].next].key))
      after = run_tail(node_[after].next);
  } else {
    // Walk back from the tail over runs that must come after k.
    after = l.tail;
    while (after != kNone && evicted_before(k, node_[after].key)) after = node_[run_head(after)].prev;
  }
  Node& x = node_[id];
  x.key = k;
  x.level = static_cast<std::uint8_t>(level);
  x.other = kNone;
  if (after != kNone && node_[after].key == k) {  // joins the run of `after` as its new tail
    const PageId head = run_head(after);
    node_[head].other = id;
    x.other = head;
  }
  x.prev = after;
  x.next = after == kNone ? l.head : node_[after].next;
  if (x.next != kNone) node_[x.next].prev = id; else l.tail = id;
  if (after != kNone) node_[after].next = id; else l.head = id;
  ++size_;
  hint_ = id;
}

void LruEvictor::erase(PageId id) {
  if (!contains(id)) fail("page id = {}: not evictable", id);
  Node& x = node_[id];
  const std::uint32_t p = x.prev, n = x.next;
  const bool same_prev = p != kNone && node_[p].key == x.key;
  const bool same_next = n != kNone && node_[n].key == x.key;
  if (same_prev && !same_next) {  // the tail of a run of >= 2: p is the new tail
    const PageId head = x.other;
    node_[head].other = p;
    node_[p].other = head;  // head == p: p is alone now and `other` is never read
  } else if (same_next && !same_prev) {  // the head: n is the new head
    const PageId tail = x.other;
    node_[tail].other = n;
    node_[n].other = tail;
  }
  List& l = lists_[x.level];
  if (p != kNone) node_[p].next = n; else l.head = n;
  if (n != kNone) node_[n].prev = p; else l.tail = p;
  x.prev = x.next = x.other = kNone;
  x.level = kOut;
  --size_;
  if (hint_ == id) hint_ = kNone;
}

}  // namespace kvmm
