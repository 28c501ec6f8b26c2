#include "kvmm/caching/prefix_index.hpp"

#include "kvmm/error.hpp"

#include <algorithm>

namespace kvmm {

PrefixIndex::PrefixIndex(std::uint64_t max_entries) : max_(max_entries) {
  std::uint64_t cap = 16;
  while (cap < 2 * max_entries) cap *= 2;
  slots_.resize(cap);
  mask_ = cap - 1;
}

bool PrefixIndex::insert(GroupId g, const BlockHash& h, PageId page) {
  if (page == kNullPage) fail("page = {}: the null page cannot be cached", page);
  const std::uint64_t key = mix(g, h);
  std::uint64_t i = key & mask_;
  for (;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.page == kNullPage) break;
    if (s.key == key && s.check == h.lo) return false;
  }
  if (size_ >= max_) fail("prefix index: full with {} entries", size_);
  slots_[i] = Slot{key, h.lo, page};
  ++size_;
  return true;
}

bool PrefixIndex::erase(GroupId g, const BlockHash& h) {
  const std::uint64_t key = mix(g, h);
  std::uint64_t i = key & mask_;
  for (;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.page == kNullPage) return false;
    if (s.key == key && s.check == h.lo) break;
  }
  // Backward-shift: move later entries of the probe run into the hole when allowed.
  std::uint64_t hole = i;
  for (std::uint64_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
    const Slot& s = slots_[j];
    if (s.page == kNullPage) break;
    const std::uint64_t home = s.key & mask_;
    // s may move to hole iff its home is not in (hole, j] cyclically.
    const bool in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!in_range) {
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
