#include "kvmm/caching/evictor.hpp"

namespace kvmm {

LruEvictor::LruEvictor(std::uint32_t capacity)
    : node_(capacity) {
  std::uint64_t slots = 16;
  while (slots < 2 * std::uint64_t{capacity}) slots *= 2;
  runs_.resize(slots);
  run_mask_ = slots - 1;
}

std::uint64_t LruEvictor::find_run(std::uint32_t level, const EvictionKey& k) const {
  for (std::uint64_t i = home(level, k);; i = (i + 1) & run_mask_) {
    const Run& r = runs_[i];
    if (r.level == kNone) return ~std::uint64_t{0};
    if (r.level == level && r.time == k.time && r.len == k.prefix_len) return i;
  }
}

std::uint64_t LruEvictor::add_run(std::uint32_t level, const EvictionKey& k, PageId id) {
  std::uint64_t i = home(level, k);
  while (runs_[i].level != kNone) i = (i + 1) & run_mask_;
  runs_[i] = Run{k.time, k.prefix_len, level, id, id};
  return i;
}

void LruEvictor::drop_run(std::uint64_t slot) {
  // Backward-shift deletion keeps every probe run free of holes.
  std::uint64_t hole = slot;
  for (std::uint64_t j = (slot + 1) & run_mask_;; j = (j + 1) & run_mask_) {
    const Run& r = runs_[j];
    if (r.level == kNone) break;
    const std::uint64_t h = home(r.level, EvictionKey{r.time, r.len});
    const bool stays = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
    if (!stays) {
      runs_[hole] = r;
      hole = j;
    }
  }
  runs_[hole] = Run{};
}

// Runs of two or more equal keys are in the table; a page with neighbours of other keys
// is its own run and costs no table access (a single request's pages all differ).
PageId LruEvictor::run_tail(PageId x) const {
  const Node& nx = node_[x];
  if (nx.next == kNone || !(node_[nx.next].key == nx.key)) return x;
  return runs_[find_run(nx.level, nx.key)].tail;
}

PageId LruEvictor::run_head(PageId x) const {
  const Node& nx = node_[x];
  if (nx.prev == kNone || !(node_[nx.prev].key == nx.key)) return x;
  return runs_[find_run(nx.level, nx.key)].head;
}

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
  if (after != kNone && node_[after].key == k) {  // joins the run of `after` as its new tail
    const std::uint32_t before = node_[after].prev;
    const bool in_run = before != kNone && node_[before].key == k;
    runs_[in_run ? find_run(level, k) : add_run(level, k, after)].tail = id;
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
  const std::uint32_t level = x.level;
  const std::uint32_t p = x.prev, n = x.next;
  const bool same_prev = p != kNone && node_[p].key == x.key;
  const bool same_next = n != kNone && node_[n].key == x.key;
  if (same_prev != same_next) {  // id ends a run of >= 2: shrink it
    const std::uint64_t slot = find_run(level, x.key);
    Run& run = runs_[slot];
    if (same_prev) {
      if (run.head == p) drop_run(slot); else run.tail = p;
    } else {
      if (run.tail == n) drop_run(slot); else run.head = n;
    }
  }
  List& l = lists_[level];
  if (p != kNone) node_[p].next = n; else l.head = n;
  if (n != kNone) node_[n].prev = p; else l.tail = p;
  x.prev = x.next = kNone;
  x.level = kOut;
  --size_;
  if (hint_ == id) hint_ = kNone;
}

}  // namespace kvmm
