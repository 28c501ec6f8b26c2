#include "kvmm/caching/evictor.hpp"

namespace kvmm {

LruEvictor::LruEvictor(std::uint32_t capacity)
    : prev_(capacity, kNone), next_(capacity, kNone), key_(capacity), level_(capacity, kOut) {
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

void LruEvictor::add_run(std::uint32_t level, const EvictionKey& k, PageId id) {
  std::uint64_t i = home(level, k);
  while (runs_[i].level != kNone) i = (i + 1) & run_mask_;
  runs_[i] = Run{k.time, k.prefix_len, level, id, id};
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

void LruEvictor::insert(PageId id, const EvictionKey& k, std::uint32_t level) {
  if (id >= level_.size()) fail("page id = {}: evictor capacity is {}", id, level_.size());
  if (level_[id] != kOut) fail("page id = {}: already evictable", id);
  if (level >= kLevels) level = kLevels - 1;
  List& l = lists_[level];
  std::uint32_t after;
  if (const std::uint64_t run = find_run(level, k); run != ~std::uint64_t{0}) {
    // Same key as pages already here (e.g. another request released in this step).
    after = runs_[run].tail;
    runs_[run].tail = id;
  } else {
    if (hint_ != kNone && level_[hint_] == level && !evicted_before(k, key_[hint_])) {
      // After the previous insert (a request's pages come last page first): walk
      // forward over runs that must stay before k.
      after = runs_[find_run(level, key_[hint_])].tail;
      while (next_[after] != kNone && !evicted_before(k, key_[next_[after]]))
        after = runs_[find_run(level, key_[next_[after]])].tail;
    } else {
      // Walk back from the tail over runs that must come after k.
      after = l.tail;
      while (after != kNone && evicted_before(k, key_[after]))
        after = prev_[runs_[find_run(level, key_[after])].head];
    }
    add_run(level, k, id);
  }
  key_[id] = k;
  level_[id] = static_cast<std::uint8_t>(level);
  prev_[id] = after;
  next_[id] = after == kNone ? l.head : next_[after];
  if (next_[id] != kNone) prev_[next_[id]] = id; else l.tail = id;
  if (after != kNone) next_[after] = id; else l.head = id;
  ++size_;
  hint_ = id;
}

void LruEvictor::erase(PageId id) {
  if (!contains(id)) fail("page id = {}: not evictable", id);
  const std::uint32_t level = level_[id];
  const std::uint64_t slot = find_run(level, key_[id]);
  Run& run = runs_[slot];
  if (run.head == id && run.tail == id) {
    drop_run(slot);
  } else if (run.head == id) {
    run.head = next_[id];
  } else if (run.tail == id) {
    run.tail = prev_[id];
  }
  List& l = lists_[level];
  if (prev_[id] != kNone) next_[prev_[id]] = next_[id]; else l.head = next_[id];
  if (next_[id] != kNone) prev_[next_[id]] = prev_[id]; else l.tail = prev_[id];
  prev_[id] = next_[id] = kNone;
  level_[id] = kOut;
  --size_;
  if (hint_ == id) hint_ = kNone;
}

}  // namespace kvmm
