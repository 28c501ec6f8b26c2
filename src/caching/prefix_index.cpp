#include "kvmm/caching/prefix_index.hpp"

#include <algorithm>

namespace kvmm {

PrefixIndex::PrefixIndex(std::uint64_t max_entries, std::uint32_t num_groups)
    : max_(max_entries), num_groups_(num_groups) {
  if (num_groups == 0 || num_groups > kMaxGroups) fail("num_groups = {}: must be in [1, {}]", num_groups, kMaxGroups);
  if (max_entries >= (std::uint64_t{1} << 31)) fail("max_entries = {}: must be below 2^31", max_entries);
  std::uint64_t cap = 16;
  while (2 * cap < 3 * max_entries) cap *= 2;  // load <= 2/3
  slots_.resize(cap);
  mask_ = cap - 1;
}

bool PrefixIndex::erase(GroupId g, const BlockHash& h, PageId page) {
  if (g >= num_groups_) return false;
  const std::uint64_t m = mix(g, h);
  const std::uint16_t fp = fingerprint(m);
  std::uint64_t i = m & mask_;
  for (;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.page == kNullPage) return false;
    if (s.page == page && s.group == g && s.fp == fp) break;
  }
  // Backward shift: a later entry of the run moves into the hole when its home slot is at
  // or before the hole (its distance covers the gap).
  std::uint64_t hole = i;
  for (std::uint64_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
    Slot& s = slots_[j];
    if (s.page == kNullPage) break;
    const std::uint64_t gap = (j - hole) & mask_;
    if (s.dist >= gap) {
      s.dist = static_cast<std::uint8_t>(s.dist - gap);
      slots_[hole] = s;
      hole = j;
    }
  }
  slots_[hole] = Slot{};
  --size_;
  return true;
}

void PrefixIndex::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  size_ = 0;
}

}  // namespace kvmm
