// KeyTable (private to src/manager/): a direct-mapped table of block hashes, each with a
// value hash, for the miss reasons (miss_reasons.hpp): which keys were evicted, and which
// keyed first page a plain (extra-key-free) first page was cached under. A newer key
// overwrites an older one in its slot: bounded memory (32 bytes a slot), O(1) put and get,
// and a lost entry only makes a reason vaguer (kNotCached), never wrong about a hit.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/types.hpp"

#include <bit>
#include <cstdint>
#include <vector>

namespace kvmm::detail {

class KeyTable {
 public:
  KeyTable() = default;
  explicit KeyTable(std::uint32_t capacity)
      : slots_(capacity == 0 ? 0 : std::bit_ceil(capacity)), mask_(slots_.empty() ? 0 : slots_.size() - 1) {}
  bool enabled() const { return !slots_.empty(); }
  // Group g's key h (groups of one page size share hashes: the group is mixed in).
  static BlockHash of(GroupId g, const BlockHash& h) {
    return {h.lo ^ (std::uint64_t{g} * 0x9e3779b97f4a7c15ULL), h.hi};
  }
  void put(const BlockHash& key, const BlockHash& value = {}) {
    if (enabled()) slots_[key.lo & mask_] = {key, value, true};
  }
  // The value stored under key, or null.
  const BlockHash* get(const BlockHash& key) const {
    if (!enabled()) return nullptr;
    const Slot& s = slots_[key.lo & mask_];
    return s.used && s.key == key ? &s.value : nullptr;
  }
  void clear() {
    for (Slot& s : slots_) s = Slot{};
  }

 private:
  struct Slot {
    BlockHash key, value;
    bool used = false;
  };
  std::vector<Slot> slots_;
  std::uint64_t mask_ = 0;
};

}  // namespace kvmm::detail
