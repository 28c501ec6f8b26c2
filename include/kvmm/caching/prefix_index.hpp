// PrefixIndex: block hash -> cached small page, per layer group. Open addressing with
// linear probing and backward-shift deletion in one flat table sized at construction
// (load <= 1/2), so find/insert/erase are O(1) expected and never touch the heap.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <vector>

namespace kvmm {

class PrefixIndex {
 public:
  // Room for `max_entries` entries at once.
  explicit PrefixIndex(std::uint64_t max_entries);

  // kNullPage when absent.
  PageId find(GroupId g, const BlockHash& h) const {
    const std::uint64_t key = mix(g, h);
    for (std::uint64_t i = key & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.page == kNullPage) return kNullPage;
      if (s.key == key && s.check == h.lo) return s.page;
    }
  }
  // Pulls the slot of (g, h) toward the cache ahead of a find.
  void prefetch(GroupId g, const BlockHash& h) const {
    __builtin_prefetch(&slots_[mix(g, h) & mask_]);
  }
  // false (nothing changed) when (g, h) is already present.
  bool insert(GroupId g, const BlockHash& h, PageId page);
  // false when absent.
  bool erase(GroupId g, const BlockHash& h);
  std::uint64_t size() const { return size_; }
  void clear();

 private:
  struct Slot {
    std::uint64_t key = 0;    // hi mixed with the group
    std::uint64_t check = 0;  // lo
    PageId page = kNullPage;
  };
  static std::uint64_t mix(GroupId g, const BlockHash& h) {
    return h.hi ^ (std::uint64_t{g} * 0x9e3779b97f4a7c15ULL);
  }
  std::vector<Slot> slots_;
  std::uint64_t mask_ = 0;
  std::uint64_t size_ = 0;
  std::uint64_t max_ = 0;
};

}  // namespace kvmm
